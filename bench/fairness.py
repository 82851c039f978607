"""Fair sharing under load (not a test; issue 47, docs/fairness.md): one fleet, three tenants
of equal weight, real workers on Gemma 3 270M.

    .venv/bin/python bench/fairness.py [--seconds 60] [--alone-seconds 20] [--workers 1]
        [--np 4] [--per-tenant 2] [--n-predict 48] [--tenants 3] [--simulate N]
        [--preempt off|priority|fair] [--fifo]

- noisy neighbour: tenant a runs 10x the clients of each other tenant (`--tenants` in all,
  `--per-tenant` clients each), all long generations, for `--seconds`: Jain's fairness index
  over the tenants' generated tokens/s, and the others' TTFT p50 against b alone;
- priority: a saturating load of priority 10 generations (tenant a), then one client of
  short priority 0 requests (tenant b): its TTFT p50 against b alone, and every stream ended
  without an error (preempted ones included; --preempt priority, the workers' default).

Clients send streamed requests one after another. Figures depend on the machine's load: say
it with them. Prints the figures; exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from storage import default_model_path  # noqa: E402
from tests.processes import Fleet, start_redis  # noqa: E402


def tenants(n: int) -> list[dict[str, object]]:
    """Tenants a, b, c, … (a is the noisy one), and ops (admin: reads /metrics)."""
    named: list[dict[str, object]] = [
        {"name": chr(ord("a") + i), "keys": [f"k-{chr(ord('a') + i)}"]} for i in range(n)]
    return [*named, {"name": "ops", "keys": ["k-ops"], "admin": True}]


@dataclass
class FleetSide:
    """What the fleet says at a moment (a phase: the difference of two), beside what the
    clients see: the queue wait of one tenant's completions of one priority (api enqueue to
    started, /metrics), the completions started (every tenant's), the Redis commands run, the
    jobs whose lease a worker lost (too starved of CPU to renew it: the job runs again)."""

    waited_s: float
    waited_n: float
    started: float
    commands: int
    leases_lost: int


def fleet_side(api: str, redis_url: str, logs: Path, tenant: str, priority: int) -> FleetSide:
    text = httpx.get(f"{api}/metrics", headers={"Authorization": "Bearer k-ops"},
                     timeout=30).text
    found = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
             if line and not line.startswith("#")}
    labels = f'{{tenant="{tenant}",priority="{priority}"}}'
    stats: dict[str, dict[str, int]] = redis.Redis.from_url(redis_url).info("commandstats")  # type: ignore[assignment]
    return FleetSide(
        found.get(f"llamaq:tenant_wait_seconds_total{labels}", 0.0),
        found.get(f"llamaq:tenant_started_total{labels}", 0.0),
        sum(v for k, v in found.items() if k.startswith("llamaq:tenant_started_total{")),
        sum(int(stat["calls"]) for stat in stats.values()),
        sum(p.read_text(errors="replace").count("lease lost") for p in logs.glob("worker-*.log")))


def fleet_line(before: FleetSide, after: FleetSide, tenant: str) -> str:
    waited_n = after.waited_n - before.waited_n
    started = after.started - before.started
    wait_ms = (after.waited_s - before.waited_s) / waited_n * 1000 if waited_n else float("nan")
    per_job = (after.commands - before.commands) / started if started else float("nan")
    return (f"  fleet: {tenant}'s mean queue wait {wait_ms:.0f} ms ({waited_n:.0f} started); "
            f"{per_job:.0f} Redis commands per completion started ({started:.0f}); "
            f"leases lost {after.leases_lost - before.leases_lost}")


@dataclass
class Seen:
    ttft_s: list[float] = field(default_factory=list)
    tokens: int = 0
    problems: Counter[str] = field(default_factory=Counter)


async def client(http: httpx.AsyncClient, api: str, key: str, n: int, until: float,
                 seen: Seen, n_predict: int, priority: int) -> None:
    body = {"prompt": f"Client {n} of {key} tells a long story:", "n_predict": n_predict,
            "stream": True, "ignore_eos": True, "priority": priority}
    headers = {"Authorization": f"Bearer {key}"}
    while time.monotonic() < until:
        sent = time.monotonic()
        try:
            async with http.stream("POST", f"{api}/completion", json=body,
                                   headers=headers) as response:
                if response.status_code != 200:
                    await response.aread()
                    seen.problems[f"status {response.status_code}"] += 1
                    await asyncio.sleep(1)
                    continue
                first, ended = True, False
                async for line in response.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        seen.problems[f"stream error {event['error'].get('code')}"] += 1
                        break
                    if event.get("content") and time.monotonic() <= until:
                        seen.tokens += 1  # a streamed event per token: the window's only
                    if first and event.get("content"):
                        seen.ttft_s.append(time.monotonic() - sent)
                        first = False
                    if event.get("stop"):
                        ended = True
                if not ended:
                    seen.problems["stream without its end"] += 1
        except httpx.HTTPError as error:
            seen.problems[type(error).__name__] += 1


async def drive(api: str, plan: list[tuple[str, int, int, int]], seconds: float,
                seen: dict[str, Seen] | None = None) -> dict[str, Seen]:
    """`plan`: (tenant key, clients, n_predict, priority); what they see goes in `seen` (a
    new one when None)."""
    seen = {key: Seen() for key, *_ in plan} if seen is None else seen
    until = time.monotonic() + seconds
    # a connection per client: a pool smaller than the clients would queue requests in the
    # bench itself, first come first served, before any reaches the fleet
    clients = sum(n for _, n, *_ in plan)
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(
            max_connections=clients, max_keepalive_connections=clients)) as http:
        await asyncio.gather(*(client(http, api, key, n, until, seen[key], n_predict, prio)
                               for key, clients, n_predict, prio in plan
                               for n in range(clients)))
    return seen


def p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def jain(values: list[float]) -> float:
    """Jain's fairness index: 1 when all are equal, 1/n when one takes everything."""
    total = sum(values)
    squares = sum(v * v for v in values)
    return total * total / (len(values) * squares) if squares else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--alone-seconds", type=float, default=20)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--np", type=int, default=4, dest="n_slots")
    parser.add_argument("--per-tenant", type=int, default=2)
    parser.add_argument("--n-predict", type=int, default=48)
    parser.add_argument("--tenants", type=int, default=3)
    parser.add_argument("--simulate", type=int, default=0,
                        help="simulated workers per worker process (--simulate, docs/scale.md;"
                        " 0: Gemma workers)")
    parser.add_argument("--sim-itl-ms", type=float, default=50.0)
    parser.add_argument("--preempt", default="priority", choices=("off", "priority", "fair"),
                        help="the workers' --preempt (default theirs: priority)")
    parser.add_argument("--only", choices=("noisy", "priority"),
                        help="run one scenario (default: both)")
    parser.add_argument("--fifo", action="store_true",
                        help="the api with --no-fair-share and the workers with --preempt off: "
                        "the baseline")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="llamaq-fairness-"))
    tenants_file = workdir / "tenants.json"
    tenants_file.write_text(json.dumps({"tenants": tenants(args.tenants)}))
    others = [f"k-{chr(ord('a') + i)}" for i in range(1, args.tenants)]
    redis_process, redis_url = start_redis(workdir / "redis")
    model = default_model_path(Path.home() / ".cache" / "llamaq-tests")
    fleet = Fleet(redis_url, workdir, ["-m", str(model), "--alias", "bench-fair",
                                       "--store-url", str(workdir / "store"), "--cache-dir",
                                       str(workdir / "cache")], logs=workdir / "logs")
    k, n = args.per_tenant, args.n_predict
    try:
        sim = ["--simulate", "--sim-workers", str(args.simulate), "--sim-itl-ms",
               str(args.sim_itl_ms), "--sim-eos-tokens", "100000"] if args.simulate else []
        for _ in range(args.workers):
            fleet.add_worker("-c", str(512 * args.n_slots), "-np", str(args.n_slots), *sim,
                             "--preempt", "off" if args.fifo else args.preempt)
        api = fleet.add_api("--tenants", str(tenants_file), "--queue-max", "10000", "--metrics",
                            *(["--no-fair-share"] if args.fifo else []))
        fleet.wait_healthy(api)
        print(f"load before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
        asyncio.run(drive(api, [("k-b", 1, 4, 0)], 3))  # warm-up
        print(f"logs: {workdir / 'logs'}")
        logs = workdir / "logs"
        fleet_lines = {}
        if args.only != "priority":
            alone = asyncio.run(drive(api, [("k-b", k, n, 0)], args.alone_seconds))["k-b"]
            before = fleet_side(api, redis_url, logs, "b", 0)
            noisy = asyncio.run(drive(api, [("k-a", 10 * k, n, 0),
                                            *((key, k, n, 0) for key in others)], args.seconds))
            fleet_lines["noisy"] = fleet_line(before, fleet_side(api, redis_url, logs, "b", 0),
                                              "b")
            print(f"load after noisy: {os.getloadavg()[0]:.1f}")
        if args.only != "noisy":
            short_alone = asyncio.run(drive(api, [("k-b", 1, 8, 0)], args.alone_seconds))["k-b"]
            slots = args.workers * max(1, args.simulate) * args.n_slots
            before = fleet_side(api, redis_url, logs, "b", 0)
            urgent = asyncio.run(drive(api, [("k-a", 2 * slots, 4 * n, 10),
                                             ("k-b", 1, 8, 0)], args.seconds))
            fleet_lines["priority"] = fleet_line(
                before, fleet_side(api, redis_url, logs, "b", 0), "b")
        print(f"load after: {os.getloadavg()[0]:.1f}")
    finally:
        fleet.stop()
        redis_process.terminate()
        redis_process.wait()
    kind = f"simulated x {args.simulate}, ITL {args.sim_itl_ms:g} ms" if args.simulate \
        else "Gemma 3 270M"
    print("FIFO baseline (--no-fair-share, --preempt off)" if args.fifo else
          f"fair sharing (--preempt {args.preempt})")
    if args.only != "priority":
        report_noisy(args, alone, noisy, others, kind)
        print(fleet_lines["noisy"])
    if args.only != "noisy":
        report_priority(short_alone, urgent)
        print(fleet_lines["priority"])


def report_noisy(args: argparse.Namespace, alone: Seen, noisy: dict[str, Seen],
                 others: list[str], kind: str) -> None:
    k, n = args.per_tenant, args.n_predict
    rates = {key: seen.tokens / args.seconds for key, seen in noisy.items()}
    print(f"noisy neighbour ({args.workers} worker process(es), {kind}, -np {args.n_slots}, "
          f"a {10 * k} clients, the {len(others)} others {k} each, n_predict {n}, "
          f"{args.seconds:.0f} s):")
    for key, seen in noisy.items():
        print(f"  {key}: {rates[key]:.1f} tokens/s, TTFT p50 {p50(seen.ttft_s) * 1000:.0f} ms "
              f"({len(seen.ttft_s)} requests), problems {dict(seen.problems)}")
    print(f"  Jain's index over tokens/s: {jain(list(rates.values())):.3f}")
    print(f"  b alone TTFT p50 {p50(alone.ttft_s) * 1000:.0f} ms; together / alone: " + ", ".join(
        f"{key[2:]} {p50(noisy[key].ttft_s) / p50(alone.ttft_s):.2f}" for key in others))
    print(f"  aggregate {sum(rates.values()):.1f} tokens/s")


def report_priority(short_alone: Seen, urgent: dict[str, Seen]) -> None:
    print("priority (a: priority 10 saturating, b: priority 0, n_predict 8):")
    ratio = p50(urgent["k-b"].ttft_s) / p50(short_alone.ttft_s)
    print(f"  b TTFT p50 {p50(urgent['k-b'].ttft_s) * 1000:.0f} ms, alone "
          f"{p50(short_alone.ttft_s) * 1000:.0f} ms: {ratio:.2f}x")
    print(f"  problems: a {dict(urgent['k-a'].problems)}, b {dict(urgent['k-b'].problems)}")


if __name__ == "__main__":
    main()
