"""Backpressure load run (not a test: too slow for CI on small machines): 300 concurrent
streams against one worker (-np 4) for at most 3 minutes, on 127.0.0.1.

    .venv/bin/python bench/backpressure.py [--clients 300] [--seconds 180] [--np 4]

Each client sends streamed requests one after another until the time is up, honouring
Retry-After when refused. Checks and prints: no 5xx other than 503 with Retry-After; every
accepted request completed (final event); api and worker RSS growth from the first to the last
minute (< 10 %). Exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from storage import default_model_path  # noqa: E402
from tests.processes import Fleet, start_redis  # noqa: E402


@dataclass
class Counts:
    accepted: int = 0
    completed: int = 0
    refused: int = 0
    bad: Counter[str] = field(default_factory=Counter)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def client(http: httpx.AsyncClient, api: str, n: int, until: float,
                 counts: Counts) -> None:
    body = {"prompt": f"Client {n} story:", "n_predict": 16, "stream": True}
    while time.monotonic() < until:
        try:
            async with http.stream("POST", f"{api}/completion", json=body) as response:
                if response.status_code == 503 and "retry-after" in response.headers:
                    counts.refused += 1
                    await response.aread()
                    await asyncio.sleep(float(response.headers["retry-after"]))
                    continue
                if response.status_code != 200:
                    counts.bad[f"status {response.status_code}"] += 1
                    await response.aread()
                    continue
                counts.accepted += 1
                async for line in response.aiter_lines():
                    if line.startswith("data: ") and json.loads(line[6:]).get("stop"):
                        counts.completed += 1
        except httpx.HTTPError as error:
            counts.bad[type(error).__name__] += 1


async def load(api: str, clients: int, seconds: float, pids: dict[str, int]) -> tuple[
        Counts, dict[str, tuple[int, int]]]:
    counts = Counts()
    started = time.monotonic()
    until = started + seconds
    limits = httpx.Limits(max_connections=clients + 10)
    async with httpx.AsyncClient(timeout=300, limits=limits) as http:
        tasks = [asyncio.create_task(client(http, api, n, until, counts))
                 for n in range(clients)]
        await asyncio.sleep(min(60.0, seconds / 3))
        first = {name: rss_kib(pid) for name, pid in pids.items()}
        await asyncio.gather(*tasks)
    last = {name: rss_kib(pid) for name, pid in pids.items()}
    return counts, {name: (first[name], last[name]) for name in pids}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=180)
    parser.add_argument("--np", type=int, default=4, dest="n_slots")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="llamaq-load-"))
    redis_process, redis_url = start_redis(workdir / "redis")
    model = default_model_path(Path.home() / ".cache" / "llamaq-tests")
    fleet = Fleet(redis_url, workdir, ["-m", str(model), "--alias", "bench-load", "--store-url",
                                       str(workdir / "store"), "--cache-dir",
                                       str(workdir / "cache")], logs=workdir / "logs")
    try:
        worker = fleet.add_worker("-c", str(512 * args.n_slots), "-np", str(args.n_slots))
        api = fleet.add_api()
        fleet.wait_healthy(api)
        pids = {"worker": worker.pid, "api": fleet.processes[-1].pid}
        counts, rss = asyncio.run(load(api, args.clients, args.seconds, pids))
    finally:
        fleet.stop()
        redis_process.terminate()
        redis_process.wait()
    growth = {name: (last - first) / first for name, (first, last) in rss.items()}
    print(f"accepted {counts.accepted}, completed {counts.completed}, refused (503 + "
          f"Retry-After) {counts.refused}, other failures {dict(counts.bad)}")
    for name, (first, last) in rss.items():
        print(f"{name} RSS {first / 1024:.0f} MiB -> {last / 1024:.0f} MiB "
              f"({growth[name] * 100:+.1f} %)")
    ok = (not counts.bad and counts.completed == counts.accepted
          and all(g < 0.10 for g in growth.values()))
    print("OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
