"""The compose files' worker builds, read statically (no GPU here to build one on): compose.yaml
builds the CUDA worker and puts every layer on the GPU; compose.cpu.yaml builds the CPU one;
scripts/compose-test runs the CPU variant."""

from __future__ import annotations

import re
from typing import Any

import yaml

from tests.paths import ROOT

REPO = ROOT
DEFAULT = re.compile(r"\$\{[A-Z_]+:-(.*)\}$")


class ComposeLoader(yaml.SafeLoader):
    """Compose's merge tags (`!reset`, `!override`) read as plain values."""


ComposeLoader.add_constructor("!reset", lambda loader, node: None)
ComposeLoader.add_constructor(
    "!override", lambda loader, node: loader.construct_object(node, deep=True))


def worker(file: str) -> dict[str, Any]:
    doc = yaml.load((REPO / file).read_text(), Loader=ComposeLoader)
    return doc["services"]["worker"]


def default(value: str) -> str:
    """The value compose uses when the variable is unset: `${VAR:-default}` → default."""
    match = DEFAULT.match(value)
    return match.group(1) if match else value


def test_the_gpu_compose_builds_a_cuda_worker_with_every_layer_on_the_gpu() -> None:
    gpu = worker("compose.yaml")
    args = {k: default(str(v)) for k, v in gpu["build"]["args"].items()}
    assert args["BUILD_BASE"].startswith("nvidia/cuda:") and "-devel-" in args["BUILD_BASE"]
    assert args["RUNTIME_BASE"].startswith("nvidia/cuda:") and "-runtime-" in args["RUNTIME_BASE"]
    assert args["BUILD_BASE"].split(":")[1].split("-")[0] == \
        args["RUNTIME_BASE"].split(":")[1].split("-")[0]  # one CUDA version
    assert "-DGGML_CUDA=on" in args["CMAKE_ARGS"].split()
    assert "-DCMAKE_CUDA_ARCHITECTURES=" in args["CMAKE_ARGS"]
    assert "AVX" not in args["CMAKE_ARGS"]
    assert default(gpu["environment"]["LLAMA_ARG_N_GPU_LAYERS"]) == "all"
    devices = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["driver"] == "nvidia" and "gpu" in devices[0]["capabilities"]


def test_the_cpu_compose_builds_a_cpu_worker_without_the_gpu() -> None:
    cpu = worker("compose.cpu.yaml")
    args = {k: default(str(v)) for k, v in cpu["build"]["args"].items()}
    assert "cuda" not in args["BUILD_BASE"] + args["RUNTIME_BASE"]
    assert "-DGGML_CUDA=on" not in args["CMAKE_ARGS"]
    assert "-DGGML_NATIVE=OFF" in args["CMAKE_ARGS"].split()  # portable: no SIGILL elsewhere
    assert default(cpu["environment"]["LLAMA_ARG_N_GPU_LAYERS"]) == "0"
    assert cpu["deploy"] is None  # !reset: no GPU reservation


def test_compose_test_runs_the_cpu_variant() -> None:
    script = (REPO / "scripts" / "compose-test").read_text()
    assert "-f compose.yaml -f compose.cpu.yaml" in script
