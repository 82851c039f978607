"""A worker process imports only what serving needs (issue 24's memory figure): llama-cpp-python
without its high-level half (worker/runtime/llama_package.py), and no module a plain worker never
uses (numpy, jinja2, the HTTP and cloud clients: each is imported where it is used). Each case runs
in a python of its own, as a worker starts (llamaq/processes.py prepare_worker_process)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.process  # runs python itself (tests/lanes.py)

NOT_IMPORTED = ("numpy", "jinja2", "diskcache", "sqlite3", "multiprocessing", "llama_cpp.llama",
                "llama_cpp.llama_chat_format", "httpx", "boto3", "huggingface_hub", "gguf",
                "sanic", "api.app")
"""What a worker with a local store, no -hf, no control vectors and no decision family never
needs (about 30 MiB of resident memory together)."""

PRELUDE = """
import sys
from llamaq.processes import prepare_worker_process
prepare_worker_process()
"""

WORKER_IMPORTS = PRELUDE + """
import worker.process.serve, worker.process.host, worker.jobs.dispatch
from worker.runtime.settings import WorkerSettings
WorkerSettings.from_args(["-m", "model.gguf"], environ={})
print(",".join(m for m in NOT_IMPORTED if m in sys.modules))
""".replace("NOT_IMPORTED", repr(NOT_IMPORTED))

PACKAGE_USES = PRELUDE + """
import llama_cpp as lc
from llama_cpp import mtmd_cpp
from llama_cpp.llama_grammar import json_schema_to_gbnf
import llama_cpp.llama_cpp as bindings
assert lc.llama_decode is bindings.llama_decode and lc.LLAMA_POOLING_TYPE_RANK == 4
assert mtmd_cpp.mtmd_default_marker is not None and json_schema_to_gbnf('{"type": "integer"}')
assert "llama_cpp.llama" not in sys.modules and "numpy" not in sys.modules
assert not hasattr(lc, "__wrapped__")  # a dunder the package never had: no completion
assert "llama_cpp.llama" not in sys.modules
assert lc.Llama.__module__ == "llama_cpp.llama"  # the high-level half, on first use
assert lc.__version__ and "numpy" in sys.modules
assert not hasattr(lc, "no_such_name")
print("ok")
"""


def run(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_a_worker_imports_none_of_what_it_does_not_use() -> None:
    assert run(WORKER_IMPORTS) == ""


def test_the_package_without_its_high_level_half_still_serves_every_use() -> None:
    assert run(PACKAGE_USES) == "ok"
