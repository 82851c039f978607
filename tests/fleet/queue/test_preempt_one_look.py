"""One preemption look per queued urgent job, however many workers are full (issue 47:
scheduler/preempt_call.py, worker/process/preempt_call.py). Before, every full worker heard the
slot queue's shared wake and ran a look (CLAIM_URGENT) of its own; the first claimed the job and
the others spent their commands finding nothing: looks that grew with the workers.

Real Redis (the test's own, whose MONITOR sees every script the fleet runs), an api pod, one
process of WORKERS simulated workers of one slot each (`--preempt priority`; the safety poll a
minute away, so only wakes and calls make a worker look). Priority 10 streams fill every slot;
one priority 0 request is answered at once (a preemption), and while the fleet handles it
(the enqueue, the look, the victim's hand back, its requeue) the workers run CLAIM_URGENT once."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from scheduler.contract import keys, preempt_keys
from scheduler.queue_order import CLAIM_URGENT
from tests.fleet.queue.completion_stream import read_completion
from tests.processes import Fleet, start_redis, wait_until

pytestmark = pytest.mark.process

WORKERS, HOG_TOKENS, ITL_MS = 4, 200, 50  # each priority 10 stream takes 10 s undisturbed


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[str]:
    process, url = start_redis(tmp_path / "redis")
    yield url
    process.kill()
    process.wait()


class Monitor:
    """Every command Redis runs, from a MONITOR connection, on a thread."""

    def __init__(self, url: str) -> None:
        self.commands: list[str] = []
        self._stop = threading.Event()
        self._client = redis.Redis.from_url(url)
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "MONITOR did not start"

    def _read(self) -> None:
        with self._client.monitor() as monitor:
            self._ready.set()
            while not self._stop.is_set():
                self.commands.append(monitor.next_command()["command"])

    def stop(self) -> list[str]:
        self._stop.set()
        self._client.ping()  # a last command, so the reader sees the stop
        self._thread.join(10)
        return list(self.commands)


def test_an_urgent_job_makes_one_full_worker_look(own_redis: str, tmp_path: Path) -> None:
    fleet = Fleet(own_redis, tmp_path, ["-m", "simulated", "--store-url", str(tmp_path / "store"),
                                        "--cache-dir", str(tmp_path / "cache")],
                  logs=tmp_path / "logs")
    client: Any = redis.Redis.from_url(own_redis)
    try:
        fleet.add_worker("--simulate", "--sim-workers", str(WORKERS), "-np", "1",
                         "--sim-itl-ms", str(ITL_MS), "--sim-itl-jitter", "0",
                         "--preempt", "priority", "--poll-delay", "60")
        url = fleet.add_api()
        wait_until(lambda: httpx.get(f"{url}/props").json().get("total_slots") == WORKERS, 60,
                   what="the workers")
        ended: dict[str, Any] = {}
        threads = []
        for i in range(WORKERS):
            started = threading.Event()

            def hog(prompt: str = f"priority 10 story {i}",
                    started: threading.Event = started) -> None:
                with httpx.stream("POST", f"{url}/completion", timeout=120, json={
                        "prompt": prompt, "n_predict": HOG_TOKENS, "ignore_eos": True,
                        "stream": True, "priority": 10}) as response:
                    ended[prompt] = read_completion(response, started)

            threads.append(threading.Thread(target=hog))
            threads[-1].start()
            assert started.wait(60), "a priority 10 stream did not start"
        preemptors = preempt_keys.queue_preemptors(keys.slot_queue("simulated"))
        wait_until(lambda: client.zcard(preemptors) == WORKERS, 10,
                   what="every full worker among the preemptors")
        sha = client.script_load(CLAIM_URGENT)  # a look's EVALSHA runs at once (no NOSCRIPT)
        monitor = Monitor(own_redis)
        sent = time.monotonic()
        urgent = httpx.post(f"{url}/completion", timeout=60,
                            json={"prompt": "urgent", "n_predict": 2, "priority": 0})
        answered = time.monotonic() - sent
        assert urgent.status_code == 200, urgent.text
        # the victim's hand back and requeue, and the slot changes, come within a moment
        wait_until(lambda: client.zcard(preemptors) == WORKERS - 1, 10,
                   what="the victim's worker back among the preemptors")
        time.sleep(0.5)
        commands = monitor.stop()
        assert answered < HOG_TOKENS * ITL_MS / 1000 / 2, "the urgent request waited for a slot"
        looks = [c for c in commands if c.startswith(f"EVALSHA {sha}")]
        assert len(looks) == 1, f"{len(looks)} looks for one urgent job at {WORKERS} full workers"
        for thread in threads:
            thread.join(120)
        assert all(last["tokens_predicted"] == HOG_TOKENS for _, last in ended.values()), ended
    finally:
        fleet.kill()
