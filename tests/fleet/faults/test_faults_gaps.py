"""Gaps of issue 7's fault tests: key lifetimes after a request and after a worker's death,
the failure counter by cause, events pub/sub lost (read back from the log exactly once), and a
background task that dies taking its process down. Real Redis (one per test), real workers on
Gemma, real HTTP clients."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from scheduler.contract import keys
from tests.conftest import make_fleet
from tests.faults import start_streams
from tests.paths import ROOT
from tests.processes import Fleet, start_redis, wait_until

pytestmark = pytest.mark.process  # starts llamaq or redis-server (tests/lanes.py)

ONE_SLOT = ("-c", "1024", "-np", "1", "-t", "1")
HOUR_S = 3600
KEPT = {keys.EPOCH}
"""Keys docs/redis-keys.md says are kept without a TTL (besides per-model ones)."""


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[str]:
    """A Redis of the test's own: every key in it belongs to this test."""
    process, url = start_redis(tmp_path / "redis")
    yield url
    process.kill()
    process.wait()


def long_lived_keys(client: Any, model: str, live_workers: set[str]) -> dict[str, int]:
    """Keys that would outlive an hour: no TTL or a TTL above one hour (those
    docs/redis-keys.md keeps on purpose excepted: the epoch, a model's counters, registry and
    metrics window, live workers' entries)."""
    kept = KEPT | {keys.model_counters(model), keys.model_workers(model),
                   keys.metrics_window(model),  # a day after the last scrape, on purpose
                   keys.media_marker(model)}  # one marker for the model's fleet, kept
    found: dict[str, int] = {}
    for raw in client.scan_iter(count=1000):
        key = raw.decode()
        if key in kept or any(key.startswith(keys.worker_info(w)) for w in live_workers):
            continue
        ttl = int(client.ttl(key))
        if ttl == -1 or ttl > HOUR_S:
            found[key] = ttl
    return found


TABLE = re.compile("|".join([  # docs/redis-keys.md's table
    r"llamaq:queue:[^:]+:(slot|utility|batch|worker:[^:]+)(:order(:-?[0-9]+|:reserved)?"
    r"|:waiters|:preemptors)?",
    r"arq:(job|in-progress|retry):[^:]+",
    r"llamaq:job:[^:]+:(owner|state|cancel|log)", r"llamaq:chatcmpl:[^:]+",
    r"llamaq:worker:[^:]+(:slots|:metrics|:prefixes)?",
    r"llamaq:model:[^:]+:(workers|counters|metrics_window|media_marker|queued)",
    r"llamaq:stream:[^:]+(:holder)?", r"llamaq:epoch", r"llamaq:fair:[^:]+"]))


def unlisted_keys(client: Any) -> list[str]:
    """Keys docs/redis-keys.md does not name."""
    return [k.decode() for k in client.scan_iter(count=1000) if not TABLE.fullmatch(k.decode())]


def workers_of(client: Any, model: str) -> set[str]:
    return {m.decode() for m in client.zrange(keys.model_workers(model), 0, -1)}


def metric(api: str, name: str) -> float:
    text = httpx.get(f"{api}/metrics", timeout=10).text
    line = next((x for x in text.splitlines() if x.startswith((f"{name} ", f"{name}{{"))), None)
    return 0.0 if line is None else float(line.split()[1])


def test_key_lifetimes_and_a_dead_workers_keys(own_redis: str, tmp_path: Path,
                                                gemma_path: Path) -> None:
    """After requests of each kind end, no key of theirs lives past an hour; a SIGKILLed
    worker's keys and registry entry are gone within 30 s; the failure counts its cause
    (--migration-limit 0: the killed stream ends with 503 instead of continuing)."""
    client: Any = redis.Redis.from_url(own_redis)
    fleet = make_fleet(own_redis, tmp_path, gemma_path, "gemma-keys")
    try:
        fleet.add_worker(*ONE_SLOT)
        api = fleet.add_api("--metrics", "--migration-limit", "0")
        fleet.wait_healthy(api)
        wait_until(lambda: len(workers_of(client, "gemma-keys")) == 1, what="the worker")
        (survivor,) = workers_of(client, "gemma-keys")
        done = httpx.post(f"{api}/completion", json={"prompt": "Hi", "n_predict": 4},
                          timeout=60)
        assert done.status_code == 200, done.text
        with httpx.stream("POST", f"{api}/v1/chat/completions", timeout=60, json={
                "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,
                "stream": True}) as response:
            assert response.status_code == 200
            response.read()
        assert httpx.post(f"{api}/tokenize", json={"content": "Hi"}).status_code == 200
        time.sleep(0.5)  # the worker's clean-up after its last event
        assert client.keys("llamaq:job:*:log") and client.keys("llamaq:stream:*")
        assert unlisted_keys(client) == []
        assert long_lived_keys(client, "gemma-keys", {survivor}) == {}

        victim = fleet.add_worker(*ONE_SLOT)
        wait_until(lambda: len(workers_of(client, "gemma-keys")) == 2, timeout=60,
                   what="the second worker")
        (dead,) = workers_of(client, "gemma-keys") - {survivor}
        body = {"prompt": "A long story:", "n_predict": 96, "ignore_eos": True}
        records, threads = start_streams(api, [body, body])  # one on each worker
        for record in records:
            assert record.started.wait(60), "a stream did not start"
        victim.kill()
        killed_at = time.monotonic()
        wait_until(lambda: any(r.outcome == "errored" for r in records), timeout=15,
                   what="the error event of the killed worker's stream")

        def dead_worker_gone() -> bool:
            httpx.get(f"{api}/slots", timeout=10)  # a read drops stale registry members
            left = [k for k in client.scan_iter(f"{keys.worker_info(dead)}*")]
            return not left and dead not in workers_of(client, "gemma-keys")

        wait_until(dead_worker_gone, timeout=30, what="the dead worker's keys to go")
        assert time.monotonic() - killed_at < 30
        assert metric(api, 'llamaq:jobs_failed_total{cause="worker_died"}') == 1
        for thread in threads:
            thread.join(120)
        assert [r.outcome for r in records].count("answered") == 1, records
        time.sleep(keys.JOB_LEASE_S + 1)
        assert unlisted_keys(client) == []
        assert long_lived_keys(client, "gemma-keys", set()) == {}
    finally:
        fleet.stop()


@dataclass
class Gaps:
    client: Any
    fleet: Fleet
    api: str


@pytest.fixture(scope="module")
def gaps(tmp_path_factory: pytest.TempPathFactory, gemma_path: Path) -> Iterator[Gaps]:
    """A Redis of the module's own, one worker (one slot), one api pod."""
    folder = tmp_path_factory.mktemp("gaps")
    process, url = start_redis(folder / "redis")
    fleet = make_fleet(url, folder, gemma_path, "gemma-gaps")
    try:
        fleet.add_worker("-c", "1024", "-np", "1", "-t", "2")
        api = fleet.add_api("--timeout", "600")
        fleet.wait_healthy(api)
        yield Gaps(redis.Redis.from_url(url), fleet, api)
    finally:
        fleet.stop()
        process.kill()
        process.wait()


def test_events_pubsub_lost_are_read_back_exactly_once(gaps: Gaps) -> None:
    """The api's pub/sub connection is killed again and again while a stream runs (Redis's
    CLIENT KILL TYPE pubsub, so events and the final one published meanwhile never arrive by
    pub/sub): the client still gets every token once, in order, and the final event at once."""
    client, fleet, api = gaps.client, gaps.fleet, gaps.api
    body = {"prompt": "Count from one to forty in words:", "n_predict": 40,
            "temperature": 0, "cache_prompt": False}
    expected = httpx.post(f"{api}/completion", json=body, timeout=60).json()["content"]
    stop = threading.Event()
    kills = [0]

    def killer() -> None:
        while not stop.is_set():
            kills[0] += int(client.client_kill_filter(_type="pubsub"))
            time.sleep(0.15)

    thread = threading.Thread(target=killer, daemon=True)
    events: list[dict[str, Any]] = []
    ids: list[str] = []
    started = time.monotonic()
    with httpx.stream("POST", f"{api}/completion", json={**body, "stream": True},
                      timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("id: "):
                ids.append(line[4:])
            if not line.startswith("data: "):
                continue
            events.append(json.loads(line[6:]))
            if len(events) == 1:
                thread.start()
    stop.set()
    thread.join(5)
    took = time.monotonic() - started
    assert kills[0] >= 2, "the api's subscriber was never cut"
    assert events[-1]["stop"] is True and "error" not in events[-1], events[-1]
    assert "".join(e["content"] for e in events) == expected
    assert len([e for e in events if e["content"]]) <= 40
    assert len(ids) == len(set(ids)) == len(events)
    assert took < 60, took  # the final event came, not --timeout (600 s)
    assert fleet.processes[-1].poll() is None and fleet.processes[0].poll() is None
    lost_final_is_read_back(client, fleet.processes[-1], api, body, expected)


def logged_final(client: Any, log_key: bytes) -> bool:
    last: Any = client.xrevrange(log_key, count=1)
    return b'"kind":"final"' in last[0][1][b"e"]


def freeze_until_the_job_ends(client: Any, pod: subprocess.Popen[bytes],
                              logs_before: set[bytes]) -> None:
    pod.send_signal(signal.SIGSTOP)
    try:
        assert client.client_kill_filter(_type="pubsub") >= 1
        (log_key,) = set(client.scan_iter("llamaq:job:*:log")) - logs_before
        wait_until(lambda: logged_final(client, log_key), timeout=60,
                   what="the job's end (in its log)")
    finally:
        pod.send_signal(signal.SIGCONT)


def lost_final_is_read_back(client: Any, pod: subprocess.Popen[bytes], api: str,
                            body: dict[str, Any], expected: str) -> None:
    """The api pod is frozen (SIGSTOP) mid-stream, its subscriber killed, and the job ends
    meanwhile: its last tokens and its final event never come by pub/sub. Thawed, the pod
    reads them back from the job's log and the stream ends at once, complete."""
    logs_before = set(client.scan_iter("llamaq:job:*:log"))
    events: list[dict[str, Any]] = []
    with httpx.stream("POST", f"{api}/completion", json={**body, "stream": True},
                      timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(json.loads(line[6:]))
            if len(events) != 2:
                continue
            freeze_until_the_job_ends(client, pod, logs_before)
            thawed = time.monotonic()
    assert time.monotonic() - thawed < 5
    assert events[-1]["stop"] is True and "error" not in events[-1], events[-1]
    assert "".join(e["content"] for e in events) == expected



def test_malformed_messages_on_our_channels_kill_nothing(gaps: Gaps) -> None:
    """Junk published on a waiting job's events channel, on the cancel and on the control
    channel is logged and dropped: the api pod and the worker live on, the stream completes."""
    client, fleet, api = gaps.client, gaps.fleet, gaps.api
    channels_before = set(client.pubsub_channels("llamaq:job:*"))
    events: list[dict[str, Any]] = []
    with httpx.stream("POST", f"{api}/completion", timeout=120, json={
            "prompt": "A story:", "n_predict": 24, "ignore_eos": True,
            "stream": True}) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(json.loads(line[6:]))
            if len(events) == 1:
                channels = set(client.pubsub_channels("llamaq:job:*")) - channels_before
                assert channels, "the job's events channel"
                for junk in (b"", b"\x00", b"\xff{"):
                    for channel in channels:
                        client.publish(channel, junk)
                    client.publish(keys.CANCEL_CHANNEL, junk)
                    client.publish(keys.CONTROL_CHANNEL, junk)
    assert events[-1]["stop"] is True and "error" not in events[-1], events[-1]
    assert sum(1 for e in events if e["content"]) == 24
    time.sleep(1)
    assert [p.poll() for p in fleet.processes] == [None, None]
    assert httpx.post(f"{api}/completion", json={"prompt": "Hi", "n_predict": 2},
                      timeout=60).status_code == 200


SUPERVISED = """
import asyncio, os, sys
from scheduler.supervise import exit_when_done

async def fails() -> None:
    await asyncio.sleep(0.1)
    raise RuntimeError("the task died")

async def main() -> None:
    exit_when_done(asyncio.create_task(fails()), "doomed", lambda: os._exit(3))
    cancelled = asyncio.create_task(asyncio.sleep(60))
    exit_when_done(cancelled, "cancelled at shutdown", lambda: os._exit(4))
    cancelled.cancel()
    await asyncio.sleep(30)
    sys.exit(0)

asyncio.run(main())
"""


def test_a_background_task_that_dies_ends_its_process() -> None:
    """The supervising helper with a real task that raises, in a real process: the process
    exits non-zero at once and logs why; a task cancelled (a shutdown) does not stop it.
    (Nothing reachable from outside kills a hub or worker task for real: their loops retry
    every Redis error; this test covers the helper they use.)"""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", SUPERVISED], capture_output=True, timeout=30,
                          cwd=ROOT)
    assert done.returncode == 3, done.stderr.decode()
    assert time.monotonic() - started < 15
    assert "background task 'doomed' ended" in done.stderr.decode()
    assert "RuntimeError('the task died')" in done.stderr.decode()
