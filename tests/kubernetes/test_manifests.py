"""deploy/kubernetes renders and validates, overlay by overlay, with no cluster: every object
against Kubernetes 1.32's schemas (kubernetes-validate, strict), KEDA's and the Prometheus
operator's against their CRD schemas (tests/kubernetes/README.md), and what the fleet needs of
them: a worker Deployment per model with its ScaledObject and PDB, readiness, drains."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

pytestmark = pytest.mark.process  # kubectl

ROOT = Path(__file__).resolve().parents[2]
KUSTOMIZE = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("cpu", "gpu", "embedded")
KUBERNETES_VERSION = "1.32.0"
SCHEMAS = Path(__file__).resolve().parent / "crd_schemas"
CRDS = {("keda.sh/v1alpha1", "ScaledObject"): "scaledobject-keda.sh-v1alpha1.json",
        ("monitoring.coreos.com/v1", "ServiceMonitor"):
            "servicemonitor-monitoring.coreos.com-v1.json",
        ("monitoring.coreos.com/v1", "PrometheusRule"):
            "prometheusrule-monitoring.coreos.com-v1.json"}


def render(overlay: str) -> list[dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.fail("kubectl is missing (scripts/install test)")
    out = subprocess.run([kubectl, "kustomize", str(KUSTOMIZE / "overlays" / overlay)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


@pytest.fixture(scope="module", params=OVERLAYS)
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render(request.param)


def strict(schema: Any) -> Any:
    """`schema` with no field allowed that it does not name (the API server prunes them)."""
    if isinstance(schema, dict):
        out = {k: strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def crd_validator(api_version: str, kind: str) -> jsonschema.Draft7Validator:
    schema = json.loads((SCHEMAS / CRDS[(api_version, kind)]).read_text())
    return jsonschema.Draft7Validator(strict(copy.deepcopy(schema)))


def test_every_object_validates(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    overlay, objects = rendered
    kinds = set()
    for obj in objects:
        key = (obj["apiVersion"], obj["kind"])
        kinds.add(obj["kind"])
        where = f"{overlay}: {obj['kind']}/{obj['metadata']['name']}"
        if key in CRDS:
            errors = [f"{list(e.absolute_path)}: {e.message}"
                      for e in crd_validator(*key).iter_errors(obj)]
            assert not errors, (where, errors)
        else:
            try:
                kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
            except kubernetes_validate.ValidationError as error:
                pytest.fail(f"{where}: {error.message} at {list(error.path)}")
    assert {"Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget",
            "ConfigMap", "NetworkPolicy", "ScaledObject", "ServiceMonitor",
            "PrometheusRule"} <= kinds, kinds


def test_a_bad_object_is_refused() -> None:
    """The checks can fail: a misspelt field, a ScaledObject without its target."""
    deployment = next(o for o in render("cpu") if o["kind"] == "Deployment")
    deployment["spec"]["replica"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)
    scaled = {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
              "metadata": {"name": "x"}, "spec": {"triggers": [], "minReplicas": 0}}
    assert list(crd_validator("keda.sh/v1alpha1", "ScaledObject").iter_errors(scaled))


def of(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def test_the_fleet_shape(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    overlay, objects = rendered
    deployments = of(objects, "Deployment")
    api = deployments["llamaq-api"]
    assert api["spec"]["replicas"] >= 2
    api_pod = api["spec"]["template"]["spec"]
    (api_box,) = api_pod["containers"]
    assert api_box["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert of(objects, "HorizontalPodAutoscaler")["llamaq-api"]["spec"]["metrics"][0][
        "resource"]["name"] == "cpu"
    assert "llamaq-api" in of(objects, "PodDisruptionBudget")
    workers = {n: d for n, d in deployments.items() if n.startswith("llamaq-worker-")}
    assert workers, deployments.keys()
    scaled = of(objects, "ScaledObject")
    pdbs = of(objects, "PodDisruptionBudget")
    config = next(c for n, c in of(objects, "ConfigMap").items()
                  if n.startswith("llamaq-env"))["data"]
    drain_s = float(config["LLAMAQ_DRAIN_TIMEOUT"])
    models_ini = next(c for n, c in of(objects, "ConfigMap").items()
                      if n.startswith("llamaq-models"))["data"]["models.ini"]
    for name, worker in workers.items():
        model = worker["metadata"]["labels"]["llamaq.io/model"]
        pod = worker["spec"]["template"]["spec"]
        (box,) = pod["containers"]
        env = {e["name"]: e.get("value") for e in box["env"]}
        assert env["LLAMA_ARG_ALIAS"] == model  # the name the worker registers
        assert f"[{model}]" in models_ini  # and the api routes
        assert pod["terminationGracePeriodSeconds"] > drain_s
        assert "kill -TERM 1" in " ".join(box["lifecycle"]["preStop"]["exec"]["command"])
        assert box["readinessProbe"]["exec"]["command"][:2] == ["llamaq", "health"]
        assert worker["spec"]["selector"]["matchLabels"]["llamaq.io/model"] == model
        assert pdbs[name]["spec"]["selector"]["matchLabels"]["llamaq.io/model"] == model
        so = scaled[name]["spec"]
        assert so["scaleTargetRef"]["name"] == name
        assert so["minReplicaCount"] == 0 and "cooldownPeriod" in so
        (trigger,) = so["triggers"]
        assert trigger["type"] == "prometheus"
        for name in ("queue_depth", "cold_start_waiting", "requests_running"):
            assert f'llamaq:{name}{{model="{model}"}}' in trigger["metadata"]["query"]
        assert "activationThreshold" in trigger["metadata"]
        gpu = box["resources"]["limits"].get("nvidia.com/gpu")
        assert (gpu == "1") == (overlay == "gpu")
        if overlay == "gpu":
            assert pod["nodeSelector"] and pod["tolerations"]
            assert "cuda" in box["image"]
    for job in of(objects, "Job").values():  # one image name for llamaq's images
        for box in job["spec"]["template"]["spec"]["containers"]:
            assert box["image"] == api_box["image"], box["image"]
    for deployment in deployments.values():
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        for box in pod["containers"]:
            assert box["resources"]["requests"] and box["resources"]["limits"]
            assert box["securityContext"]["allowPrivilegeEscalation"] is False
    policies = of(objects, "NetworkPolicy")
    assert policies["llamaq-default-deny"]["spec"]["podSelector"] == {}
    assert (overlay == "embedded") == ({"llamaq-redis", "llamaq-minio"} <= deployments.keys())
