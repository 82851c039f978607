"""The client-side checks of scripts/compose-test, against a fleet that compose brought up.

    python docker/test/compose_checks.py --base http://127.0.0.1:PORT --n-parallel N \
        --redis CONTAINER --workers CONTAINER,CONTAINER [--drain | --no-drain]

Each check prints the seconds it took; the first failure raises (non-zero exit).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
from openai import OpenAI
from openai.types.chat import ChatCompletionMessageParam

from scheduler.contract import keys

TIMEOUT_S = 180.0


@contextmanager
def step(name: str) -> Iterator[None]:
    started = time.monotonic()
    print(f"[compose-test] {name} ...", flush=True)
    yield
    print(f"[compose-test] {name}: ok in {time.monotonic() - started:.1f} s", flush=True)


def wait_for(what: str, ready: Callable[[], bool], timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(0.5)


def podman(*args: str, timeout_s: float = 120.0) -> str:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout_s,
                          check=False)
    if done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {done.returncode} {done.stderr.strip()}")
    return done.stdout.strip()


def check_chat(base: str, model: str) -> None:
    client = OpenAI(base_url=f"{base}/v1", api_key="compose-test", max_retries=0,
                    timeout=TIMEOUT_S)
    messages: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "Name three colours."}]
    with step("openai chat request"):
        reply = client.chat.completions.create(model=model, messages=messages, max_tokens=24,
                                               temperature=0)
        choice = reply.choices[0]
        assert choice.message.content, reply
        assert choice.finish_reason in ("stop", "length"), reply
        assert reply.usage is not None and reply.usage.completion_tokens > 0, reply
    with step("openai chat stream"):
        stream = client.chat.completions.create(model=model, messages=messages, max_tokens=24,
                                                temperature=0, stream=True)
        pieces: list[str] = []
        finish: str | None = None
        for chunk in stream:
            if chunk.choices:
                pieces.append(chunk.choices[0].delta.content or "")
                finish = chunk.choices[0].finish_reason or finish
        assert "".join(pieces), pieces
        assert finish in ("stop", "length"), finish


def check_slots(base: str, n_parallel: int) -> None:
    with step("/slots lists both workers' slots"):
        expected = list(range(2 * n_parallel))
        wait_for("the slots of two workers",
                 lambda: [s["id"] for s in httpx.get(f"{base}/slots").json()] == expected)


def check_snapshot(base: str, n_parallel: int) -> None:
    """Slot 0 is on the first worker, slot n_parallel on the second (fleet-wide slot ids)."""
    other = n_parallel
    prompt = "The old lighthouse keeper climbed the stairs every night to " * 4
    body = {"prompt": prompt, "n_predict": 4, "temperature": 0}
    with step(f"save slot 0 (worker 1), restore into slot {other} (worker 2) through S3"):
        first = httpx.post(f"{base}/completion", json={**body, "id_slot": 0},
                           timeout=TIMEOUT_S).json()
        saved = httpx.post(f"{base}/slots/0?action=save", json={"filename": "compose.bin"},
                           timeout=TIMEOUT_S).json()
        assert saved.get("n_saved") == first["tokens_cached"] and saved["n_written"] > 0, saved
        restored = httpx.post(f"{base}/slots/{other}?action=restore",
                              json={"filename": "compose.bin"}, timeout=TIMEOUT_S).json()
        assert restored.get("n_restored") == saved["n_saved"], restored
        again = httpx.post(f"{base}/completion", json={**body, "id_slot": other},
                           timeout=TIMEOUT_S).json()
        assert again["id_slot"] == other, again
        assert again["timings"]["cache_n"] == again["tokens_evaluated"] - 1, again["timings"]
        assert again["content"] == first["content"], (again["content"], first["content"])


@dataclass
class Worker:
    container: str
    worker_id: str
    started_at: float


def workers_in_slot_order(redis: str, containers: list[str]) -> list[Worker]:
    """The worker containers in the order the api numbers their slots (registry order)."""
    found = []
    for container in containers:
        worker_id = podman("exec", container, "cat", "/tmp/llamaq-worker-id")
        info = json.loads(podman("exec", redis, "redis-cli", "--no-auth-warning", "GET",
                                 keys.worker_info(worker_id)))
        found.append(Worker(container, worker_id, float(info["started_at"])))
    return sorted(found, key=lambda w: (w.started_at, w.worker_id))


@dataclass
class StreamEnd:
    tokens: int = 0
    last: dict[str, object] | None = None
    errors: list[str] | None = None


def stream_completion(base: str, body: dict[str, object], on_first: Callable[[], None]
                      ) -> StreamEnd:
    end = StreamEnd(errors=[])
    assert end.errors is not None
    with httpx.stream("POST", f"{base}/completion", json={**body, "stream": True},
                      timeout=TIMEOUT_S) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if not line or line.startswith(("id:", ":")):  # event ids and pings
                continue
            if not line.startswith("data: "):
                end.errors.append(line)
                continue
            event = json.loads(line.removeprefix("data: "))
            if "error" in event:
                end.errors.append(line)
                continue
            end.tokens += 1
            end.last = event
            if end.tokens == 1:
                on_first()
    return end


def check_drain(base: str, n_parallel: int, redis: str, containers: list[str],
                drain: bool) -> None:
    """A stream on the stopped worker: with drain it ends normally; a new request is served by
    the other worker; the stopped worker leaves /slots."""
    name = "stop worker 2 while it streams" + (" (drain)" if drain else " (no drain in build)")
    with step(name):
        second = workers_in_slot_order(redis, containers)[1]
        stop_took: list[float] = []

        def stop() -> None:
            started = time.monotonic()
            podman("stop", "-t", "60", second.container, timeout_s=120)
            stop_took.append(time.monotonic() - started)

        stopper = threading.Thread(target=stop)
        body = {"prompt": "Once upon a time", "n_predict": 96, "ignore_eos": True,
                "temperature": 0, "id_slot": n_parallel}
        end = stream_completion(base, body, stopper.start)
        assert end.tokens > 0, end
        stopper.join(timeout=120)
        assert stop_took, "podman stop did not return"
        print(f"[compose-test]   stream: {end.tokens} events, errors {end.errors}, "
              f"last {json.dumps(end.last)[:200] if end.last else None}; "
              f"podman stop took {stop_took[0]:.1f} s", flush=True)
        if drain:
            assert not end.errors, end.errors
            assert end.last is not None and end.last.get("stop") is True, end.last
            assert end.last.get("stop_type") == "limit", end.last
            assert stop_took[0] < 45, f"the drain took {stop_took[0]:.1f} s"
        else:
            assert end.errors or (end.last is not None and end.last.get("stop") is True), end
        state = podman("inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", second.container)
        print(f"[compose-test]   stopped worker: {state}", flush=True)
        wait_for("/slots without the stopped worker's slots",
                 lambda: len(httpx.get(f"{base}/slots").json()) == n_parallel, timeout_s=30)
        after = httpx.post(f"{base}/completion", json={"prompt": "Hello", "n_predict": 4},
                           timeout=TIMEOUT_S)
        assert after.status_code == 200, after.text
        # a scale-down removes the stopped container; left stopped, podman 4.3's restart
        # policy may bring it back while `down` runs
        podman("rm", "-f", second.container)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", required=True)
    parser.add_argument("--n-parallel", type=int, required=True)
    parser.add_argument("--redis", required=True, help="the redis container")
    parser.add_argument("--workers", required=True, help="the two worker containers, a,b")
    parser.add_argument("--drain", action=argparse.BooleanOptionalAction, required=True)
    args = parser.parse_args()
    model = httpx.get(f"{args.base}/v1/models").json()["data"][0]["id"]
    check_chat(args.base, model)
    check_slots(args.base, args.n_parallel)
    check_snapshot(args.base, args.n_parallel)
    check_drain(args.base, args.n_parallel, args.redis, args.workers.split(","), args.drain)


if __name__ == "__main__":
    main()
