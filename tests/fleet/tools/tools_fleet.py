"""Api pods with server tools for the tools tests: no worker (the tools run on the api pod),
router mode (no -m), as llama.cpp's own tests start llama-server for them."""

from __future__ import annotations

from pathlib import Path

from tests.processes import Fleet


def tools_fleet(redis_url: str, workdir: Path, name: str) -> Fleet:
    common = ["--store-url", str(workdir / "store"), "--cache-dir", str(workdir / "cache")]
    return Fleet(redis_url, workdir, common, logs=workdir / f"logs-{name}")


def api_log(fleet: Fleet) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted(fleet.logs.glob("api-*.log")))
