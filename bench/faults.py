"""Fault benchmark (not a test): named scenarios run in a loop against a real fleet on
127.0.0.1, each printing requests sent / answered / errored / lost (lost must be 0) and the p99
time from the fault to a client's error event.

    .venv/bin/python bench/faults.py [--scenario worker-sigkill] [--rounds 20]
                                     [--np 8] [--streams 16]
    .venv/bin/python bench/faults.py --scenario redis-restart --rounds 3 [--outage 15]
    .venv/bin/python bench/faults.py --scenario worker-migrate [--rounds 20] [--kill-every 10]
                                     [--baseline-runs 2] [--worker-args "--no-repack"]

Scenarios live in SCENARIOS (name -> function); a scenario gets a running fleet and one round's
parameters and returns what its clients saw.

- worker-sigkill: streams on two workers; one is SIGKILLed mid-stream; a new one joins.
- worker-migrate (issue 26): greedy streams on two workers; one is SIGKILLed every
  `--kill-every` seconds (a replacement starts at once, as `llamaq up` restarts one): with
  --migration-limit (the api's, default 3) every stream must end with its answer. Prints
  errored (target 0), lost, the p99 stall (the longest gap between two tokens of a stream,
  across the death), and greedy equality stream by stream: whether it migrated (and the
  seam: how many tokens its client had when its worker died, from the continuing worker's
  log), whether its tokens equal the undisturbed run's (run once before the rounds), and for
  a differing stream where the first difference lies relative to its seam. The baseline is
  `--baseline-runs` (default 2) more undisturbed runs (same fleet, no kill) against the
  first: batch composition alone changes greedy tokens on llama.cpp's CPU kernels. The
  verdict compares the migrated streams with the baseline (see equality_verdict);
  `--json PATH` writes every stream's check.
- redis-restart: streams running; Redis is killed (its data with it) and started again empty
  `--outage` seconds later; a request sent during the outage must get 503 with Retry-After;
  every stream must end with its answer or an error event, and the fleet must serve again.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import cast

import httpx
import redis

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scheduler.contract import keys  # noqa: E402
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
    baseline_runs: int = 2
    """worker-migrate: undisturbed runs compared with the reference one (the baseline)."""
    reference: list[list[int]] = field(default_factory=list)
    """worker-migrate: each stream's undisturbed greedy tokens."""


@dataclass
class StreamCheck:
    """One greedy stream against its undisturbed run."""

    round_no: int
    """-1: the baseline (a second undisturbed run)."""
    stream: int
    seams: list[int]
    """For each migration of its job, how many tokens its client had when its worker died
    (empty: it did not migrate)."""
    first_difference: int | None
    """The index of its first token that differs from the undisturbed run's (None: equal)."""
    stall_s: float = 0.0
    """Its longest gap between two tokens."""
    resumed_s: float | None = None
    """When the token that ended that gap came, in seconds after the kill."""
    prefill_s: float = 0.0
    """A migrated stream: its continuation's prefill (prompt + the tokens generated before the
    death, all of the dead worker's continuations in the same batches), from the final
    event's timings."""

    @property
    def equal(self) -> bool:
        return self.first_difference is None

    def line(self) -> str:
        where = "baseline" if self.round_no < 0 else f"round {self.round_no + 1}"
        moved = f"migrated at token {', '.join(map(str, self.seams))}" if self.seams \
            else "not migrated"
        if self.resumed_s is not None:
            moved += f" (stall {self.stall_s:.2f} s, ending {self.resumed_s:.2f} s after the " \
                f"kill; prefill {self.prefill_s:.2f} s)"
        if self.equal:
            return f"  {where} stream {self.stream}: {moved}, equal"
        assert self.first_difference is not None
        seam = ""
        if self.seams:
            offset = self.first_difference - self.seams[0]
            seam = f" ({offset} tokens after the seam)" if offset >= 0 else \
                f" ({-offset} tokens before the seam)"
        return f"  {where} stream {self.stream}: {moved}, differs from token " \
               f"{self.first_difference}{seam}"


@dataclass
class Tally:
    sent: int = 0
    answered: int = 0
    errored: int = 0
    lost: int = 0
    to_error_s: list[float] = field(default_factory=list)
    stalls_s: list[float] = field(default_factory=list)
    checks: list[StreamCheck] = field(default_factory=list)
    """worker-migrate: every answered stream of the rounds, and the baseline's."""

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


def first_difference(tokens: list[int], reference: list[int]) -> int | None:
    """The index of the first token of `tokens` that differs from `reference` (a shorter or
    longer list differs where the shorter ends); None when equal."""
    for i, (a, b) in enumerate(zip(tokens, reference, strict=False)):
        if a != b:
            return i
    return None if len(tokens) == len(reference) else min(len(tokens), len(reference))


MIGRATED = re.compile(r"job (\S+): worker \S+ died after (\d+) tokens; continuing")


def seams_of(bench: Bench, records: list[StreamRecord]) -> list[list[int]]:
    """For each stream, its job's migrations: the tokens its client had at each death, read
    from the continuing workers' logs (the stream's SSE id names its record, which names its
    job)."""
    migrations: dict[str, list[int]] = {}
    for log in sorted(bench.fleet.logs.glob("worker-*.log")):
        for match in MIGRATED.finditer(log.read_text(errors="replace")):
            migrations.setdefault(match[1], []).append(int(match[2]))
    client = redis.Redis.from_url(bench.redis.url)
    seams: list[list[int]] = []
    for record in records:
        job_ids: list[str] = []
        if record.event_id:
            body = cast(bytes | None,
                        client.get(keys.stream_record(record.event_id.partition("-")[0])))
            job_ids = json.loads(body)["job_ids"] if body else []
        seams.append(sorted(n for job in job_ids for n in migrations.get(job, [])))
    client.close()
    return seams


def undisturbed(bench: Bench) -> list[StreamRecord]:
    records, threads = start_streams(bench.api, greedy_bodies(bench))
    for thread in threads:
        thread.join(300)
    return records


def worker_migrate(bench: Bench, round_no: int, tally: Tally) -> None:
    """Greedy streams on two workers; SIGKILL one `kill_every_s` after the round began (or
    once every stream has tokens, if later); a replacement starts at once (as `llamaq up`
    restarts a dead worker): with every slot busy, the survivor has no room for the
    continuations, so the stall includes the replacement's start. Before the first round:
    the undisturbed run (the reference), then `baseline_runs` more (the baseline)."""
    fleet = bench.fleet
    if not bench.reference:
        bench.reference = [r.token_ids for r in undisturbed(bench)]
        for _ in range(bench.baseline_runs):
            for i, record in enumerate(undisturbed(bench)):
                check = StreamCheck(-1, i, [], first_difference(record.token_ids,
                                                                bench.reference[i]))
                tally.checks.append(check)
                print(check.line(), flush=True)
    began = time.monotonic()
    workers = [p for p in fleet.processes if p.poll() is None and "worker" in str(p.args)]
    records, threads = start_streams(bench.api, greedy_bodies(bench))
    for record in records:
        record.started.wait(120)
    time.sleep(max(0.0, bench.kill_every_s - (time.monotonic() - began)))
    workers[0].kill()
    fault_at = time.monotonic()
    print(f"round {round_no + 1}: worker killed at {datetime.now():%H:%M:%S.%f}"[:-3], flush=True)
    fleet.add_worker(*bench.worker_flags)  # at once, as `llamaq up` restarts a dead worker
    for thread in threads:
        thread.join(300)
    tally.add(records, fault_at)
    for i, (record, seams) in enumerate(zip(records, seams_of(bench, records), strict=True)):
        if record.outcome == "answered":
            resumed = None if record.max_gap_end_at is None else record.max_gap_end_at - fault_at
            timings = (record.final or {}).get("timings") or {}
            prefill = timings.get("prompt_ms", 0.0) / 1000 if seams else 0.0
            check = StreamCheck(round_no, i, seams,
                                first_difference(record.token_ids, bench.reference[i]),
                                record.max_gap_s, resumed, prefill)
            tally.checks.append(check)
            print(check.line(), flush=True)
            tally.stalls_s.append(record.max_gap_s)


def stays_equal(baseline: list[StreamCheck], at: int) -> float:
    """The chance that a stream equal to the undisturbed run up to token `at` stays equal to
    its end, from the baseline (undisturbed runs): the rule of succession, so that a small
    baseline with no difference past `at` does not claim certainty."""
    alive = [c for c in baseline if c.first_difference is None or c.first_difference >= at]
    return (sum(c.equal for c in alive) + 1) / (len(alive) + 2)


def equality_verdict(checks: list[StreamCheck]) -> tuple[bool, list[str]]:
    """Greedy equality of the migrated streams against the baseline (undisturbed runs
    against the first), not against 100 %: batch composition alone changes greedy tokens on
    llama.cpp's CPU kernels. What a migration can change is only what comes after its seam
    (the tokens before it are the dead worker's, as its client got them), so a migrated
    stream that differs before its seam is batching's and counts apart. For the migrated
    streams equal up to their seam, the verdict compares how many stay equal to the end with
    how many the baseline expects (the share of its streams equal up to that token that stay
    equal, stays_equal): it holds when they fall short by at most two standard deviations
    of that count."""
    baseline = [c for c in checks if c.round_no < 0]
    migrated = [c for c in checks if c.round_no >= 0 and c.seams]
    others = [c for c in checks if c.round_no >= 0 and not c.seams]

    def share(group: list[StreamCheck]) -> str:
        equal = sum(c.equal for c in group)
        return f"{equal}/{len(group)}" + (f" ({100 * equal / len(group):.0f} %)"
                                          if group else "")

    before = [c for c in migrated if c.first_difference is not None
              and c.first_difference < c.seams[0]]
    at_seam = [c for c in migrated if c not in before]
    lines = [f"greedy equality: migrated equal {share(migrated)}, not migrated equal "
             f"{share(others)}, baseline (undisturbed runs against the first) equal "
             f"{share(baseline)}",
             f"  differing migrated streams: {len(before)} first differ before their seam "
             f"(batching before the death), {len(at_seam) - sum(c.equal for c in at_seam)} "
             f"at or after it"]
    if not at_seam or not baseline:
        return True, lines
    chances = [stays_equal(baseline, c.seams[0]) for c in at_seam]
    expected = sum(chances)
    spread = math.sqrt(sum(p * (1 - p) for p in chances))
    got = sum(c.equal for c in at_seam)
    holds = got >= expected - 2 * spread
    lines.append(f"  verdict: {'holds' if holds else 'FAILS'}: of {len(at_seam)} migrated "
                 f"streams equal up to their seam, {got} stay equal to the end; the baseline "
                 f"expects {expected:.1f} (two standard deviations: {2 * spread:.1f})")
    return holds, lines


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
        seconds: float, kill_every_s: float = 10.0, migration_limit: int = 3,
        worker_args: tuple[str, ...] = (), baseline_runs: int = 2) -> Tally:
    workdir = Path(tempfile.mkdtemp(prefix="llamaq-faults-"))
    redis = RestartableRedis(workdir / "redis")
    redis.start()
    redis_url = redis.url
    model = default_model_path(Path.home() / ".cache" / "llamaq-tests")
    common = ["-m", str(model), "--alias", "bench-faults", "--store-url", str(workdir / "store"),
              "--cache-dir", str(workdir / "cache")]
    fleet = Fleet(redis_url, workdir, common, logs=workdir / "logs")
    flags = ("-c", str(512 * n_slots), "-np", str(n_slots), "-t", "1", *worker_args)
    tally = Tally()
    try:
        fleet.add_worker(*flags)
        fleet.add_worker(*flags)
        api = fleet.add_api("--migration-limit", str(migration_limit))
        bench = Bench(fleet, api, flags, streams, redis, outage_s, kill_every_s,
                      baseline_runs=baseline_runs)
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
    parser.add_argument("--baseline-runs", type=int, default=2,
                        help="undisturbed runs compared with the first one (worker-migrate)")
    parser.add_argument("--worker-args", default="",
                        help="more worker flags, one string (e.g. \"--no-repack\")")
    parser.add_argument("--json", type=Path, default=None,
                        help="write every stream check here (worker-migrate)")
    parser.add_argument("--migration-limit", type=int, default=3,
                        help="the api's --migration-limit (0: streams of a dead worker end "
                        "with 503)")
    args = parser.parse_args()
    tally = run(args.scenario, args.rounds, args.n_slots, args.streams, args.outage,
                args.seconds, args.kill_every, args.migration_limit,
                tuple(shlex.split(args.worker_args)), args.baseline_runs)
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(c) for c in tally.checks]))
    print(f"\n{args.scenario}: sent {tally.sent}, answered {tally.answered}, errored "
          f"{tally.errored}, lost {tally.lost}; p99 time to the error event "
          f"{tally.p99():.2f} s")
    holds = True
    if tally.stalls_s:
        print(f"p99 stall {tally.p99(tally.stalls_s):.2f} s, max {max(tally.stalls_s):.2f} s")
        for name, group in (("migrated", [c for c in tally.checks if c.seams]),
                            ("not migrated", [c for c in tally.checks
                                              if not c.seams and c.round_no >= 0])):
            if group:
                stalls = [c.stall_s for c in group]
                print(f"  {name}: stall median {statistics.median(stalls):.2f} s, p99 "
                      f"{tally.p99(stalls):.2f} s")
        migrated = [c for c in tally.checks if c.seams]
        if migrated:  # the target: <= 3 s plus the continuation's prefill
            beyond = [c.stall_s - c.prefill_s for c in migrated]
            prefills = [c.prefill_s for c in migrated]
            print(f"  migrated, stall less the continuation's prefill: median "
                  f"{statistics.median(beyond):.2f} s, p99 {tally.p99(beyond):.2f} s (target "
                  f"<= 3 s); prefill median {statistics.median(prefills):.2f} s, max "
                  f"{max(prefills):.2f} s")
    if tally.checks:
        holds, lines = equality_verdict(tally.checks)
        print("\n".join(lines))
    sys.exit(1 if tally.lost or not holds else 0)


if __name__ == "__main__":
    main()
