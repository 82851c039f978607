"""A real worker process keeps numpy out of its memory until a request needs it (issue 24's
memory figure: numpy is ~19 MiB of resident memory): not at start (model load, context,
control-vector and projector set-up), not for a plain completion; an `n_probs` request loads
it and is answered. Read from the process's own mappings (/proc/PID/maps), so an import
anywhere in the worker, at start or at run time, is seen."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import make_fleet
from tests.processes import Fleet

NUMPY_LIBRARY = "numpy/_core/_multiarray_umath"


@pytest.fixture(scope="module")
def own_worker(redis_url: str, workdir: Path, tiny_model_path: Path) -> Iterator[Fleet]:
    """A worker of its own: no other test's request has reached it."""
    fleet = make_fleet(redis_url, workdir, tiny_model_path, "tiny-memory")
    fleet.add_worker("-c", "1024", "-np", "2", "-t", "1", "-n", "4")
    fleet.wait_healthy(fleet.add_api())
    yield fleet
    fleet.stop()


def numpy_mapped(pid: int) -> bool:
    return NUMPY_LIBRARY in Path(f"/proc/{pid}/maps").read_text()


def test_numpy_is_loaded_by_the_first_request_that_needs_it(own_worker: Fleet) -> None:
    api, worker = own_worker.api_urls[0], own_worker.processes[0]
    assert not numpy_mapped(worker.pid)
    plain = httpx.post(f"{api}/completion", json={"prompt": "Once upon", "n_predict": 4},
                       timeout=60)
    assert plain.status_code == 200, plain.text
    assert not numpy_mapped(worker.pid)
    probs = httpx.post(f"{api}/completion", json={"prompt": "Once upon", "n_predict": 2,
                                                  "n_probs": 3}, timeout=60)
    assert probs.status_code == 200, probs.text
    first = probs.json()["completion_probabilities"][0]
    assert len(first["top_logprobs"]) == 3
    assert numpy_mapped(worker.pid)
