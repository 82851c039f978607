"""Every llamaq series that deploy/ reads (the Grafana dashboard's queries, the PrometheusRule's
alerts, the KEDA ScaledObjects' triggers) is one a real api pod's /fleet/metrics exposes, with
the labels the queries group by; read from a running api (no worker: every series is written,
at 0, before any worker exists)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import yaml

from tests.conftest import make_fleet
from tests.metrics_text import series

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"\b(llamaq:[a-z_]+|llamacpp:[a-z_]+)")
BY = re.compile(r"by \(([^)]*)\)")


def queries() -> dict[str, list[str]]:
    """Where each query comes from -> its PromQL texts."""
    found: dict[str, list[str]] = {}
    dashboard = json.loads((ROOT / "deploy/grafana/llamaq.json").read_text())
    found["grafana"] = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    for path in sorted((ROOT / "deploy/kubernetes").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not isinstance(doc, dict):
                continue
            if doc.get("kind") == "PrometheusRule":
                found[str(path)] = [r["expr"] for g in doc["spec"]["groups"]
                                    for r in g["rules"]]
            elif doc.get("kind") == "Kustomization":  # the ScaledObjects' queries, per model
                found[str(path)] = [line.split("value:", 1)[1] for p in doc.get("patches", [])
                                    for line in p.get("patch", "").splitlines()
                                    if "llamaq:" in line and "value:" in line]
            elif doc.get("kind") == "ScaledObject":
                found[str(path)] = [t["metadata"]["query"] for t in doc["spec"]["triggers"]]
    return found


def test_the_queries_find_their_series(redis_url: str, workdir: Path, gemma_path: Path) -> None:
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma-dash")
    tenants = workdir / "dash-tenants.json"  # the per-tenant series come with --tenants
    tenants.write_text(json.dumps({"tenants": [
        {"name": "ops", "keys": ["sk-dash-ops"], "admin": True},
        {"name": "alice", "keys": ["sk-dash-alice"]}]}))
    try:
        api = fleet.add_api("--metrics", "--tenants", str(tenants))
        exposed = series(httpx.get(f"{api}/fleet/metrics", timeout=10,
                                   headers={"Authorization": "Bearer sk-dash-ops"}).text)
    finally:
        fleet.stop()
    labels: dict[str, set[str]] = {}
    for sample in exposed:
        name, _, rest = sample.partition("{")
        labels.setdefault(name, set()).update(
            part.split("=")[0] for part in rest.rstrip("}").split(",") if part)
    assert 'llamaq:queue_depth{model="gemma-dash"}' in exposed
    named = queries()
    assert named["grafana"] and any("PrometheusRule" in p or "prometheusrule" in p
                                    for p in named)
    checked = 0
    for where, texts in named.items():
        for text in texts:
            names = NAME.findall(text)
            for name in names:
                assert name in labels, f"{where}: {name} is not in /fleet/metrics"
                checked += 1
            for group in BY.findall(text):  # `by (model, state)`: labels the series carry
                wanted = {g.strip() for g in group.split(",")}
                assert any(wanted <= labels[n] for n in names), (where, text)
    assert checked > 20
