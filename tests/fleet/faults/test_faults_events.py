"""Events under faults (issue 7): pings and headers at slot start, big events beside small
ones, streams resumed on another pod with Last-Event-ID, a Redis outage and its recovery.

One Redis of this module's own (the outage test kills it), one worker, two api pods. That
Redis has a tight pub/sub output buffer limit (1 MiB instead of 32 MiB) so that events of a
megabyte show what events of tens of megabytes (n_probs near the vocabulary's size) do with the
default limit, without spending minutes computing them on a CPU."""

from __future__ import annotations

import concurrent.futures
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import make_fleet
from tests.processes import Fleet, wait_until
from tests.redis_server import RestartableRedis, SentinelGroup

pytestmark = pytest.mark.process  # starts llamaq or redis-server (tests/lanes.py)

WORKER = ("-c", "6144", "-np", "3", "-t", "2")
PUBSUB_LIMIT = ("--client-output-buffer-limit", "pubsub 1mb 256kb 10")
SLOW_PROMPT = "word " * 400
"""Some tenths of a second (or more) of prompt evaluation on two CPU threads."""
LONG = {"prompt": "Write a very long story about a ship:", "n_predict": 100000,
        "ignore_eos": True}
GREEDY = {"prompt": "Count from one to forty in words:", "n_predict": 40, "temperature": 0,
          "cache_prompt": False}


@dataclass
class Pods:
    fleet: Fleet
    redis: RestartableRedis
    a: str
    """An api pod started with --sse-ping-interval 1."""
    b: str


@pytest.fixture(scope="module")
def pods(tmp_path_factory: pytest.TempPathFactory, gemma_path: Path) -> Iterator[Pods]:
    folder = tmp_path_factory.mktemp("faults-events")
    redis = RestartableRedis(folder / "redis", extra=PUBSUB_LIMIT)
    redis.start()
    fleet = make_fleet(redis.url, folder, gemma_path, "gemma")
    try:
        fleet.add_worker(*WORKER)
        a = fleet.add_api("--sse-ping-interval", "1")
        b = fleet.add_api()
        fleet.wait_healthy(a)
        yield Pods(fleet, redis, a, b)
    finally:
        fleet.stop()
        redis.kill()


@dataclass
class Sse:
    """One server-sent event as a client sees it."""

    id: str | None
    event: str | None
    data: str

    def json(self) -> Any:
        return json.loads(self.data)


def sse(response: httpx.Response, comments: list[float] | None = None) -> Iterator[Sse]:
    """The events of a stream; the arrival times of `:` comments go to `comments`."""
    fields: dict[str, str] = {}
    for line in response.iter_lines():
        if not line:
            if fields:
                assert "data" in fields, fields
                yield Sse(fields.get("id"), fields.get("event"), fields["data"])
                fields = {}
            continue
        if line.startswith(":"):
            if comments is not None:
                comments.append(time.monotonic())
            continue
        name, _, value = line.partition(": ")
        assert name in ("id", "event", "data") and name not in fields, line
        fields[name] = value


def stream(url: str, body: dict[str, Any], headers: dict[str, str] | None = None,
           limit: int | None = None) -> list[Sse]:
    """The stream's events (the first `limit` of them, then the client leaves)."""
    events: list[Sse] = []
    with httpx.stream("POST", url, json={**body, "stream": True}, headers=headers,
                      timeout=120) as response:
        assert response.status_code == 200, response.read()
        for event in sse(response):
            events.append(event)
            if limit is not None and len(events) == limit:
                break
    return events


# -- headers at slot start, pings ---------------------------------------------------------


def timed(url: str, body: dict[str, Any]) -> tuple[list[float], list[tuple[float, Sse]]]:
    """(ping times, (time, event) pairs) of a stream, times from when its headers came."""
    pings: list[float] = []
    events: list[tuple[float, Sse]] = []
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=120) as response:
        assert response.status_code == 200, response.read()
        opened = time.monotonic()
        for event in sse(response, pings):
            events.append((time.monotonic() - opened, event))
    return [p - opened for p in pings], events


def test_pings_start_with_the_slot_before_the_first_token(pods: Pods) -> None:
    """The stream opens when a slot takes the job: a prompt that takes a while to evaluate
    is announced by pings (the request's sse_ping_interval) before its first token."""
    body = {"prompt": SLOW_PROMPT, "n_predict": 2, "sse_ping_interval": 0.05,
            "cache_prompt": False}
    pings, events = timed(f"{pods.b}/completion", body)
    first_at, first = events[0]
    assert first.id and "content" in first.json()
    assert [p for p in pings if p < first_at], (first_at, pings)
    assert events[-1][1].json()["stop"] is True


def test_server_ping_interval_and_its_per_request_override(pods: Pods) -> None:
    slow = {"prompt": SLOW_PROMPT, "n_predict": 1, "cache_prompt": False}
    pings, events = timed(f"{pods.a}/completion", slow)  # --sse-ping-interval 1
    silent_s = events[0][0]
    assert len(pings) >= int(silent_s) - 1, (silent_s, pings)
    assert all(p >= 0.9 for p in pings), pings
    pings, _ = timed(f"{pods.a}/completion", {**slow, "sse_ping_interval": -1})
    assert pings == []
    pings, events = timed(f"{pods.b}/completion", slow)  # the default, 30 s
    assert events[0][0] >= 30 or pings == []


def test_error_before_the_slot_is_a_json_error(pods: Pods) -> None:
    body = {"prompt": "word " * 3000, "n_predict": 4, "stream": True}
    response = httpx.post(f"{pods.a}/completion", json=body, timeout=60)
    assert response.status_code == 400
    assert response.headers["content-type"].startswith("application/json")
    assert response.json()["error"]["type"] == "exceed_context_size_error"


# -- big events ----------------------------------------------------------------------------


def test_huge_events_do_not_cut_other_streams(pods: Pods) -> None:
    """Events of a request with a huge n_probs travel beside a greedy stream on the pod's one
    subscriber connection: the greedy stream ends as it does alone."""
    alone = stream(f"{pods.a}/completion", GREEDY)[-1].json()

    def huge() -> dict[str, Any]:
        body = {"prompt": "Hi", "n_predict": 4, "n_probs": 16000, "temperature": 0,
                "stream": True}
        response = httpx.post(f"{pods.a}/completion", json=body, timeout=120)
        return {"status": response.status_code}

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        beside = pool.submit(stream, f"{pods.a}/completion", {**GREEDY, "n_predict": 64})
        time.sleep(1)
        big = pool.submit(huge)
        events = beside.result()
        assert big.result()["status"] == 200
    final = events[-1].json()
    assert "error" not in final, final
    assert final["stop_type"] == "limit" and final["tokens_predicted"] == 64
    assert len(events) - 1 == 64  # one event per token: none lost
    assert alone["stop_type"] == "limit"


# -- resuming on another pod ---------------------------------------------------------------


def _resume(first_pod: str, second_pod: str, path: str, body: dict[str, Any],
            keep: int) -> tuple[list[Sse], list[Sse], list[Sse]]:
    """(uninterrupted, first part, resumed part) of the same request."""
    whole = stream(first_pod + path, body)
    part = stream(first_pod + path, body, limit=keep)
    assert part[-1].id, part[-1]
    rest = stream(second_pod + path, body, headers={"Last-Event-ID": part[-1].id})
    return whole, part, rest


def test_native_stream_resumes_on_another_pod(pods: Pods) -> None:
    whole, part, rest = _resume(pods.a, pods.b, "/completion", GREEDY, keep=5)
    assert all(event.id for event in whole + part + rest)
    assert [e.json() | {"timings": None} for e in (part + rest)[:-1]] == \
        [e.json() | {"timings": None} for e in whole[:-1]]
    assert rest[-1].json()["content"] == whole[-1].json()["content"]
    assert rest[-1].json()["tokens_predicted"] == 40


def test_openai_chat_stream_resumes_on_another_pod(pods: Pods) -> None:
    body = {"messages": [{"role": "user", "content": "Count from one to thirty."}],
            "max_tokens": 30, "temperature": 0, "cache_prompt": False}
    whole, part, rest = _resume(pods.a, pods.b, "/v1/chat/completions", body, keep=6)
    assert rest[-1].data == "[DONE]"
    chunks = [e.json() for e in part + rest[:-1]]
    assert {c["id"] for c in chunks} == {part[0].json()["id"]}
    assert {c["created"] for c in chunks} == {part[0].json()["created"]}

    def text(events: list[Sse]) -> str:
        return "".join(c["choices"][0]["delta"].get("content") or ""
                       for c in (e.json() for e in events if e.data != "[DONE]")
                       if c["choices"])

    assert text(part) + text(rest) == text(whole)
    assert len(part) + len(rest) == len(whole)


def test_anthropic_stream_resumes_on_another_pod(pods: Pods) -> None:
    body = {"model": "gemma", "max_tokens": 30, "temperature": 0,
            "messages": [{"role": "user", "content": "Count from one to thirty."}]}
    whole, part, rest = _resume(pods.a, pods.b, "/v1/messages", body, keep=5)
    assert [e.event for e in part + rest] == [e.event for e in whole]
    assert "message_start" not in [e.event for e in rest]
    message_id = part[0].json()["message"]["id"]
    assert rest[-1].event == "message_stop"

    def text(events: list[Sse]) -> str:
        return "".join(e.json()["delta"].get("text", "") for e in events
                       if e.event == "content_block_delta")

    assert text(part) + text(rest) == text(whole)
    assert message_id.startswith("msg_")


def test_an_unknown_event_id_is_404(pods: Pods) -> None:
    for last_id in ("nope-1.0", "garbage"):
        response = httpx.post(f"{pods.b}/completion", json={**GREEDY, "stream": True},
                              headers={"Last-Event-ID": last_id}, timeout=30)
        assert response.status_code == 404
        assert response.json()["error"]["type"] == "not_found_error"


# -- Redis down, then back -----------------------------------------------------------------


def _read_until_end(url: str, body: dict[str, Any], started: list[str],
                    ended: dict[str, float]) -> list[Sse]:
    events: list[Sse] = []
    with httpx.stream("POST", url, json={**body, "stream": True}, timeout=60) as response:
        assert response.status_code == 200
        for event in sse(response):
            if not events:
                started.append(url)
            events.append(event)
    ended[url] = time.monotonic()
    return events


def test_redis_outage_and_recovery(pods: Pods) -> None:
    """Redis dies (with its data) under two open streams (one of two jobs) and a queued
    request: every client gets an error within seconds, a new request a 503 with
    Retry-After, no process exits, and after Redis returns everything works again."""
    native, openai = f"{pods.a}/completion", f"{pods.b}/v1/completions"
    started: list[str] = []
    ended: dict[str, float] = {}
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        one = pool.submit(_read_until_end, native, LONG, started, ended)
        two = pool.submit(_read_until_end, openai, {**LONG, "n": 2}, started, ended)
        wait_until(lambda: len(started) == 2, 60, what="both streams running")
        queued = pool.submit(httpx.post, native, json={"prompt": "Hi", "n_predict": 4},
                             timeout=60)
        time.sleep(0.5)
        killed = time.monotonic()
        pods.redis.kill()
        streams = [one.result(), two.result()]
        queued_response = queued.result()
    for events in streams:
        error = events[-1].json()["error"]
        assert error["type"] == "unavailable_error", events[-1]
    assert max(ended.values()) - killed < 5
    assert queued_response.status_code == 503
    assert queued_response.headers["Retry-After"]

    refused = httpx.post(native, json={"prompt": "Hi", "n_predict": 4}, timeout=30)
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["type"] == "unavailable_error"
    assert int(refused.headers["Retry-After"]) > 0
    while time.monotonic() - killed < 15:
        assert all(p.poll() is None for p in pods.fleet.processes), "a process exited"
        time.sleep(1)

    pods.redis.start()  # empty: its data went with it
    back = time.monotonic()
    pods.fleet.wait_healthy(pods.a, timeout=30)
    after = stream(native, {**GREEDY, "n_predict": 8})
    assert after[-1].json()["tokens_predicted"] == 8
    answer = httpx.post(f"{pods.b}/v1/completions",
                        json={"prompt": "Hi", "max_tokens": 4, "n": 2}, timeout=60)
    assert answer.status_code == 200, answer.text
    assert time.monotonic() - back < 30
    assert all(p.poll() is None for p in pods.fleet.processes), "a process exited"


def test_a_quick_restart_without_data_ends_waiting_requests_at_once(pods: Pods) -> None:
    """Redis back within a second but empty: the running stream's job and the queued
    request's job are gone with its data; both clients learn it within seconds."""
    pods.fleet.wait_healthy(pods.a, timeout=30)
    native = f"{pods.a}/completion"
    started: list[str] = []
    ended: dict[str, float] = {}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        runs = [pool.submit(_read_until_end, native, LONG, started, ended) for _ in range(3)]
        wait_until(lambda: len(started) == 3, 60, what="three streams running")
        queued = pool.submit(httpx.post, native, json={"prompt": "Hi", "n_predict": 4},
                             timeout=60)
        time.sleep(0.5)
        restarted = time.monotonic()
        pods.redis.kill()
        pods.redis.start()
        streams = [run.result() for run in runs]
        queued_response = queued.result()
        answered = time.monotonic()
    assert all(events[-1].json()["error"]["type"] == "unavailable_error"
               for events in streams)
    assert queued_response.status_code == 503
    assert answered - restarted < 8
    pods.fleet.wait_healthy(pods.a, timeout=30)
    assert stream(native, {**GREEDY, "n_predict": 4})[-1].json()["tokens_predicted"] == 4


CLIENTS = 3
"""test_sentinel_failover_under_load's clients."""


def test_sentinel_failover_under_load(tmp_path: Path, gemma_path: Path) -> None:
    """Master, replica and three sentinels; the master is killed while requests run: every
    request is answered or refused/ended with a 503, none hangs, no process exits, and after
    the failover requests are answered again."""
    group = SentinelGroup(tmp_path / "sentinel")
    group.start()
    fleet = make_fleet(group.url, tmp_path, gemma_path, "gemma")
    try:
        fleet.add_worker(*WORKER)
        api = fleet.add_api()
        fleet.wait_healthy(api)
        outcomes: list[str] = []
        stop = [time.monotonic() + 600.0]  # moved to 20 s after the failover at the most
        failed_over_at = [float("inf")]
        # the clients answered on a request they sent after the failover: once all are, the
        # load stops (a wait on that event; it was 20 s after the failover, however soon)
        recovered: set[int] = set()

        def load(client: int) -> None:
            body = {**GREEDY, "n_predict": 4, "stream": True}
            while time.monotonic() < stop[0]:
                sent = time.monotonic()
                with httpx.stream("POST", f"{api}/completion", json=body,
                                  timeout=120) as response:
                    if response.status_code == 503 and response.headers["Retry-After"]:
                        outcomes.append("refused")
                        time.sleep(0.5)
                        continue
                    assert response.status_code == 200, response.read()
                    final = list(sse(response))[-1].json()
                outcomes.append("error" if "error" in final else "answered")
                if "error" not in final and sent > failed_over_at[0]:
                    recovered.add(client)
                    if len(recovered) == CLIENTS:
                        stop[0] = 0.0

        with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
            runs = [pool.submit(load, client) for client in range(CLIENTS)]
            wait_until(lambda: "answered" in outcomes, 120, what="load running")
            first_master = group.master_port()
            assert group.master is not None
            group.master.kill()
            wait_until(lambda: group.master_port() != first_master, 30, what="failover")
            failed_over = len(outcomes)
            failed_over_at[0] = time.monotonic()
            stop[0] = min(stop[0], failed_over_at[0] + 20)
            for run in runs:
                run.result(timeout=240)  # none hangs
        assert "answered" in outcomes[failed_over:], outcomes
        response = httpx.post(f"{api}/completion", json={"prompt": "Hi", "n_predict": 4},
                              timeout=60)
        assert response.status_code == 200, response.text
        assert all(p.poll() is None for p in fleet.processes), "a process exited"
    finally:
        fleet.stop()
        group.stop()
