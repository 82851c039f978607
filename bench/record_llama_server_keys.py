"""Record the shapes of llama-server's answers (key paths and value types) that llamaq's
must have: tests/data/llama_server_keys.json, read by
tests/fleet/native/test_llama_server_keys.py. Run again when the pinned llama.cpp changes:

    .venv/bin/python bench/record_llama_server_keys.py [--llama-server PATH] [--model GGUF]

llama-server as build_llama_server.sh builds it from the same llama.cpp; Gemma 3 270M.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.processes import free_port, running, server_env, wait_healthy  # noqa: E402
from storage import default_model_path  # noqa: E402
from tests.key_probe import FLAGS, probe  # noqa: E402

DEFAULT_LLAMA_SERVER = Path.home() / ".cache" / "llamaq-bench" / "bin" / "llama-server"
OUT = REPO / "tests" / "data" / "llama_server_keys.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-server", type=Path, default=DEFAULT_LLAMA_SERVER)
    parser.add_argument("--model", type=Path, default=None)
    args = parser.parse_args()
    model = args.model or default_model_path(REPO / ".llamaq" / "cache")
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="llamaq-keys-")) / "llama-server.log"
    with running([str(args.llama_server), "-m", str(model), "--port", str(port), *FLAGS],
                 log, server_env()) as process:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, process=process)
        found = probe(url)
    OUT.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT} ({sum(len(v) for v in found.values())} key paths)")


if __name__ == "__main__":
    main()
