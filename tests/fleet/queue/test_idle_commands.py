"""What an idle worker costs Redis (issue 44: ≥ 1,000 workers on one Redis, their idle cost
under 5 % of a Redis core). A worker that waits for jobs is woken by the enqueue
(scheduler/wake.py), so its look at each of its queues every --poll-delay (4 lanes, 5
commands a look: ~20 commands a second) was only the safety net of a lost wake-up; it now
looks every --idle-poll-delay while its listener hears its wake channels; its unchanged
metrics, slots and prefix summary go every 4 s instead of with every heartbeat (2 s), and
its listener pings every 2 s, not every second. What is left: the heartbeat, those reports
and the ping. A simulated worker
process on its own Redis (MONITOR sees only it); a queued job still starts at once."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
import redis

from tests.processes import Fleet, start_redis, wait_until

pytestmark = pytest.mark.process

WINDOW_S = 12.0
PER_SECOND_MAX = 3.5
"""The heartbeat (the registry entry's SET and the stamp script's EVAL, TIME and ZADD every
2 s), the unchanged metrics, slots and prefix summary every 4 s (3 SETs) and the listener's
PING every 2 s: 3.25; before: ~24 (polls), then ~4.9 (the 3 SETs with every heartbeat), then
~4.25 (a PING a second)."""


def count_commands(client: redis.Redis, seconds: float) -> tuple[Counter[str], int]:
    """Every command Redis runs for `seconds` (a script's inner commands too), by name, and
    the SETs of a worker's metrics among them."""
    seen: Counter[str] = Counter()
    metrics_sets = 0
    monitor = client.monitor().__enter__()

    def read() -> None:
        nonlocal metrics_sets
        while True:
            try:
                command = monitor.next_command()["command"]
            except Exception:  # the connection closed at the end
                return
            words = command.split(" ", 2)
            seen[words[0].upper()] += 1
            if words[0].upper() == "SET" and words[1].endswith(":metrics"):
                metrics_sets += 1

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    time.sleep(seconds)
    monitor.connection.disconnect()
    reader.join(timeout=5)
    return seen, metrics_sets


def test_an_idle_worker_costs_a_few_commands_a_second(tmp_path: Path) -> None:
    process, url = start_redis(tmp_path / "redis")
    fleet = Fleet(url, tmp_path, ["-m", "simulated", "--store-url", str(tmp_path / "store"),
                                  "--cache-dir", str(tmp_path / "cache")],
                  logs=tmp_path / "logs")
    client = redis.Redis.from_url(url)
    try:
        fleet.add_worker("--simulate", "-np", "4", "--sim-itl-ms", "10")
        api = fleet.add_api()
        wait_until(lambda: httpx.get(f"{api}/props").json().get("total_slots") == 4, 60,
                   what="a simulated worker")
        # a job first: the worker's lanes took part, then wait again
        answer = httpx.post(f"{api}/completion", json={"prompt": "hello", "n_predict": 4},
                            timeout=60)
        assert answer.status_code == 200, answer.text
        fleet.stop_process(fleet.processes[-1])  # the api: only the worker talks to Redis
        time.sleep(1.5)  # its last job's reports went out
        seen, metrics_sets = count_commands(client, WINDOW_S)
        total = sum(seen.values())
        assert total <= PER_SECOND_MAX * WINDOW_S, seen
        assert seen["ZADD"] >= 3, seen  # heartbeating
        # the listener's ping every 2 s (1 s before), and it is alive
        assert WINDOW_S / 2 - 2 <= seen["PING"] <= WINDOW_S / 2 + 1, seen
        # unchanged metrics: every REPORT_REFRESH_S (4 s), not with every heartbeat (2 s)
        assert 1 <= metrics_sets <= WINDOW_S / 4 + 1, (metrics_sets, seen)
    finally:
        client.close()
        fleet.stop()
        process.terminate()
        process.wait()
