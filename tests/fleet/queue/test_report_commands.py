"""What a worker's reports cost Redis per job (issue 44): the metrics, slots and prefix summary
go ahead of the events that start and end a job (worker/wires/publisher.py's before_results),
and the slot-change loop (worker/process/loops.py Reporter) does not write them again when
such a flush wrote them after the change. A simulated worker, its own Redis (MONITOR sees
only this fleet), a real api and real HTTP requests."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest
import redis

from tests.processes import Fleet, start_redis, wait_until

pytestmark = pytest.mark.process

REQUESTS = 8


def test_a_job_writes_its_workers_metrics_twice_not_four_times(tmp_path: Path) -> None:
    process, url = start_redis(tmp_path / "redis")
    fleet = Fleet(url, tmp_path, ["-m", "simulated", "--store-url", str(tmp_path / "store"),
                                  "--cache-dir", str(tmp_path / "cache")],
                  logs=tmp_path / "logs")
    client = redis.Redis.from_url(url)
    written: list[str] = []
    try:
        fleet.add_worker("--simulate", "-np", "2", "--sim-itl-ms", "10")
        api = fleet.add_api()
        wait_until(lambda: httpx.get(f"{api}/props").json().get("total_slots") == 2, 60,
                   what="a simulated worker")
        monitor = client.monitor().__enter__()

        def read() -> None:
            while True:
                try:
                    command = monitor.next_command()["command"]
                except Exception:  # the connection closed at the end
                    return
                if command.startswith("SET ") and command.split()[1].endswith(":metrics"):
                    written.append(command.split()[1])

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        started = time.monotonic()
        for i in range(REQUESTS):
            answer = httpx.post(f"{api}/completion", json={
                "prompt": f"request {i}", "n_predict": 20, "ignore_eos": True}, timeout=60)
            assert answer.status_code == 200, answer.text
            time.sleep(0.3)  # the slot-change loop's report (0.1 s after a change) is due
        took = time.monotonic() - started
        monitor.connection.disconnect()
        reader.join(timeout=5)
        # a job's start and end flushes write them (2 a job); the heartbeats every 2 s; before:
        # the slot-change loop wrote them again after each start and end (4 a job)
        assert len(written) <= 2 * REQUESTS + took / 2 + 2, (len(written), took)
    finally:
        client.close()
        fleet.stop()
        process.terminate()
        process.wait()
