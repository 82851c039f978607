"""Scale from zero (issue 45 item 3, api/cold_start.py): requests for a model with no worker
are held, streams get `: waiting for a worker` comments, the wait shows in the per-model
metrics, and a worker that starts later answers every one; with none by --cold-start-timeout,
503 with Retry-After. Real Redis, a real api and a real worker on Gemma, real HTTP clients."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.conftest import make_fleet
from tests.metrics_text import series
from tests.processes import Fleet, start_redis, wait_until
from tests.tiny_gguf import write_tiny_llama

pytestmark = pytest.mark.process  # the router test starts its own Redis

WORKER = ("-c", "1024", "-np", "2", "-t", "1")
COMMENT = ": waiting for a worker"


@dataclass
class Reply:
    status: int = 0
    text: str = ""
    comments: list[float] = field(default_factory=list)
    """When each waiting comment came (monotonic)."""
    first_data: float | None = None
    headers: dict[str, str] = field(default_factory=dict)


def send(api: str, body: dict[str, object], reply: Reply) -> None:
    with httpx.stream("POST", f"{api}/completion", json=body, timeout=300) as response:
        reply.status, reply.headers = response.status_code, dict(response.headers)
        for line in response.iter_lines():
            reply.text += line + "\n"
            if line == COMMENT:
                reply.comments.append(time.monotonic())
            elif line.startswith("data: ") and reply.first_data is None:
                reply.first_data = time.monotonic()


def fleet_series(api: str) -> dict[str, tuple[str, float]]:
    return series(httpx.get(f"{api}/fleet/metrics", timeout=10).text)


def test_five_requests_wait_for_a_worker_started_20_s_later(redis_url: str, workdir: Path,
                                                             gemma_path: Path) -> None:
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma-cold")
    try:
        api = fleet.add_api("--metrics", "--cold-start-timeout", "240")
        # ready to take requests with no worker; llama-server's /health says no model yet
        assert httpx.get(f"{api}/ready").json() == {"status": "ok"}
        assert httpx.get(f"{api}/health").status_code == 503
        bodies = [{"prompt": f"Count to {i + 3}:", "n_predict": 6, "stream": i < 3}
                  for i in range(5)]
        replies = [Reply() for _ in bodies]
        threads = [threading.Thread(target=send, args=(api, body, reply), daemon=True)
                   for body, reply in zip(bodies, replies, strict=True)]
        sent = time.monotonic()
        for thread in threads:
            thread.start()
        model = 'model="gemma-cold"'
        wait_until(lambda: fleet_series(api)[f"llamaq:cold_start_waiting{{{model}}}"][1] == 5,
                   timeout=20, what="5 requests held")
        held = fleet_series(api)
        assert held[f"llamaq:queue_depth{{{model}}}"][1] == 5
        assert held["llamaq:redis_up"][1] == 1
        assert sum(held[f'llamaq:workers{{{model},state="{s}"}}'][1]
                   for s in ("idle", "busy", "sleeping")) == 0
        own = series(httpx.get(f"{api}/metrics", timeout=10).text)  # llama-server's, too
        assert own[f"llamaq:queue_depth{{{model}}}"][1] == 5
        time.sleep(max(0.0, 20 - (time.monotonic() - sent)))
        assert all(r.first_data is None for r in replies)  # nothing answered yet
        fleet.add_worker(*WORKER)
        for thread in threads:
            thread.join(timeout=240)
        assert not any(thread.is_alive() for thread in threads)
        for body, reply in zip(bodies, replies, strict=True):
            assert reply.status == 200, reply.text
            if body["stream"]:
                assert reply.headers["content-type"].startswith("text/event-stream")
                # a comment every 5 s while held (20 s without a worker, then its load)
                assert len(reply.comments) >= 3, reply.text
                assert reply.first_data is not None and reply.comments[-1] < reply.first_data
                events = [json.loads(line[6:]) for line in reply.text.splitlines()
                          if line.startswith("data: ")]
                assert events[-1]["stop"] is True and "error" not in events[-1]
            else:
                answer = json.loads(reply.text)
                assert answer["tokens_predicted"] == 6 and answer["content"]
        after = fleet_series(api)
        assert after[f"llamaq:cold_start_waiting{{{model}}}"][1] == 0
        assert after[f"llamaq:queue_depth{{{model}}}"][1] == 0
        assert after[f"llamaq:cold_start_timeouts_total{{{model}}}"][1] == 0
        assert httpx.get(f"{api}/health").status_code == 200
    finally:
        fleet.stop()


def test_no_worker_in_time_is_503_with_retry_after(redis_url: str, workdir: Path,
                                                    gemma_path: Path) -> None:
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma-never")
    try:
        api = fleet.add_api("--metrics", "--cold-start-timeout", "6")
        started = time.monotonic()
        plain, stream = Reply(), Reply()
        threads = [threading.Thread(target=send, args=(api, body, reply), daemon=True)
                   for body, reply in (({"prompt": "Hi", "n_predict": 4}, plain),
                                       ({"prompt": "Hi", "n_predict": 4, "stream": True},
                                        stream))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert 6 <= time.monotonic() - started < 30
        assert plain.status == 503 and plain.headers["retry-after"].isdigit()
        error = json.loads(plain.text)["error"]
        assert error["code"] == 503 and error["type"] == "unavailable_error"
        assert "--cold-start-timeout" in error["message"]
        # the stream opened at once: a comment, then the error as its event
        assert stream.status == 200 and len(stream.comments) >= 1
        last = json.loads(next(line for line in reversed(stream.text.splitlines())
                               if line.startswith(("data: ", "error: ")))
                          .split(": ", 1)[1])
        assert last["error"]["code"] == 503, stream.text
        found = fleet_series(api)
        model = 'model="gemma-never"'
        assert found[f"llamaq:cold_start_timeouts_total{{{model}}}"][1] == 2
        assert found[f"llamaq:cold_start_waiting{{{model}}}"][1] == 0
        assert found[f"llamaq:queue_depth{{{model}}}"][1] == 0  # the jobs left the queue
    finally:
        fleet.stop()


def test_without_a_hold_the_wait_is_the_timeouts(redis_url: str, workdir: Path,
                                                 gemma_path: Path) -> None:
    """--cold-start-timeout 0: no hold, the request waits up to --timeout as before (no
    comment, no cold-start error); /ready is 200 all along."""
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma-nohold")
    try:
        api = fleet.add_api("--cold-start-timeout", "0", "--timeout", "3")
        assert httpx.get(f"{api}/ready").status_code == 200
        started = time.monotonic()
        answer = httpx.post(f"{api}/completion", json={"prompt": "Hi", "n_predict": 2},
                            timeout=30)
        # --timeout ends it (no worker took it: 503, tests/fleet/queue/test_timeout.py), not a
        # cold-start hold
        assert 3 <= time.monotonic() - started < 20
        assert answer.status_code == 503 and "cold-start" not in answer.text
        assert "(--timeout)" in answer.json()["error"]["message"]
    finally:
        fleet.stop()


def test_a_router_holds_a_model_for_its_own_worker(tmp_path: Path) -> None:
    """The Kubernetes shape (deploy/kubernetes): a router whose workers are each one model's
    own (-m, no worker that could load models), the model's worker scaled to zero: a request
    is held (not llama-server's 503 "every worker was started with -m") and answered once a
    worker of that model starts."""
    models = tmp_path / "models"
    models.mkdir()
    write_tiny_llama(models / "tiny.gguf")
    redis_process, redis_url = start_redis(tmp_path / "redis")
    fleet = Fleet(redis_url, tmp_path, ["--store-url", str(tmp_path / "store")],
                  logs=tmp_path / "logs")
    try:
        url = fleet.add_api("--models-dir", str(models), "--no-models-autoload", "--metrics",
                            "--cold-start-timeout", "120")
        assert httpx.get(f"{url}/ready").status_code == 200
        reply = Reply()
        thread = threading.Thread(target=send, args=(
            url, {"model": "tiny", "prompt": "a", "n_predict": 3}, reply), daemon=True)
        thread.start()
        wait_until(lambda: fleet_series(url)['llamaq:cold_start_waiting{model="tiny"}'][1]
                   == 1, timeout=20, what="the request held")
        fleet.add_worker("-m", str(models / "tiny.gguf"), "--alias", "tiny", "-c", "256",
                         "-np", "1", "-t", "1")
        thread.join(timeout=120)
        assert reply.status == 200, reply.text
        assert json.loads(reply.text)["tokens_predicted"] == 3
    finally:
        fleet.stop()
        redis_process.terminate()
        redis_process.wait()


def test_a_chat_waits_for_its_worker_before_its_job_exists(redis_url: str, workdir: Path,
                                                          gemma_path: Path) -> None:
    """A chat is rendered with its worker's template, so it waits for a worker before its
    job exists: counted as held (not in queue_depth); a chat stream opens at its first
    waiting comment; both are answered once the worker is there."""
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma-chat-cold")
    try:
        api = fleet.add_api("--metrics", "--cold-start-timeout", "120")
        answers: list[httpx.Response] = []
        chat = {"max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
        plain = threading.Thread(target=lambda: answers.append(httpx.post(
            f"{api}/v1/chat/completions", timeout=180, json=chat)), daemon=True)
        streamed = Reply()

        def stream() -> None:
            with httpx.stream("POST", f"{api}/v1/chat/completions", timeout=180,
                              json={**chat, "stream": True}) as response:
                streamed.status = response.status_code
                for line in response.iter_lines():
                    streamed.text += line + "\n"
                    if line == COMMENT:
                        streamed.comments.append(time.monotonic())
                    elif line.startswith("data: ") and streamed.first_data is None:
                        streamed.first_data = time.monotonic()

        threads = [plain, threading.Thread(target=stream, daemon=True)]
        sent = time.monotonic()
        for thread in threads:
            thread.start()
        model = 'model="gemma-chat-cold"'
        wait_until(lambda: fleet_series(api)[f"llamaq:cold_start_waiting{{{model}}}"][1] == 2,
                   timeout=20, what="the chats held")
        assert fleet_series(api)[f"llamaq:queue_depth{{{model}}}"][1] == 0
        wait_until(lambda: streamed.comments, timeout=20, what="the stream's first comment")
        assert streamed.status == 200 and time.monotonic() - sent < 15
        fleet.add_worker(*WORKER)
        for thread in threads:
            thread.join(timeout=180)
        assert answers and answers[0].status_code == 200, answers
        assert answers[0].json()["choices"][0]["message"]["content"]
        assert streamed.first_data is not None and streamed.comments[-1] < streamed.first_data
        assert streamed.text.rstrip().endswith("data: [DONE]"), streamed.text
        assert fleet_series(api)[f"llamaq:cold_start_waiting{{{model}}}"][1] == 0
    finally:
        fleet.stop()


def test_a_chat_stream_held_past_the_timeout_ends_with_its_error_event(
        redis_url: str, workdir: Path, gemma_path: Path) -> None:
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma-chat-never")
    try:
        api = fleet.add_api("--cold-start-timeout", "7")
        with httpx.stream("POST", f"{api}/v1/chat/completions", timeout=60, json={
                "max_tokens": 4, "stream": True,
                "messages": [{"role": "user", "content": "Hi"}]}) as response:
            assert response.status_code == 200
            lines = list(response.iter_lines())
        assert COMMENT in lines
        error = json.loads(next(x for x in lines if x.startswith("data: "))[6:])["error"]
        assert error["code"] == 503 and "--cold-start-timeout" in error["message"], lines
    finally:
        fleet.stop()


MESSAGES = ("/v1/messages", {"max_tokens": 4, "stream": True,
                             "messages": [{"role": "user", "content": "Hi"}]})
RESPONSES = ("/v1/responses", {"max_output_tokens": 4, "stream": True, "input": "Hi"})


def stream_into(api: str, path: str, body: dict[str, object], reply: Reply) -> None:
    with httpx.stream("POST", f"{api}{path}", timeout=180, json=body) as response:
        reply.status = response.status_code
        for line in response.iter_lines():
            reply.text += line + "\n"
            if line == COMMENT:
                reply.comments.append(time.monotonic())
            elif line.startswith("data: ") and reply.first_data is None:
                reply.first_data = time.monotonic()


def test_messages_and_responses_streams_wait_with_comments(redis_url: str, workdir: Path,
                                                           gemma_path: Path) -> None:
    """The Anthropic and Responses streams, held for a cold start as a chat stream is: open
    at their first waiting comment, then their events once a worker is there."""
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma-apis-cold")
    try:
        api = fleet.add_api("--metrics", "--cold-start-timeout", "120")
        replies = [Reply(), Reply()]
        threads = [threading.Thread(target=stream_into, args=(api, path, body, reply),
                                    daemon=True)
                   for (path, body), reply in zip((MESSAGES, RESPONSES), replies, strict=True)]
        sent = time.monotonic()
        for thread in threads:
            thread.start()
        model = 'model="gemma-apis-cold"'
        wait_until(lambda: fleet_series(api)[f"llamaq:cold_start_waiting{{{model}}}"][1] == 2,
                   timeout=20, what="the two streams held")
        wait_until(lambda: all(r.comments for r in replies), timeout=20,
                   what="each stream's first comment")
        assert all(r.status == 200 for r in replies) and time.monotonic() - sent < 15
        fleet.add_worker(*WORKER)
        for thread in threads:
            thread.join(timeout=180)
        for reply in replies:
            assert reply.first_data is not None and reply.comments[-1] < reply.first_data
        assert "event: message_stop" in replies[0].text, replies[0].text
        assert "response.completed" in replies[1].text, replies[1].text
        assert "error" not in replies[0].text + replies[1].text
    finally:
        fleet.stop()


def test_messages_and_responses_streams_past_the_timeout_end_with_their_error_events(
        redis_url: str, workdir: Path, gemma_path: Path) -> None:
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma-apis-never")
    try:
        api = fleet.add_api("--cold-start-timeout", "7")
        replies = [Reply(), Reply()]
        threads = [threading.Thread(target=stream_into, args=(api, path, body, reply),
                                    daemon=True)
                   for (path, body), reply in zip((MESSAGES, RESPONSES), replies, strict=True)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        for reply in replies:
            assert reply.status == 200 and reply.comments, reply.text
        messages, responses = ([line for line in r.text.splitlines() if line] for r in replies)
        # Anthropic's named `error` event, its error object in the spec's shape
        assert messages[-2] == "event: error", messages
        error = json.loads(messages[-1][6:])
        assert error["type"] == "error" and error["error"]["code"] == 503
        assert "--cold-start-timeout" in error["error"]["message"]
        error = json.loads(responses[-1][6:])["error"]
        assert error["code"] == 503 and "--cold-start-timeout" in error["message"], responses
    finally:
        fleet.stop()
