"""Fault benchmark (not a test): named scenarios run in a loop against a real fleet on
127.0.0.1, each printing requests sent / answered / errored / lost (lost must be 0) and the p99
time from the fault to a client's error event.

    .venv/bin/python bench/faults.py [--scenario worker-sigkill] [--rounds 20]
                                     [--np 8] [--streams 16]
    .venv/bin/python bench/faults.py --scenario redis-restart --rounds 3 [--outage 15]
    .venv/bin/python bench/faults.py --scenario worker-migrate [--rounds 20] [--kill-every 10]

Scenarios live in SCENARIOS (name -> function); a scenario gets a running fleet and one round's
parameters and returns what its clients saw.

- worker-sigkill: streams on two workers; one is SIGKILLed mid-stream; a new one joins.
- worker-migrate (issue 26): greedy streams on two workers; one is SIGKILLed every
  `--kill-every` seconds (a replacement starts at once, as `llamaq up` restarts one): with
  --migration-limit (the api's, default 3) every stream must end with its answer. Prints
  errored (target 0), lost, how many greedy texts equal their undisturbed run (run once
  before the rounds) and the p99 stall (the longest gap between two tokens of a stream,
  across the death).
- redis-restart: streams running; Redis is killed (its data with it) and started again empty
  `--outage` seconds later; a request sent during the outage must get 503 with Retry-After;
  every stream must end with its answer or an error event, and the fleet must serve again.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from storage import default_model_path  # noqa: E402
from tests.faults import StreamRecord, slots_of, start_streams  # noqa: E402
from tests.processes import Fleet, wait_until  # noqa: E402
from tests.redis_server import RestartableRedis  # noqa: E402


@dataclass
class Bench:
    """A fleet for one scenario: one api, workers with `np` slots each."""

    fleet: Fleet
    api: str
    worker_flags: tuple[str, ...]
    streams: int
    redis: RestartableRedis
    outage_s: float = 15.0
    kill_every_s: float = 10.0
    reference: list[str] = field(default_factory=list)
    """worker-migrate: each stream's undisturbed greedy text."""


@dataclass
class Tally:
    sent: int = 0
    answered: int = 0
    errored: int = 0
    lost: int = 0
    to_error_s: list[float] = field(default_factory=list)
    stalls_s: list[float] = field(default_factory=list)
    equal: int = 0
    compared: int = 0

    def add(self, records: list[StreamRecord], fault_at: float) -> None:
        for record in records:
            self.sent += 1
            outcome = record.outcome
            if outcome == "answered":
                self.answered += 1
            elif outcome == "errored":
                self.errored += 1
                if record.ended_at is not None:
                    self.to_error_s.append(record.ended_at - fault_at)
            else:
                self.lost += 1

    def p99(self, values: list[float] | None = None) -> float:
        values = self.to_error_s if values is None else values
        if not values:
            return 0.0
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def worker_sigkill(bench: Bench, round_no: int, tally: Tally) -> None:
    """Streams on two workers; SIGKILL one mid-stream; a replacement joins for the next round."""
    fleet = bench.fleet
    workers = [p for p in fleet.processes if p.poll() is None and "worker" in str(p.args)]
    bodies = [{"prompt": f"Round {round_no} story {i}:", "n_predict": 96, "ignore_eos": True,
               "seed": i} for i in range(bench.streams)]
    records, threads = start_streams(bench.api, bodies)
    for record in records:
        record.started.wait(120)
    workers[0].kill()
    fault_at = time.monotonic()
    for thread in threads:
        thread.join(300)
    tally.add(records, fault_at)
    fleet.add_worker(*bench.worker_flags)


def greedy_bodies(bench: Bench) -> list[dict[str, object]]:
    return [{"prompt": f"Story {i}:", "n_predict": 96, "ignore_eos": True,
             "temperature": 0} for i in range(bench.streams)]


def worker_migrate(bench: Bench, round_no: int, tally: Tally) -> None:
    """Greedy streams on two workers; SIGKILL one `kill_every_s` after the round began (or
    once every stream has tokens, if later); a replacement starts at once (as `llamaq up`
    restarts a dead worker): with every slot busy, the survivor has no room for the
    continuations, so the stall includes the replacement's start."""
    fleet = bench.fleet
    began = time.monotonic()
    if not bench.reference:  # the undisturbed texts, once
        records, threads = start_streams(bench.api, greedy_bodies(bench))
        for thread in threads:
            thread.join(300)
        bench.reference = [r.content for r in records]
    workers = [p for p in fleet.processes if p.poll() is None and "worker" in str(p.args)]
    records, threads = start_streams(bench.api, greedy_bodies(bench))
    for record in records:
        record.started.wait(120)
    time.sleep(max(0.0, bench.kill_every_s - (time.monotonic() - began)))
    workers[0].kill()
    fault_at = time.monotonic()
    fleet.add_worker(*bench.worker_flags)  # at once, as `llamaq up` restarts a dead worker
    for thread in threads:
        thread.join(300)
    tally.add(records, fault_at)
    for record, text in zip(records, bench.reference, strict=True):
        if record.outcome == "answered":
            tally.compared += 1
            tally.equal += record.content == text
            tally.stalls_s.append(record.max_gap_s)


def redis_restart(bench: Bench, round_no: int, tally: Tally) -> None:
    """Streams running; Redis killed (data lost) and back empty after `outage_s`."""
    bodies = [{"prompt": f"Round {round_no} story {i}:", "n_predict": 96, "ignore_eos": True,
               "seed": i} for i in range(bench.streams)]
    records, threads = start_streams(bench.api, bodies)
    for record in records:
        record.started.wait(120)
    bench.redis.kill()
    fault_at = time.monotonic()
    time.sleep(min(2.0, bench.outage_s))
    refused = httpx.post(f"{bench.api}/completion", json={"prompt": "Hi", "n_predict": 4},
                         timeout=60)
    if refused.status_code != 503 or not refused.headers.get("Retry-After"):
        tally.lost += 1  # a request during the outage must be refused with Retry-After
        print(f"  during the outage: {refused.status_code} {refused.text[:200]}", flush=True)
    for thread in threads:
        thread.join(300)
    tally.add(records, fault_at)
    time.sleep(max(0.0, bench.outage_s - (time.monotonic() - fault_at)))
    bench.redis.start()
    alive = [p.poll() is None for p in bench.fleet.processes]
    if not all(alive):
        print(f"  {alive.count(False)} llamaq processes exited during the outage", flush=True)
        tally.lost += alive.count(False)


SCENARIOS: dict[str, Callable[[Bench, int, Tally], None]] = {
    "worker-sigkill": worker_sigkill,
    "redis-restart": redis_restart,
    "worker-migrate": worker_migrate,
}


def run(scenario: str, rounds: int, n_slots: int, streams: int, outage_s: float,
        seconds: float, kill_every_s: float = 10.0, migration_limit: int = 3) -> Tally:
    workdir = Path(tempfile.mkdtemp(prefix="llamaq-faults-"))
    redis = RestartableRedis(workdir / "redis")
    redis.start()
    redis_url = redis.url
    model = default_model_path(Path.home() / ".cache" / "llamaq-tests")
    common = ["-m", str(model), "--alias", "bench-faults", "--store-url", str(workdir / "store"),
              "--cache-dir", str(workdir / "cache")]
    fleet = Fleet(redis_url, workdir, common, logs=workdir / "logs")
    flags = ("-c", str(512 * n_slots), "-np", str(n_slots), "-t", "1")
    tally = Tally()
    try:
        fleet.add_worker(*flags)
        fleet.add_worker(*flags)
        api = fleet.add_api("--migration-limit", str(migration_limit))
        bench = Bench(fleet, api, flags, streams, redis, outage_s, kill_every_s)
        until = time.monotonic() + seconds
        for round_no in range(rounds):
            if time.monotonic() > until:
                print(f"time is up after {round_no} rounds", flush=True)
                break
            wait_until(lambda: len(slots_of(api)) >= 2 * n_slots, timeout=120,
                       what="two workers")
            SCENARIOS[scenario](bench, round_no, tally)
            started = time.monotonic()
            response = httpx.post(f"{api}/completion", json={"prompt": "Hi", "n_predict": 4},
                                  timeout=60)
            print(f"round {round_no + 1}/{rounds}: sent {tally.sent} answered {tally.answered}"
                  f" errored {tally.errored} lost {tally.lost}; next request "
                  f"{response.status_code} in {time.monotonic() - started:.2f} s", flush=True)
    finally:
        fleet.stop()
        redis.kill()
    return tally


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="worker-sigkill")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--np", type=int, default=8, dest="n_slots")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--outage", type=float, default=15.0,
                        help="seconds Redis stays down (redis-restart)")
    parser.add_argument("--seconds", type=float, default=float("inf"),
                        help="start no round after this many seconds")
    parser.add_argument("--kill-every", type=float, default=10.0,
                        help="seconds from a round's start to its kill (worker-migrate)")
    parser.add_argument("--migration-limit", type=int, default=3,
                        help="the api's --migration-limit (0: streams of a dead worker end "
                        "with 503)")
    args = parser.parse_args()
    tally = run(args.scenario, args.rounds, args.n_slots, args.streams, args.outage,
                args.seconds, args.kill_every, args.migration_limit)
    print(f"\n{args.scenario}: sent {tally.sent}, answered {tally.answered}, errored "
          f"{tally.errored}, lost {tally.lost}; p99 time to the error event "
          f"{tally.p99():.2f} s")
    if tally.compared:
        print(f"greedy texts equal to the undisturbed run: {tally.equal} of {tally.compared}; "
              f"p99 stall {tally.p99(tally.stalls_s):.2f} s, max "
              f"{max(tally.stalls_s):.2f} s")
    sys.exit(1 if tally.lost else 0)


if __name__ == "__main__":
    main()
