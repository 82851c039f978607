"""The streaming benchmark's A/B interleaved rounds (`--rounds N`): every system up at once,
rounds in alternating order, the per-round ratios against llama-server and CPU per token."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.processes import free_port, running, server_env, wait_healthy
from bench.stream_clients import run_clients, run_round
from bench.stream_systems import RESULTS, command, shared_flags, system_env, systems_of


def cpu_seconds(session: int) -> dict[str, float]:
    """User + system CPU seconds of the live processes of a session, by role: "all", and
    "worker" for llamaq's worker process (Linux /proc; clock ticks of os.sysconf)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {"all": 0.0, "worker": 0.0}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[3]) != session:  # field 6 of stat: the session id
            continue
        seconds = (int(fields[11]) + int(fields[12])) / tick
        out["all"] += seconds
        if " worker" in cmdline and "llamaq" in cmdline:
            out["worker"] += seconds
    return out


@dataclass
class Sample:
    tok_s: float
    ttft_ms: float | None
    cpu_per_token: float | None
    worker_cpu_per_token: float | None


def interleaved(args: argparse.Namespace, model: Path, stamp: str) -> str:
    """Both systems up at once; rounds A/B then B/A …; returns the report."""
    shared = shared_flags(args)
    samples: dict[tuple[str, int], list[Sample]] = {}
    ratios: dict[tuple[str, int], list[float]] = {}
    systems = systems_of(args)
    with contextlib.ExitStack() as stack:
        if args.hog:
            stack.enter_context(cpu_hogs(args.hog))
        urls, sessions = {}, {}
        for system in systems:
            port = free_port()
            cmd = command(system, args.llama_server, model, port, shared)
            log = RESULTS / f"streaming-{stamp}-{system.replace(':', '-')}.log"
            print(f"{system}: {' '.join(cmd)}  (log: {log})", flush=True)
            process = stack.enter_context(running(cmd, log, server_env(system_env(system, args))))
            urls[system], sessions[system] = f"http://127.0.0.1:{port}", process.pid
            wait_healthy(urls[system], args.start_timeout, process)
        for system in systems:
            warm = asyncio.run(run_round(urls[system], 1, args.n_predict, "warm-up"))
            if warm.errors:
                raise RuntimeError(f"{system} warm-up failed: {warm.errors[0]}")
        for r in range(args.rounds):
            order = systems if r % 2 == 0 else tuple(reversed(systems))
            for n in args.concurrency:
                got: dict[str, float] = {}
                for system in order:
                    before = cpu_seconds(sessions[system])
                    done = asyncio.run(run_clients(urls[system], n, args.n_predict,
                                                   f"r{r} c{n}", args.streams_per_client))
                    after = cpu_seconds(sessions[system])
                    ttfts = [x.ttft for x in done.streams if x.ttft is not None]
                    used = {k: after[k] - before[k] for k in after}
                    tokens = max(done.tokens, 1)
                    sample = Sample(done.tokens / done.wall_s,
                                    statistics.median(ttfts) * 1000 if ttfts else None,
                                    used["all"] / tokens,
                                    used["worker"] / tokens if system != "llama-server"
                                    else None)
                    samples.setdefault((system, n), []).append(sample)
                    got[system] = sample.tok_s
                    print(f"  round {r} c={n} {system}: {sample.tok_s:.1f} tok/s"
                          + (f", errors: {done.errors[0]}" if done.errors else ""), flush=True)
                for system in systems[1:]:
                    if got.get("llama-server"):
                        ratios.setdefault((system, n), []).append(
                            got[system] / got["llama-server"])
    return interleaved_report(args, model, samples, ratios)


@contextlib.contextmanager
def cpu_hogs(n: int) -> Iterator[None]:
    """--hog N: N busy-loop processes at normal priority for the whole run (a loaded box)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def spread(values: list[float], digits: int = 1) -> str:
    if not values:
        return "—"
    return (f"{statistics.median(values):.{digits}f} "
            f"[{min(values):.{digits}f}–{max(values):.{digits}f}]")


def interleaved_report(args: argparse.Namespace, model: Path,
                       samples: dict[tuple[str, int], list[Sample]],
                       ratios: dict[tuple[str, int], list[float]]) -> str:
    head = ["clients", "system", "llama-server tok/s", "llamaq tok/s", "ratio (per round)",
            "TTFT ms llama-server / llamaq", "CPU ms/token llama-server / llamaq (worker)"]
    rows = []

    def med(xs: list[float | None], scale: float = 1.0) -> str:
        vals = [x * scale for x in xs if x is not None]
        return f"{statistics.median(vals):.1f}" if vals else "—"

    for n in args.concurrency:
        ref = samples.get(("llama-server", n), [])
        for system in systems_of(args)[1:]:
            ours = samples.get((system, n), [])
            rows.append([
                str(n), system, spread([x.tok_s for x in ref]), spread([x.tok_s for x in ours]),
                spread(ratios.get((system, n), []), 2),
                f"{med([x.ttft_ms for x in ref])} / {med([x.ttft_ms for x in ours])}",
                f"{med([x.cpu_per_token for x in ref], 1000)} / "
                f"{med([x.cpu_per_token for x in ours], 1000)} "
                f"({med([x.worker_cpu_per_token for x in ours], 1000)})",
            ])
    return "\n".join([
        f"# Streaming benchmark, A/B interleaved, {time.strftime('%Y-%m-%d %H:%M:%S')}",
        "",
        f"model `{model.name}`; flags `{' '.join(shared_flags(args))}`;"
        f" n_predict {args.n_predict}, ignore_eos,"
        f" temperature 0.8; {args.streams_per_client} streams one after another per client;"
        f" {args.rounds} rounds, order alternating; median [min–max];"
        f" {args.hog} busy-loop processes beside;"
        f" variants: {'; '.join(args.variant) or 'none'};"
        f" {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end;"
        f" nice {os.nice(0)}; llama-server env: {' '.join(args.llama_server_env) or 'as is'}.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" for _ in head) + "|",
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
        "Ratio: llamaq / llama-server tokens/s of the same round (above 1: llamaq faster). "
        "CPU: user+system seconds of each system's process group per generated token "
        "(llamaq's includes its api and Redis; in brackets its worker alone).",
    ]) + "\n"
