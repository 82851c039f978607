"""Batch API benchmark (not a test), on 127.0.0.1 only:

1. scaling: an N-line /v1/embeddings batch (default 20,000 short sentences) on all-MiniLM-L6-v2,
   run once with 1 worker and once with 2 workers, each worker with 1 thread (`-t 1`) and pinned
   to a core of its own (sched_setaffinity right after the process starts, before it loads the
   model: every thread it makes inherits the core); the api and Redis are not pinned. Prints the
   wall time from create to `completed`, lines/s, and the ratio 2 workers / 1 worker.
2. priority: the median latency ("TTFT") of online requests sent one after another, without a
   batch and while a batch runs on the same worker(s): /v1/embeddings on MiniLM, and streamed
   /v1/chat/completions (time to the first content chunk) on Gemma 3 270M and on the tiny test
   GGUF, with a /v1/chat/completions batch.

    .venv/bin/python bench/batch.py [--lines 20000] [--online 40] [--skip-scaling]

Results go to bench/results/batch-<stamp>.md as well as stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from storage import default_model_path  # noqa: E402
from tests.processes import Fleet, start_redis  # noqa: E402

GEMMA_CACHE = Path.home() / ".cache" / "llamaq-tests"
MINILM = GEMMA_CACHE / "all-MiniLM-L6-v2-f32.gguf"
WORDS = ("sea", "mountain", "river", "city", "forest", "music", "bread", "engine", "garden",
         "winter", "letter", "planet", "window", "dog", "market", "bridge")


def sentence(i: int) -> str:
    words = [WORDS[(i * 7 + k * 3) % len(WORDS)] for k in range(6)]
    return f"Line {i}: the {words[0]} near the {words[1]} and a {words[2]} of {words[3]}."


def embedding_lines(n: int, prefix: str) -> bytes:
    return "".join(json.dumps({"custom_id": f"{prefix}{i}", "method": "POST",
                               "url": "/v1/embeddings",
                               "body": {"model": "minilm", "input": sentence(i)}}) + "\n"
                   for i in range(n)).encode()


def chat_lines(n: int) -> bytes:
    return "".join(json.dumps({"custom_id": f"c{i}", "method": "POST",
                               "url": "/v1/chat/completions",
                               "body": {"messages": [{"role": "user", "content": sentence(i)}],
                                        "max_tokens": 16}}) + "\n"
                   for i in range(n)).encode()


def submit(api: str, data: bytes, endpoint: str) -> str:
    uploaded = httpx.post(f"{api}/v1/files", data={"purpose": "batch"},
                          files={"file": ("lines.jsonl", data)}, timeout=300).json()
    batch = httpx.post(f"{api}/v1/batches", json={
        "input_file_id": uploaded["id"], "endpoint": endpoint, "completion_window": "24h"},
        timeout=60).json()
    return str(batch["id"])


def wait_done(api: str, batch_id: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch: dict[str, Any] = httpx.get(f"{api}/v1/batches/{batch_id}", timeout=60).json()
        if batch["status"] in ("completed", "failed", "cancelled", "expired"):
            return batch
        time.sleep(0.5)
    raise TimeoutError(f"batch {batch_id} not done in {timeout} s")


def fleet_of(redis_url: str, folder: Path, model: Path, alias: str, workers: int,
             worker_flags: list[str]) -> tuple[Fleet, str]:
    fleet = Fleet(redis_url, folder, ["-m", str(model), "--alias", alias, "--store-url",
                                      str(folder / "store"), "--cache-dir",
                                      str(folder / "cache")], logs=folder / f"logs-{alias}")
    cores = sorted(os.sched_getaffinity(0))
    for index in range(workers):
        process = fleet.add_worker(*worker_flags)
        os.sched_setaffinity(process.pid, {cores[index % len(cores)]})
    api = fleet.add_api()
    fleet.wait_healthy(api, timeout=120)
    deadline = time.monotonic() + 60
    while len(httpx.get(f"{api}/slots").json()) < workers * int(
            worker_flags[worker_flags.index("-np") + 1]) and time.monotonic() < deadline:
        time.sleep(0.2)
    return fleet, api


def scaling(redis_url: str, folder: Path, lines: int, report: list[str]) -> None:
    data = embedding_lines(lines, "s")
    times: dict[int, float] = {}
    for workers in (1, 2):
        fleet, api = fleet_of(redis_url, folder / f"scale{workers}", MINILM, f"minilm-{workers}",
                              workers, ["--embedding", "-t", "1", "-np", "8", "-c", "2048"])
        try:
            started = time.monotonic()
            batch = wait_done(api, submit(api, data, "/v1/embeddings"), timeout=3600)
            times[workers] = time.monotonic() - started
            counts = batch["request_counts"]
            assert batch["status"] == "completed" and counts["completed"] == lines, batch
            line = (f"| {workers} worker(s) x 1 thread | {lines} | {times[workers]:.1f} s | "
                    f"{lines / times[workers]:.1f} |")
            print(line, flush=True)
            report.append(line)
        finally:
            fleet.stop()
    ratio = times[2] / times[1]
    report.append(f"\ntime with 2 workers / time with 1 worker: **{ratio:.2f}** "
                  f"(target <= 0.6)\n")
    print(report[-1], flush=True)


def online_latencies(send: Any, n: int) -> list[float]:
    out = []
    for i in range(n):
        out.append(send(i))
        time.sleep(0.05)
    return out


def embed_once(api: str) -> Any:
    def send(i: int) -> float:
        started = time.monotonic()
        response = httpx.post(f"{api}/v1/embeddings", json={"input": f"online query {i}"},
                              timeout=120)
        assert response.status_code == 200, response.text
        return time.monotonic() - started
    return send


def chat_ttft(api: str) -> Any:
    def send(i: int) -> float:
        started = time.monotonic()
        body = {"messages": [{"role": "user", "content": f"online {i}"}], "max_tokens": 4,
                "stream": True}
        with httpx.stream("POST", f"{api}/v1/chat/completions", json=body,
                          timeout=120) as response:
            for line in response.iter_lines():
                if line.startswith("data: ") and '"content"' in line:
                    return time.monotonic() - started
        return time.monotonic() - started
    return send


def priority(api: str, send: Any, batch_data: bytes, endpoint: str, n: int, label: str,
             report: list[str]) -> None:
    send(-1)  # warm-up
    alone = online_latencies(send, n)
    batch_id = submit(api, batch_data, endpoint)
    while httpx.get(f"{api}/v1/batches/{batch_id}").json()["status"] != "in_progress":
        time.sleep(0.1)
    time.sleep(1.0)  # the batch's lines fill the worker
    loaded: list[float] = []
    sampler = threading.Thread(target=lambda: loaded.extend(online_latencies(send, n)))
    sampler.start()
    sampler.join()
    batch = httpx.get(f"{api}/v1/batches/{batch_id}").json()
    still_running = batch["status"] == "in_progress"
    httpx.post(f"{api}/v1/batches/{batch_id}/cancel")
    wait_done(api, batch_id, timeout=300)
    after = online_latencies(send, n)  # the machine's load drifts: a baseline on each side
    a, b = statistics.median(alone + after), statistics.median(loaded)
    line = (f"| {label} | {statistics.median(alone) * 1000:.1f} / "
            f"{statistics.median(after) * 1000:.1f} ms | {b * 1000:.1f} ms | {b / a:.2f} | "
            f"{'yes' if still_running else 'NO (ended first)'} |")
    print(line, flush=True)
    report.append(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=20000)
    parser.add_argument("--online", type=int, default=40)
    parser.add_argument("--skip-scaling", action="store_true")
    parser.add_argument("--priority", default="minilm,gemma,tiny",
                        help="which online-latency cases to run (comma-separated; '' for none)")
    args = parser.parse_args()
    if not MINILM.is_file():
        sys.exit(f"{MINILM} is missing: run the tests' minilm fixture once (pytest -k minilm)")
    from tests.tiny_gguf import write_tiny_llama

    report = [f"# Batch API benchmark ({time.strftime('%Y-%m-%d %H:%M:%S')}, "
              f"{os.cpu_count()} CPUs)\n"]
    with tempfile.TemporaryDirectory(prefix="llamaq-bench-batch-") as tmp:
        folder = Path(tmp)
        redis, redis_url = start_redis(folder / "redis")
        try:
            if not args.skip_scaling:
                report += ["## Scaling: one /v1/embeddings batch (MiniLM)\n",
                           "| fleet | lines | wall time | lines/s |", "|---|---|---|---|"]
                scaling(redis_url, folder, args.lines, report)
            report += ["## Online latency while a batch runs (same workers)\n",
                       "| online requests | median alone (before / after) | median with batch "
                       "| ratio | batch still running |", "|---|---|---|---|---|"]
            cases = args.priority.split(",")
            if "minilm" in cases:
                fleet, api = fleet_of(redis_url, folder / "prio-e", MINILM, "minilm-prio", 1,
                                      ["--embedding", "-t", "1", "-np", "8", "-c", "2048"])
                try:
                    priority(api, embed_once(api), embedding_lines(50000, "p"),
                             "/v1/embeddings", args.online, "/v1/embeddings (MiniLM)", report)
                finally:
                    fleet.stop()
            models = [(name, model) for case, name, model in (
                ("gemma", "Gemma 3 270M", default_model_path(GEMMA_CACHE)),
                ("tiny", "tiny GGUF", write_tiny_llama(folder / "tiny.gguf"))) if case in cases]
            for name, model in models:
                fleet, api = fleet_of(redis_url, folder / f"prio-{len(report)}", model,
                                      f"chat-prio-{len(report)}", 1,
                                      ["-t", "1", "-np", "4", "-c", "4096"])
                try:
                    priority(api, chat_ttft(api), chat_lines(20000), "/v1/chat/completions",
                             args.online, f"streamed chat TTFT ({name})", report)
                finally:
                    fleet.stop()
        finally:
            redis.terminate()
    results = REPO / "bench" / "results"
    results.mkdir(exist_ok=True)
    path = results / f"batch-{time.strftime('%Y%m%d-%H%M%S')}.md"
    path.write_text("\n".join(report) + "\n")
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
