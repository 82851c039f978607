"""What an idle worker costs Redis (issue 44: ≥ 1,000 workers on one Redis, their idle cost
under 5 % of a Redis core). A worker that waits for jobs is woken by the enqueue
(scheduler/wake.py), so its look at each of its queues every --poll-delay (4 lanes, 5
commands a look: ~20 commands a second) was only the safety net of a lost wake-up; it now
looks every --idle-poll-delay while its listener hears its wake channels. What is left: the
heartbeat and reports every 2 s and the listener's ping every second. A simulated worker
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

WINDOW_S = 6.0
PER_SECOND_MAX = 5.0
"""The heartbeat's pipeline (metrics, slots, prefixes, registry entry, the model's worker
set: 5 commands every 2 s) and the listener's PING a second: 3.5; before: ~24."""


def count_commands(client: redis.Redis, seconds: float) -> Counter[str]:
    """Every command Redis runs for `seconds` (a script's inner commands too), by name."""
    seen: Counter[str] = Counter()
    monitor = client.monitor().__enter__()

    def read() -> None:
        while True:
            try:
                command = monitor.next_command()["command"]
            except Exception:  # the connection closed at the end
                return
            seen[command.split(" ", 1)[0].upper()] += 1

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    time.sleep(seconds)
    monitor.connection.disconnect()
    reader.join(timeout=5)
    return seen


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
        seen = count_commands(client, WINDOW_S)
        total = sum(seen.values())
        assert total <= PER_SECOND_MAX * WINDOW_S, seen
        assert seen["PING"] >= WINDOW_S / 2 and seen["SET"] >= 4, seen  # alive, heartbeating
    finally:
        client.close()
        fleet.stop()
        process.terminate()
        process.wait()
