"""scripts/kube-test: the rendered `embedded` overlay (stdin) as `podman kube play` (4.3) can
play it (stdout): Deployments, ConfigMaps and PersistentVolumeClaims as they are; Secrets as
ConfigMaps (podman 4.3 reads no Secret object: the references follow); what has no podman
counterpart left out (Services, HPA, PDBs, NetworkPolicies, KEDA and Prometheus-operator
objects, the Namespace, the bucket Job: the script runs its command in the api pod). Without
Services, pods reach each other by pod name (`<deployment>-pod-0`, podman's DNS), so the
Services' names in the settings are rewritten to those."""

from __future__ import annotations

import base64
import sys
from typing import Any

import yaml

PLAYED = ("Deployment", "ConfigMap", "PersistentVolumeClaim", "Secret")
SERVICES = ("llamaq-redis", "llamaq-minio")


def pod_host(text: str) -> str:
    for service in SERVICES:
        text = text.replace(f"@{service}:", f"@{service}-pod-0:")
        text = text.replace(f"//{service}:", f"//{service}-pod-0:")
    return text


def playable(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for obj in objects:
        kind = obj["kind"]
        if kind not in PLAYED:
            continue
        if kind == "Secret":
            data = {k: base64.b64decode(v).decode() for k, v in obj.get("data", {}).items()}
            data |= obj.get("stringData", {})
            obj = {"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": obj["metadata"]["name"]}, "data": data}
        if kind in ("ConfigMap", "Secret"):
            obj["data"] = {k: pod_host(v) for k, v in obj["data"].items()}
        if kind == "Deployment":
            obj["spec"]["replicas"] = 1
            for box in obj["spec"]["template"]["spec"]["containers"]:
                for source in box.get("envFrom", []):
                    if "secretRef" in source:
                        source["configMapRef"] = source.pop("secretRef")
                for var in box.get("env", []):
                    ref = var.get("valueFrom", {})
                    if "secretKeyRef" in ref:
                        ref["configMapKeyRef"] = ref.pop("secretKeyRef")
        obj["metadata"].pop("namespace", None)
        out.append(obj)
    return out


def main() -> None:
    objects = [doc for doc in yaml.safe_load_all(sys.stdin) if doc]
    yaml.safe_dump_all(playable(objects), sys.stdout, sort_keys=False)


if __name__ == "__main__":
    main()
