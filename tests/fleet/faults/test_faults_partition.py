"""A network partition between a worker and Redis (its link cut: the connections open then are
dead for good, never closed) costs the worker the partition and no more: every Redis client of
the worker has a reply timeout and its listener polls, so once the link heals the worker
reconnects and serves again. Real Redis, a real worker on Gemma 3 270M behind tests/proxy.py's
CuttableLink, a real api pod on its own link (which stays up), httpx."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.conftest import make_fleet
from tests.processes import Fleet, start_redis
from tests.proxy import CuttableLink

pytestmark = pytest.mark.process

CUT_S = 8.0
"""Longer than a reply timeout (5 s): the worker's calls fail meanwhile, and so do the
connections it opens during the cut."""
SERVED_WITHIN_S = 15.0
"""After the link heals: a call that hangs is cut by its timeout (5 s), then the worker
reconnects, polls and is heard by the api again (its heartbeat)."""


@pytest.fixture
def cut_fleet(tmp_path: Path, gemma_path: Path) -> Iterator[tuple[Fleet, CuttableLink]]:
    process, url = start_redis(tmp_path / "redis")
    port = urlsplit(url).port
    assert port is not None
    with CuttableLink(("127.0.0.1", port)).running() as link:
        fleet = make_fleet(url, tmp_path, gemma_path, "gemma-cut")
        fleet.add_worker("-c", "2048", "-np", "2", "-t", "2",
                         "--redis-url", f"redis://127.0.0.1:{link.port}/0")
        fleet.wait_healthy(fleet.add_api())
        try:
            yield fleet, link
        finally:
            link.heal()
            fleet.stop()
            process.send_signal(signal.SIGKILL)
            process.wait()


def test_a_worker_cut_from_redis_serves_again_once_the_link_heals(
        cut_fleet: tuple[Fleet, CuttableLink]) -> None:
    fleet, link = cut_fleet
    api = fleet.api_urls[0]
    body = {"prompt": "Hello", "n_predict": 2}
    assert httpx.post(f"{api}/completion", json=body, timeout=60).status_code == 200
    link.cut()
    time.sleep(CUT_S)
    link.heal()
    healed_at = time.monotonic()
    while True:
        try:
            answer = httpx.post(f"{api}/completion", json=body, timeout=5)
            if answer.status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() - healed_at < SERVED_WITHIN_S, \
            f"no service {SERVED_WITHIN_S:g} s after the link healed"
        time.sleep(0.2)
    print(f"served {time.monotonic() - healed_at:.1f} s after the link healed")
    assert fleet.processes[0].poll() is None, "the worker died"
