"""The build of llama.cpp a worker runs, in llama-server's form (`/props` `build_info`:
`b<build number>-<commit>`, from llama.cpp's build-info). The bindings do not expose it, so it
is recorded here for each llama-cpp-python version llamaq pins: what `llama-server --version`
says when built from that version's vendored llama.cpp (`bench/build_llama_server.sh`)."""

from __future__ import annotations

import importlib.metadata

BUILDS = {"0.3.36": "b1-0c1e570"}
"""llama-cpp-python version → its vendored llama.cpp's build (0.3.36: build 1, commit
0c1e570)."""


def llama_build_info() -> str:
    """This machine's llama.cpp build, or "unknown" (llama-cpp-python absent or not pinned)."""
    try:
        version = importlib.metadata.version("llama_cpp_python")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
    return BUILDS.get(version, f"unknown (llama-cpp-python {version})")


def llamaq_version() -> str:
    try:
        return importlib.metadata.version("llamaq")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
