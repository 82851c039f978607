"""The fairness bench's clients at scale (issue 47, bench/fairness.py) on a real fleet of
simulated workers: Redis, an api pod with --tenants, one worker process of two simulated
workers with four slots each and `--preempt priority`.

The bench at 20 tenants and 50 simulated workers runs hundreds of closed-loop clients; its
HTTP client once had a pool of 128 connections, so the clients past the 128th waited in the
bench itself, first come first served, before their requests reached the fleet: the priority 0
request waited there for one of the priority 10 streams to end (80 s in the figures), and no
preemption or fair share could help it. Here 130 clients of priority 10 (a stream of 4 s each)
fill the eight slots and queue the rest; the one client of priority 0, started last, must see
its first token within half a stream's length (a free slot or a preemption: whichever of the
clients' requests reached the fleet first), not after a stream ends."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path

import httpx
import pytest

from bench.fairness import Seen, drive
from tests.processes import Fleet, wait_until

pytestmark = [pytest.mark.process, pytest.mark.serial]  # it measures a time to first token

TENANTS = [{"name": "a", "keys": ["k-a"]}, {"name": "b", "keys": ["k-b"]},
           {"name": "ops", "keys": ["k-ops"], "admin": True}]
SLOTS = 8
HOGS, HOG_TOKENS, ITL_MS = 130, 40, 100  # more clients than the old pool; 4 s a stream


async def first_urgent_ttft(url: str) -> float:
    """Drive the bench's priority plan until b's first token (then stop every client)."""
    seen = {"k-a": Seen(), "k-b": Seen()}
    plan = [("k-a", HOGS, HOG_TOKENS, 10), ("k-b", 1, 4, 0)]
    driving = asyncio.create_task(drive(url, plan, 60, seen))
    try:
        deadline = time.monotonic() + 60
        while not seen["k-b"].ttft_s and not driving.done() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        driving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await driving
    assert not seen["k-b"].problems, seen["k-b"].problems
    assert seen["k-b"].ttft_s, "b's request got no token in 60 s"
    return seen["k-b"].ttft_s[0]


def test_the_bench_sends_every_clients_request_so_priority_0_preempts(
        redis_url: str, tmp_path: Path) -> None:
    tenants = tmp_path / "tenants.json"
    tenants.write_text(json.dumps({"tenants": TENANTS}))
    fleet = Fleet(redis_url, tmp_path, ["-m", "simulated", "--store-url", str(tmp_path / "store"),
                                        "--cache-dir", str(tmp_path / "cache")],
                  logs=tmp_path / "logs")
    try:
        fleet.add_worker("--simulate", "--sim-workers", "2", "-np", str(SLOTS // 2),
                         "--sim-itl-ms", str(ITL_MS), "--sim-itl-jitter", "0",
                         "--sim-eos-tokens", "100000", "--preempt", "priority")
        url = fleet.add_api("--tenants", str(tenants), "--queue-max", "10000")
        wait_until(lambda: httpx.get(f"{url}/props", headers={"Authorization": "Bearer k-ops"}
                                     ).json().get("total_slots") == SLOTS, 60, what="the workers")
        ttft = asyncio.run(first_urgent_ttft(url))
        stream_s = HOG_TOKENS * ITL_MS / 1000
        assert ttft < stream_s / 2, (
            f"b's first token after {ttft:.1f} s: it waited for one of a's {stream_s:.0f} s "
            "streams to end (in the bench's connection pool or in the queue), not for a "
            "preemption")
    finally:
        fleet.stop()
