"""The systems the streaming benchmark compares: llama-server and `llamaq up` (and llamaq
variants with an environment of their own), as commands and environments."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
SYSTEMS = ("llama-server", "llamaq")
DEFAULT_LLAMA_SERVER = Path.home() / ".cache" / "llamaq-bench" / "bin" / "llama-server"


def command(system: str, binary: Path, model: Path, port: int, shared: list[str]) -> list[str]:
    """llama-server, or `llamaq up` (for "llamaq" and every llamaq variant "llamaq:NAME") run
    by this interpreter (the project's .venv here, the image's python3 on the GPU machine)."""
    if system == "llama-server":
        return [str(binary), "-m", str(model), *shared, "--host", "127.0.0.1",
                "--port", str(port)]
    return [sys.executable, "-m", "llamaq", "up", "-m", str(model), *shared,
            "--host", "127.0.0.1", "--port", str(port)]


def shared_flags(args: argparse.Namespace) -> list[str]:
    """The flags both systems get: slots, context, threads, batch sizes, and --server-flags
    (e.g. "-ngl 99" on a GPU)."""
    return ["-np", str(args.parallel), "-c", str(args.ctx_size), "-t", str(args.threads),
            "-b", str(args.batch_size), "-ub", str(args.ubatch_size),
            *shlex.split(args.server_flags)]


def system_env(system: str, args: argparse.Namespace) -> dict[str, str]:
    """--llama-server-env KEY=VALUE: for llama-server only (e.g. OMP_WAIT_POLICY=PASSIVE, to
    compare serving with the same ggml thread behaviour); --variant NAME:KEY=VALUE,...: the
    environment of the llamaq system "llamaq:NAME"."""
    if system == "llama-server":
        return dict(item.split("=", 1) for item in args.llama_server_env)
    return variant_envs(args).get(system, {})


def variant_envs(args: argparse.Namespace) -> dict[str, dict[str, str]]:
    """--variant NAME:KEY=VALUE,KEY=VALUE (repeatable) as {"llamaq:NAME": {KEY: VALUE}}."""
    variants = {}
    for item in args.variant:
        name, _, pairs = item.partition(":")
        variants[f"llamaq:{name}"] = dict(p.split("=", 1) for p in pairs.split(",") if p)
    return variants


def systems_of(args: argparse.Namespace) -> tuple[str, ...]:
    return (*SYSTEMS, *variant_envs(args))
