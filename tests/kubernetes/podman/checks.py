"""scripts/kube-test's checks against the played `embedded` overlay, from this machine (the
api pod's address on podman's network): readiness without workers, a completion and a stream
through the api, a worker pod stopped while it streams (its drain: the stream ends normally),
and a request held with no worker, answered once the worker pod starts again (scale from zero,
with the pod started by hand where KEDA would)."""

from __future__ import annotations

import argparse
import json
import subprocess
import threading
import time
from collections.abc import Callable

import httpx

MODEL = "gemma-3-270m"


def say(text: str) -> None:
    print(f"[kube-test] {text}", flush=True)


def wait(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit(f"[kube-test] FAIL: {what} within {timeout:g} s")


def series(client: httpx.Client, name: str) -> float:
    text = client.get("/fleet/metrics").text
    for line in text.splitlines():
        if line.split(" ")[0] == name:
            return float(line.split(" ")[1])
    raise KeyError(name)


def stream(client: httpx.Client, body: dict[str, object], on_first: Callable[[], None]
           ) -> tuple[list[dict[str, object]], list[str]]:
    """A streamed chat: its chunks, and its comment lines."""
    chunks, comments = [], []
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True},
                       timeout=300) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith(":"):
                comments.append(line)
            elif line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
                if len(chunks) == 1:
                    on_first()
    return chunks, comments


def text_of(chunks: list[dict[str, object]]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or ""  # type: ignore[index]
                   for c in chunks if c.get("choices"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--api", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--worker", required=True,
                        help="the worker pod's container (stopped, as a deleted pod's is, "
                        "while its pod's network stays up: `podman pod stop` would take the "
                        "network down at once, which Kubernetes does only after the drain)")
    args = parser.parse_args()
    client = httpx.Client(base_url=args.api, timeout=120,
                          headers={"Authorization": f"Bearer {args.key}"})
    workers = f'llamaq:workers{{model="{MODEL}",state="idle"}}'

    wait(lambda: client.get("/ready").status_code == 200, 120, "the api pod ready")
    say("api /ready 200")
    wait(lambda: series(client, workers) >= 1, 600, "a worker of the model registered")
    say("worker registered (its readiness: model loaded)")

    answer = client.post("/completion", json={"model": MODEL, "prompt": "The capital of France",
                                              "n_predict": 8})
    assert answer.status_code == 200 and answer.json()["tokens_predicted"] == 8, answer.text
    say(f"completion: {answer.json()['content']!r}")
    chunks, _ = stream(client, {"model": MODEL, "max_tokens": 12,
                                "messages": [{"role": "user", "content": "Say hello"}]},
                       lambda: None)
    assert chunks[-1]["choices"] == [] or chunks[-1]["choices"][0]["finish_reason"]  # type: ignore[index]
    say(f"stream: {text_of(chunks)!r}")

    stopped: list[float] = []

    def stop_worker() -> None:
        def run() -> None:
            stopped.append(time.monotonic())
            subprocess.run(["podman", "stop", "-t", "60", args.worker], check=True,
                           capture_output=True)
        threading.Thread(target=run, daemon=True).start()

    chunks, _ = stream(client, {"model": MODEL, "max_tokens": 48, "temperature": 0,
                                "messages": [{"role": "user", "content": "Tell a story"}]},
                       stop_worker)
    finals = [c for c in chunks if c.get("choices") and c["choices"][0]["finish_reason"]]  # type: ignore[index]
    assert finals and "error" not in chunks[-1], chunks[-3:]
    say(f"worker pod stopped mid-stream: the stream ended normally "
        f"({finals[-1]['choices'][0]['finish_reason']}, {len(chunks)} chunks: the drain)")  # type: ignore[index]
    wait(lambda: series(client, workers) == 0, 60, "the stopped worker gone from the registry")

    held: list[httpx.Response] = []  # a /completion stream (comments) and a chat
    completion: list[str] = []

    def completion_stream() -> None:
        with client.stream("POST", "/completion", timeout=600, json={
                "model": MODEL, "prompt": "Hello", "n_predict": 6, "stream": True}) as response:
            for line in response.iter_lines():
                completion.append(line)

    threads = [threading.Thread(target=completion_stream),
               threading.Thread(target=lambda: held.append(client.post(
                   "/v1/chat/completions", timeout=600, json={
                       "model": MODEL, "max_tokens": 6,
                       "messages": [{"role": "user", "content": "Hi"}]})))]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    waiting = f'llamaq:cold_start_waiting{{model="{MODEL}"}}'
    wait(lambda: series(client, waiting) == 2, 30, "2 requests held with no worker")
    # a worker that starts again at once may answer before the first comment (every 5 s)
    wait(lambda: ": waiting for a worker" in completion, 30, "the held stream's first comment")
    say("no worker: 2 requests held (cold_start_waiting 2), the stream told it waits; "
        "starting the worker again")
    subprocess.run(["podman", "start", args.worker], check=True, capture_output=True)
    for thread in threads:
        thread.join(timeout=600)
    assert held and held[0].status_code == 200, held
    comments = completion.count(": waiting for a worker")
    assert comments and any(line.startswith("data: ") for line in completion), completion
    say(f"held requests answered {time.monotonic() - started:.1f} s after they were sent "
        f"(the stream after {comments} waiting comments)")


if __name__ == "__main__":
    main()
