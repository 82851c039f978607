"""Issue 26: a worker that dies costs a pause, not an answer. Streams whose worker is
SIGKILLed after they sent tokens continue on another worker (the continuation is read from
the job's event log); the client's stream goes on with no error event, no token twice or
missing, and monotonic event ids. Real Redis, real workers on Gemma, raw SSE clients."""

from __future__ import annotations

import datetime
import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai

from scheduler.contract import keys
from scheduler.streams import EventId
from tests.conftest import make_fleet
from tests.faults import slots_of
from tests.fleet.batches.test_batches import busy_slots
from tests.fleet.faults.test_faults_jobs import api_log, metric, worker_log
from tests.processes import wait_until
from tests.proxy import RoundRobinProxy

MANY_SLOTS = ("-c", "4096", "-np", "8", "-t", "1")
N_PREDICT = 40


@dataclass
class Sse:
    """One streamed request as its client saw it: every data event with its id and time."""

    events: list[tuple[str, dict[str, Any], float]] = field(default_factory=list)
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def data(self) -> list[dict[str, Any]]:
        return [d for _, d, _ in self.events]

    def tokens_before(self, at: float) -> int:
        return sum(1 for _, d, t in self.events if t < at and not d.get("stop"))


def read(url: str, body: dict[str, Any], sse: Sse, headers: dict[str, str] | None = None,
         stop_after: int | None = None) -> None:
    """Read a stream into `sse` (meant for a thread); `stop_after`: drop the connection after
    that many data events (a client that resumes later)."""
    try:
        with httpx.stream("POST", url, json={**body, "stream": True}, headers=headers or {},
                          timeout=180) as response:
            assert response.status_code == 200, response.read()
            event_id = ""
            for line in response.iter_lines():
                if line.startswith("id: "):
                    event_id = line.removeprefix("id: ")
                elif line.startswith("data: ") and line != "data: [DONE]":
                    sse.events.append((event_id, json.loads(line.removeprefix("data: ")),
                                       time.monotonic()))
                    if stop_after is not None and len(sse.events) >= stop_after:
                        return
    except Exception as error:  # recorded: the test asserts there is none
        sse.error = repr(error)
    finally:
        sse.done.set()


def start(url: str, body: dict[str, Any], **kwargs: Any) -> Sse:
    sse = Sse()
    threading.Thread(target=read, args=(url, body, sse), kwargs=kwargs, daemon=True).start()
    return sse


def native_text(sse: Sse) -> str:
    return "".join(d.get("content", "") for d in sse.data())


def assert_ids_monotonic(sse: Sse) -> None:
    counts = [EventId.parse(i).counts for i, _, _ in sse.events]
    assert all(a < b for a, b in itertools.pairwise(counts)), counts


def greedy(i: int) -> dict[str, Any]:
    return {"prompt": f"Story number {i}: once upon a time", "n_predict": N_PREDICT,
            "temperature": 0, "ignore_eos": True}


def test_streams_of_a_killed_worker_continue_on_the_other(redis_url: str, workdir: Path,
                                                          gemma_path: Path) -> None:
    """Two workers, 6 greedy native streams and an OpenAI `n: 2` stream; one worker is
    SIGKILLed once every stream has tokens. Every stream ends with its answer (no error
    event), each native one with exactly N_PREDICT token events whose tokens detokenize to
    its text (none twice, none missing), event ids monotonic; the survivor logs the
    migrations, /metrics counts them and their stalls.

    Greedy equality with an undisturbed run is checked in-process
    (tests/worker/engine/test_engine_migration.py): across a fleet, the same greedy request
    already differs between undisturbed runs whose batches held other requests (Gemma 3
    270M Q4 on CPU has near ties; docs/faults.md)."""
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma-migrate")
    try:
        processes = {name: fleet.add_worker(*MANY_SLOTS, "--worker-id", name)
                     for name in ("one", "two")}
        api = fleet.add_api("--metrics")
        fleet.wait_healthy(api)
        wait_until(lambda: len(slots_of(api)) == 16, timeout=60, what="both workers")
        native = f"{api}/completion"
        streams = [start(native, greedy(i)) for i in range(6)]
        openai = start(f"{api}/v1/completions", {"prompt": "A tale:", "max_tokens": N_PREDICT,
                                                 "n": 2, "temperature": 0,
                                                 "ignore_eos": True})
        wait_until(lambda: all(len(s.events) >= 3 for s in streams) and len(openai.events)
                   >= 4, timeout=120, what="every stream has tokens")
        doomed = max(processes, key=lambda name: busy_slots(api, name))
        assert busy_slots(api, doomed) > 0
        processes[doomed].kill()
        killed_at, killed_wall = time.monotonic(), datetime.datetime.now()
        survivor = next(p for name, p in processes.items() if name != doomed)
        for sse in [*streams, openai]:
            assert sse.done.wait(240), "a stream did not end"
        # the dead worker's connections are gone at once, so the api takes its leases
        # within about a second instead of waiting 3 s for them to lapse
        # (scheduler/worker_presence.py)
        taken = [datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
                 for line in api_log(fleet).splitlines() if "its lease is taken now" in line]
        assert taken, "no lease was taken from the dead worker"
        seen_s = (min(taken) - killed_wall).total_seconds()
        stall = max((min(t for _, _, t in sse.events if t > killed_at) - killed_at
                     for sse in [*streams, openai]
                     if any(t > killed_at for _, _, t in sse.events)), default=0.0)
        print(f"death seen after {seen_s:.2f} s; longest pause {stall:.2f} s")
        assert seen_s < keys.JOB_LEASE_S - 1, f"the death was seen after {seen_s:.2f} s"

        for sse in streams:
            assert sse.error is None, sse.error
            data = sse.data()
            assert not any("error" in d for d in data), data[-1]
            assert data[-1]["stop"] and data[-1]["tokens_predicted"] == N_PREDICT
            assert len(data) - 1 == N_PREDICT  # one event per token
            tokens = [t for d in data[:-1] for t in d["tokens"]]
            assert len(tokens) == N_PREDICT
            text = httpx.post(f"{api}/detokenize", json={"tokens": tokens}, timeout=30)
            assert text.json()["content"] == native_text(sse)  # none twice, none missing
            assert_ids_monotonic(sse)

        assert openai.error is None, openai.error
        chunks = openai.data()
        assert not any("error" in c for c in chunks)
        finished = [c["choices"][0]["finish_reason"] for c in chunks
                    if c.get("choices") and c["choices"][0].get("finish_reason")]
        assert sorted(finished) == ["length", "length"], chunks[-3:]
        assert_ids_monotonic(openai)

        migrated = metric(api, "llamaq:jobs_migrated_total")
        assert migrated >= 1
        assert metric(api, "llamaq:migration_stall_seconds_count") == migrated
        assert metric(api, 'llamaq:jobs_failed_total{cause="worker_died"}') == 0
        log = worker_log(fleet, survivor)
        assert "continuing it on worker" in log and "died after" in log
    finally:
        fleet.stop()


def test_a_stream_resumed_with_last_event_id_across_a_migration(
        redis_url: str, workdir: Path, gemma_path: Path) -> None:
    """The client drops its connection; its worker dies; the client resumes with its last
    event id (within the 3 s a left stream runs on) and gets the rest: no event twice, none
    missing, ids going on from where it left."""
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma-resume-migrate")
    try:
        processes = {name: fleet.add_worker(*MANY_SLOTS, "--worker-id", name)
                     for name in ("one", "two")}
        api = fleet.add_api()
        fleet.wait_healthy(api)
        wait_until(lambda: len(slots_of(api)) == 16, timeout=60, what="both workers")
        native = f"{api}/completion"
        body = {**greedy(7), "n_predict": 120}
        first = Sse()
        read(native, body, first, stop_after=5)
        running = [name for name in processes if busy_slots(api, name)]
        assert len(running) == 1, running
        processes[running[0]].kill()
        last_id = first.events[-1][0]
        rest = Sse()
        read(native, body, rest, headers={"Last-Event-ID": last_id})
        assert rest.error is None, rest.error
        data = first.data() + rest.data()
        assert not any("error" in d for d in data), [d for d in data if "error" in d]
        assert data[-1]["stop"] and data[-1]["tokens_predicted"] == 120
        tokens = [t for d in data[:-1] for t in d["tokens"]]
        assert len(tokens) == 120
        text = httpx.post(f"{api}/detokenize", json={"tokens": tokens}, timeout=30)
        assert text.json()["content"] == native_text(first) + native_text(rest)
        assert EventId.parse(rest.events[0][0]).counts > EventId.parse(last_id).counts
        assert_ids_monotonic(rest)
    finally:
        fleet.stop()


def test_n_cmpl_group_of_a_dead_worker_continues_elsewhere(redis_url: str, workdir: Path,
                                                          gemma_path: Path) -> None:
    """An n_cmpl group is placed on one worker (to share its prompt cache), not pinned: when
    that worker dies its choices move to the shared queue and continue on the other."""
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma-ncmpl-migrate")
    try:
        victim = fleet.add_worker("-c", "2048", "-np", "2", "-t", "1")
        api = fleet.add_api()
        fleet.wait_healthy(api)
        group = start(f"{api}/completion", {**greedy(3), "n_cmpl": 2})
        wait_until(lambda: len(group.events) >= 4, timeout=120, what="both choices running")
        fleet.add_worker("-c", "2048", "-np", "2", "-t", "1")
        wait_until(lambda: len(slots_of(api)) == 4, timeout=60, what="the second worker")
        victim.kill()
        assert group.done.wait(240)
        assert group.error is None, group.error
        data = group.data()
        assert not any("error" in d for d in data), data[-1]
        finals = [d for d in data if d.get("stop")]
        assert sorted(d["index"] for d in finals) == [0, 1]
        assert all(d["tokens_predicted"] == N_PREDICT for d in finals)
    finally:
        fleet.stop()


def test_past_the_migration_limit_a_stream_ends_with_the_poison_error(
        redis_url: str, workdir: Path, gemma_path: Path) -> None:
    """--migration-limit 1: the stream continues after its first worker dies; when the
    second dies too it ends with the poison job's 500."""
    one = ("-c", "1024", "-np", "1", "-t", "1")
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma-migrate-limit")
    try:
        first = fleet.add_worker(*one)
        api = fleet.add_api("--migration-limit", "1", "--metrics")
        fleet.wait_healthy(api)
        endless = {"prompt": "A long story:", "n_predict": 100000, "ignore_eos": True}
        sse = start(f"{api}/completion", endless)
        wait_until(lambda: len(sse.events) >= 3, timeout=60, what="tokens")
        second = fleet.add_worker(*one)
        wait_until(lambda: len(slots_of(api)) == 2, timeout=60, what="the second worker")
        first.kill()
        wait_until(lambda: "continuing it on worker" in worker_log(fleet, second),
                   timeout=30, what="the migration")
        seen = len(sse.events)
        wait_until(lambda: len(sse.events) > seen + 2, timeout=30, what="continued tokens")
        second.kill()
        assert sse.done.wait(30)
        last = sse.data()[-1]
        assert last["error"]["type"] == "server_error", last
        assert metric(api, 'llamaq:jobs_failed_total{cause="poison"}') == 1
        assert metric(api, "llamaq:jobs_migrated_total") == 1
    finally:
        fleet.stop()


def test_sdk_retries_reach_a_live_pod(redis_url: str, workdir: Path, gemma_path: Path) -> None:
    """The other half: an api pod dies (SIGKILL) behind a round-robin proxy. The openai and
    anthropic SDKs' own retries (max_retries, default 2: a 502 is retried) send every request,
    streamed or not, on to the live pod; with max_retries=0 the dead pod's turns fail, which
    shows the retries are what carried them."""
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma-sdk-retry")
    try:
        fleet.add_worker("-c", "2048", "-np", "2", "-t", "1")
        doomed_url = fleet.add_api()
        doomed = fleet.processes[-1]
        live_url = fleet.add_api()
        fleet.wait_healthy(live_url)
        ports = [int(url.rsplit(":", 1)[1]) for url in (doomed_url, live_url)]
        doomed.kill()
        doomed.wait(10)
        with RoundRobinProxy([("127.0.0.1", p) for p in ports]).running() as proxy:
            # one connection per request, so the proxy's turns alternate per request, as a
            # balancer that picks an upstream per request does
            fresh = {"Connection": "close"}
            client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="x", timeout=120,
                                   default_headers=fresh)
            for _ in range(3):
                answer = client.completions.create(model="gemma-sdk-retry", prompt="Hi",
                                                   max_tokens=4)
                assert answer.choices[0].finish_reason == "length"
                chunks = list(client.chat.completions.create(
                    model="gemma-sdk-retry", messages=[{"role": "user", "content": "Hi"}],
                    max_tokens=4, stream=True))
                assert chunks and chunks[-1].choices[0].finish_reason == "length"
            anthropic_client = anthropic.Anthropic(
                base_url=proxy.url, api_key="x", timeout=120,
                default_headers=fresh)
            for _ in range(2):
                message = anthropic_client.messages.create(
                    model="gemma-sdk-retry", max_tokens=4,
                    messages=[{"role": "user", "content": "Hi"}])
                assert message.stop_reason == "max_tokens"
            assert proxy.bad_gateways == 8  # every request's first turn: the dead pod
            no_retries = openai.OpenAI(base_url=proxy.url + "/v1", api_key="x",
                                       max_retries=0, timeout=120,
                                       default_headers=fresh)
            failures = 0
            for _ in range(2):
                try:
                    no_retries.completions.create(model="gemma-sdk-retry", prompt="Hi",
                                                  max_tokens=4)
                except openai.APIStatusError as error:
                    assert error.status_code == 502
                    failures += 1
            assert failures == 1
    finally:
        fleet.stop()
