"""CPU placement on a real model load (worker/runtime/cpu_pools.py): with `-t 2 -C 2 --cpu-strict
1` the context computes in ggml thread pools whose threads run on CPU 1 only, as llama-server's
common_threadpools places them; without a placement flag no thread is pinned. Each load runs in
a child process (a pinned compute thread stays pinned, as in llama-server)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

CHILD = """
import json, sys
from pathlib import Path
from worker.process.startup import load_model
from worker.runtime.settings import WorkerSettings
path = Path(sys.argv[1])
settings = WorkerSettings.from_args(["-m", str(path), "-c", "256", "-np", "1", "-fit", "off",
                                     *sys.argv[2:]], environ={})
model = load_model(settings, path)
model.warmup()
allowed = []
for task in Path("/proc/self/task").iterdir():
    try:
        status = (task / "status").read_text()
    except FileNotFoundError:  # a short-lived thread (not a compute one) ended meanwhile
        continue
    for line in status.splitlines():
        if line.startswith("Cpus_allowed_list:"):
            allowed.append(line.split()[1])
print(json.dumps({"allowed": allowed, "pools": model.pools is not None}))
model.close()
"""


def threads_allowed(model: Path, *argv: str) -> tuple[list[str], bool]:
    done = subprocess.run([sys.executable, "-c", CHILD, str(model), *argv],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path.cwd())})
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    return answer["allowed"], answer["pools"]


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two CPUs")
def test_the_mask_places_the_compute_threads(tiny_model_path: Path) -> None:
    allowed, pools = threads_allowed(tiny_model_path, "-t", "2")
    assert not pools and "1" not in allowed
    allowed, pools = threads_allowed(tiny_model_path, "-t", "2", "-C", "2", "--cpu-strict", "1")
    assert pools and "1" in allowed, allowed
    allowed, pools = threads_allowed(tiny_model_path, "-t", "2", "-Cr", "0-0")
    assert pools and "0" in allowed, allowed
