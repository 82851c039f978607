"""What idle workers cost one Redis (issue 44: ≥ 1,000 simulated workers on one Redis, their
idle cost under 5 % of one Redis core): starts Redis and `--workers` processes of
`--sim-workers` simulated workers each (bench/fleet_scale.py start_fleet, no api pod), waits
until all are registered and `--settle` seconds more, then counts over `--seconds` Redis's
commands (INFO commandstats, scripts' inner commands included) and the CPU seconds of Redis
and the worker processes (utime + stime from /proc).

    python -m bench.idle_fleet --workers 4 --sim-workers 250 --seconds 30
    python -m bench.idle_fleet ... --worker-flags "--idle-poll-delay 1"   # a poll a second

writes bench/results/idle_fleet-<time>.json and prints it."""

from __future__ import annotations

import argparse
import json
import os
import time
from contextlib import ExitStack

import redis

from bench.fleet_scale import REPO, cpu_s, redis_calls_by_command, rss_mib, start_fleet


def measure(args: argparse.Namespace, redis_url: str,
            pids: dict[str, list[int]]) -> dict[str, object]:
    client = redis.Redis.from_url(redis_url)
    time.sleep(args.settle)
    n = args.workers * args.sim_workers
    cpu_before = {role: sum(cpu_s(p) for p in ps) for role, ps in pids.items()}
    calls_before = redis_calls_by_command(client)
    started = time.monotonic()
    time.sleep(args.seconds)
    took = time.monotonic() - started
    cpu = {role: sum(cpu_s(p) for p in ps) - cpu_before[role] for role, ps in pids.items()}
    calls_after = redis_calls_by_command(client)
    by_name = {name: (calls - calls_before.get(name, 0)) / took / n
               for name, calls in calls_after.items() if calls - calls_before.get(name, 0)}
    per_worker = sum(by_name.values())
    redis_core = cpu["redis"] / took
    memory: dict[str, object] = client.info("memory")  # type: ignore[assignment]
    clients: dict[str, object] = client.info("clients")  # type: ignore[assignment]
    return {
        "config": vars(args), "load_average": os.getloadavg(), "seconds": took,
        "workers": n, "registered": client.zcard("llamaq:model:simulated:workers"),
        "redis_commands_per_s": per_worker * n,
        "redis_commands_per_s_per_worker": per_worker,
        "redis_commands_per_s_per_worker_by_name": dict(
            sorted(((k, round(v, 3)) for k, v in by_name.items()), key=lambda kv: -kv[1])),
        "redis_core_fraction": redis_core,
        "redis_core_fraction_per_1000_workers": redis_core / n * 1000,
        "worker_processes_core_fraction": cpu["worker"] / took,
        "rss_mib": {"worker": sum(rss_mib(p) for p in pids["worker"])},
        "redis_used_memory_mib": int(str(memory["used_memory"])) / 2**20,
        "redis_connected_clients": clients["connected_clients"],
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=4, help="simulated worker processes")
    p.add_argument("--sim-workers", type=int, default=250, help="simulated workers in each")
    p.add_argument("-np", type=int, default=4)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--settle", type=float, default=5.0)
    p.add_argument("--worker-flags", default="")
    p.add_argument("--worker-cpus", default="")
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    args.apis, args.api_cpus, args.api_flags = 0, "", ""
    args.sim_itl_ms, args.sim_prefill_tps = 50.0, 20000.0
    stamp = time.strftime("%Y%m%d-%H%M%S")
    logs = REPO / "bench" / "results" / f"idle_fleet-{stamp}"
    logs.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        _, redis_url, pids = start_fleet(args, stack, logs)
        report = measure(args, redis_url, pids)
    out = args.out or str(logs.with_suffix(".json"))
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps({k: v for k, v in report.items() if k != "config"}, indent=1))


if __name__ == "__main__":
    main()
