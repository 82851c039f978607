"""Fault scenarios under load (not timed tests): each prints requests sent / answered /
errored / lost (lost must be 0) and the p99 time from the fault to the error event.

    .venv/bin/python bench/faults.py redis-restart [--clients 8] [--outage 15] [--duration 40]

A scenario is a function in SCENARIOS taking the parsed flags and returning a Tally; add new
ones there (e.g. the worker SIGKILL loop).

- redis-restart: one worker (-np 4) and one api pod on a Redis of their own; `--clients`
  threads stream completions back to back; Redis is killed (its data with it) after 5 s and
  started again `--outage` s later; the load goes on until `--duration`. Answered: a final
  event; errored: an SSE error event or a 503 with Retry-After; lost: anything else (a
  dropped connection, another status, no answer within 60 s). Processes that exited are
  reported too (must be none).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from storage import default_model_path
from tests.processes import Fleet
from tests.redis_server import RestartableRedis


@dataclass
class Tally:
    sent: int = 0
    answered: int = 0
    errored: int = 0
    lost: int = 0
    to_error_s: list[float] = field(default_factory=list)
    exited: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, outcome: str) -> None:
        with self.lock:
            setattr(self, outcome, getattr(self, outcome) + 1)

    def p99_to_error(self) -> float | None:
        if not self.to_error_s:
            return None
        ordered = sorted(self.to_error_s)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]

    def report(self, name: str) -> str:
        p99 = self.p99_to_error()
        return (f"{name}: sent {self.sent}, answered {self.answered}, errored {self.errored}, "
                f"lost {self.lost}; p99 time to the error event "
                f"{'-' if p99 is None else f'{p99:.2f} s'}; processes exited: "
                f"{', '.join(self.exited) or 'none'}")


def stream_once(url: str, tally: Tally, fault_at: list[float]) -> None:
    """One streamed completion, counted by how it ended."""
    body = {"prompt": "Tell a story:", "n_predict": 64, "ignore_eos": True, "stream": True}
    with tally.lock:
        tally.sent += 1
    try:
        with httpx.stream("POST", f"{url}/completion", json=body, timeout=60) as response:
            if response.status_code == 503 and response.headers.get("Retry-After"):
                tally.add("errored")
                return
            if response.status_code != 200:
                tally.add("lost")
                return
            last = ""
            for line in response.iter_lines():
                if line.startswith("data: "):
                    last = line
        if '"error"' in last:
            if fault_at:
                with tally.lock:
                    tally.to_error_s.append(time.monotonic() - fault_at[0])
            tally.add("errored")
        elif '"stop":true' in last:
            tally.add("answered")
        else:
            tally.add("lost")
    except httpx.HTTPError:
        tally.add("lost")


def redis_restart(args: argparse.Namespace) -> Tally:
    tally = Tally()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        redis = RestartableRedis(folder / "redis")
        redis.start()
        model = default_model_path(Path.home() / ".cache" / "llamaq-tests")
        fleet = Fleet(redis.url, folder, ["-m", str(model), "--alias", "gemma",
                                          "--store-url", str(folder / "store"),
                                          "--cache-dir", str(folder / "cache")], folder / "logs")
        try:
            fleet.add_worker("-c", "4096", "-np", "4", "-t", "2")
            url = fleet.add_api()
            fleet.wait_healthy(url, timeout=120)
            fault_at: list[float] = []
            start = time.monotonic()

            def client() -> None:
                while time.monotonic() - start < args.duration:
                    stream_once(url, tally, fault_at)
                    if fault_at and time.monotonic() - fault_at[0] < args.outage:
                        time.sleep(0.5)  # a client told to retry later waits a little

            threads = [threading.Thread(target=client) for _ in range(args.clients)]
            for thread in threads:
                thread.start()
            time.sleep(5)
            fault_at.append(time.monotonic())
            redis.kill()
            time.sleep(args.outage)
            redis.start()
            for thread in threads:
                thread.join()
            tally.exited = [f"pid {p.pid} (exit {p.returncode})" for p in fleet.processes
                            if p.poll() is not None]
        finally:
            fleet.stop()
            redis.kill()
    return tally


SCENARIOS: dict[str, Callable[[argparse.Namespace], Tally]] = {
    "redis-restart": redis_restart,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenarios", nargs="*", default=list(SCENARIOS),
                        help=f"which to run: {', '.join(SCENARIOS)} (default: all)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--outage", type=float, default=15.0)
    parser.add_argument("--duration", type=float, default=40.0)
    args = parser.parse_args(argv)
    failed = False
    for name in args.scenarios:
        tally = SCENARIOS[name](args)
        print(tally.report(name), flush=True)
        failed |= tally.lost > 0 or bool(tally.exited)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
