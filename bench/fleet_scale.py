"""The fleet at scale (issue 44): a load generator against llamaq api pods over simulated
workers (`llamaq worker --simulate`), reporting throughput, latencies, the delay the fleet adds
to each token and the CPU each process spent per token.

Open loop (`--rate R`: requests at Poisson arrivals, R a second) or closed loop (`--users N`:
N clients, each sending its next request when the last ended); streamed or not; prompt and
output lengths from a distribution (`--prompt-words`, `--output-tokens`: `N`, `A-B` uniform
or `expN` exponential with mean N); a shared prefix (`--shared-prefix W` words that every
prompt starts with). The load runs in `--gen-procs` processes of its own (aiohttp: one
session each). CPU time per process is read from /proc (utime + stime) before and after:
the api pods, the worker processes, Redis and the generators themselves, because they all
share the box's cores. Redis's commands are counted from INFO commandstats.

    python -m bench.fleet_scale --users 500 --seconds 20 --output-tokens 200 \
        --workers 4 --sim-workers 5 -np 32 --sim-itl-ms 50

starts its own Redis, api pod(s) and simulated workers (or `--api URL --redis-url URL
--pids api=..,worker=..` to measure a fleet already running), and writes
bench/results/fleet_scale-<time>.json. docs/scale.md holds the measured table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import statistics
import sys
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench.processes import REPO, free_port, running, server_env, wait_healthy

TICK = os.sysconf("SC_CLK_TCK")
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa",
         "lambda", "mu", "nu", "xi"]


def draw(spec: str, rng: random.Random) -> int:
    """A length from `N`, `A-B` (uniform) or `expN` (exponential, mean N)."""
    if spec.startswith("exp"):
        return max(1, int(rng.expovariate(1 / float(spec[3:]))))
    if "-" in spec:
        low, high = spec.split("-")
        return rng.randint(int(low), int(high))
    return int(spec)


@dataclass
class Shot:
    """One request as its client saw it."""

    status: int = 0
    started: float = 0.0
    """time.perf_counter() at the send (CLOCK_MONOTONIC: comparable across the generators)."""
    ttft_s: float = 0.0
    total_s: float = 0.0
    tokens: int = 0
    """Tokens generated (the final chunk's tokens_predicted)."""
    events: int = 0
    """Streamed chunks with tokens (fewer than tokens under --stream-interval)."""
    gaps_ms: list[float] = field(default_factory=list)
    error: str = ""
    retry_after: bool = False


@dataclass
class GenConfig:
    url: str
    stream: bool
    rate: float
    users: int
    seconds: float
    prompt_words: str
    output_tokens: str
    shared_prefix: int
    seed: int
    ramp_s: float = 0.0


def prompt_of(config: GenConfig, rng: random.Random) -> str:
    prefix = " ".join(WORDS[i % len(WORDS)] for i in range(config.shared_prefix))
    own = " ".join(rng.choice(WORDS) for _ in range(draw(config.prompt_words, rng)))
    return f"{prefix} {rng.random():.6f} {own}"


async def shoot(session: Any, config: GenConfig, rng: random.Random) -> Shot:
    body = {"prompt": prompt_of(config, rng), "n_predict": draw(config.output_tokens, rng),
            "stream": config.stream, "ignore_eos": True, "cache_prompt": True}
    shot = Shot()
    start = last = shot.started = time.perf_counter()
    try:
        async with session.post(config.url + "/completion", json=body) as response:
            shot.status = response.status
            if response.status != 200:
                shot.retry_after = "Retry-After" in response.headers
                shot.error = (await response.read())[:200].decode(errors="replace")
                shot.total_s = time.perf_counter() - start
                return shot
            if not config.stream:
                data = json.loads(await response.read())
                shot.tokens = data.get("tokens_predicted", 0)
                shot.ttft_s = shot.total_s = time.perf_counter() - start
                return shot
            async for line in response.content:
                if not line.startswith(b"data: "):
                    continue
                now = time.perf_counter()
                if b'"error"' in line[:20]:
                    shot.error = line[:200].decode(errors="replace")
                    break
                if b'"stop":true' in line:
                    shot.tokens = json.loads(line[6:]).get("tokens_predicted", shot.events)
                    break
                if shot.events == 0:
                    shot.ttft_s = now - start
                else:
                    shot.gaps_ms.append((now - last) * 1000)
                shot.events += 1
                last = now
    except Exception as error:  # counted: an errored request
        shot.error = repr(error)[:200]
    shot.total_s = time.perf_counter() - start
    return shot


async def generate(config: GenConfig) -> list[Shot]:
    import aiohttp

    rng = random.Random(config.seed)
    shots: list[Shot] = []
    until = time.perf_counter() + config.seconds
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=config.seconds + config.ramp_s + 120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        if config.users:
            async def user(n: int) -> None:
                own = random.Random(config.seed * 1000 + n)
                await asyncio.sleep(config.ramp_s * n / config.users)
                while time.perf_counter() < until:
                    shots.append(await shoot(session, config, own))

            await asyncio.gather(*(user(n) for n in range(config.users)))
        else:
            tasks = []
            at = time.perf_counter()
            while at < until:
                at += rng.expovariate(config.rate)
                await asyncio.sleep(max(0.0, at - time.perf_counter()))
                tasks.append(asyncio.create_task(shoot(session, config, rng)))
            shots = list(await asyncio.gather(*tasks))
    return shots


def generator_process(config: GenConfig, out: Any) -> None:
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    shots = asyncio.run(generate(config))
    out.send([asdict(s) for s in shots])
    out.close()


def cpu_s(pid: int) -> float:
    """utime + stime of the process and its children that exist now, in seconds."""
    total = 0.0
    for p in [pid, *descendants(pid)]:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / TICK
        except (FileNotFoundError, ProcessLookupError, IndexError):
            pass
    return total


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def redis_calls(client: redis.Redis) -> int:
    return sum(redis_calls_by_command(client).values())


def redis_calls_by_command(client: redis.Redis) -> dict[str, int]:
    stats: dict[str, dict[str, int]] = client.info("commandstats")  # type: ignore[assignment]
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


class ScriptSplit:
    """Counts, from MONITOR, the commands clients sent (top level: one round trip's worth of
    dispatch each, EVAL included) apart from those scripts ran inside (`[0 lua]`): INFO
    commandstats counts both alike. MONITOR costs Redis CPU: the CPU figures of a run with
    it are not comparable (its command counts are)."""

    def __init__(self, redis_url: str, log_path: str = "") -> None:
        import threading
        self.top = 0
        self.inner = 0
        self._log = open(log_path, "w") if log_path else None  # noqa: SIM115
        """Every command as MONITOR shows it, one a line (--monitor-log)."""
        self._client = redis.Redis.from_url(redis_url)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)

    def __enter__(self) -> ScriptSplit:
        self._monitor = self._client.monitor().__enter__()
        self._thread.start()
        return self

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                command = self._monitor.next_command()
            except Exception:  # the connection closed at the end
                return
            if command.get("client_type") == "lua":
                self.inner += 1
            else:
                self.top += 1
            if self._log is not None:
                line = f"{command.get('client_type')} {command.get('command')}"
                self._log.write(line[:300] + "\n")

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._client.close()
        self._monitor.connection.disconnect()
        self._thread.join(timeout=5)
        if self._log is not None:
            self._log.close()


def most_open(shots: list[Shot]) -> tuple[int, float, float]:
    """The most streams open at once, and for how long (seconds) at least 99 % of that many
    were open, and at least 99 % of that many were generating (past their first token)."""
    opened = [(s.started, s.started + s.total_s) for s in shots]
    generating = [(s.started + s.ttft_s, s.started + s.total_s) for s in shots
                  if s.ttft_s and s.events]

    def stretch(spans: list[tuple[float, float]], floor: float) -> tuple[int, float]:
        edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
        count, peak, held, since = 0, 0, 0.0, None
        for at, step in edges:
            count += step
            peak = max(peak, count)
            if count >= floor and since is None:
                since = at
            elif count < floor and since is not None:
                held, since = max(held, at - since), None
        return peak, held

    peak, _ = stretch(opened, 0)
    _, held_open = stretch(opened, 0.99 * peak)
    _, held_generating = stretch(generating, 0.99 * peak)
    return peak, held_open, held_generating


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def start_fleet(args: argparse.Namespace, stack: ExitStack, logs: Path) -> tuple[
        list[str], str, dict[str, list[int]]]:
    """Redis, the workers, the api pods; their URLs and pids by role."""
    env = server_env({"LLAMAQ_LOG_LEVEL": "warning"})
    port = free_port()
    redis_proc = stack.enter_context(running(
        ["redis-server", "--port", str(port), "--save", "", "--appendonly", "no"],
        logs / "redis.log", env))
    redis_url = f"redis://127.0.0.1:{port}/0"
    env["LLAMAQ_REDIS_URL"] = redis_url
    time.sleep(0.5)
    me = [sys.executable, "-m", "llamaq"]
    common = ["-m", "simulated", "--store-url", str(logs / "store"), "--cache-dir",
              str(logs / "cache"), "-lv", "2"]
    pids: dict[str, list[int]] = {"redis": [redis_proc.pid], "worker": [], "api": []}
    for i in range(args.workers):
        flags = ["--simulate", "--sim-workers", str(args.sim_workers), "-np", str(args.np),
                 "--sim-itl-ms", str(args.sim_itl_ms), "--sim-prefill-tps",
                 str(args.sim_prefill_tps), "--sim-eos-tokens", "100000",
                 *args.worker_flags.split()]
        cmd = [*(["taskset", "-c", args.worker_cpus] if args.worker_cpus else []), *me,
               "worker", *common, *flags]
        pids["worker"].append(stack.enter_context(running(cmd, logs / f"worker-{i}.log",
                                                          env)).pid)
    urls = []
    for i in range(args.apis):
        api_port = free_port()
        cpus = args.api_cpus.split(";")[i] if args.api_cpus else ""
        cmd = [*(["taskset", "-c", cpus] if cpus else []), *me, "api", *common, "--port",
               str(api_port), *args.api_flags.split()]
        process = stack.enter_context(running(cmd, logs / f"api-{i}.log", env))
        pids["api"].append(process.pid)
        urls.append(f"http://127.0.0.1:{api_port}")
        wait_healthy(urls[-1], process=process)
    want = args.workers * args.sim_workers * args.np
    deadline = time.monotonic() + 300
    if not urls:  # no api (bench/idle_fleet.py): the registry says who is up
        client = redis.Redis.from_url(redis_url)
        while client.zcard("llamaq:model:simulated:workers") < args.workers * args.sim_workers:
            if time.monotonic() > deadline:
                raise TimeoutError("fewer workers registered than started")
            time.sleep(0.5)
        return urls, redis_url, pids
    import httpx
    while httpx.get(urls[0] + "/props").json().get("total_slots", 0) < want:
        if time.monotonic() > deadline:
            raise TimeoutError(f"fewer than {want} slots registered")
        time.sleep(0.5)
    return urls, redis_url, pids


def measure(args: argparse.Namespace, urls: list[str], redis_url: str,
            pids: dict[str, list[int]]) -> dict[str, Any]:
    client = redis.Redis.from_url(redis_url)
    ctx = multiprocessing.get_context("spawn")
    procs, pipes = [], []
    for g in range(args.gen_procs):
        config = GenConfig(url=urls[g % len(urls)], stream=not args.no_stream,
                           rate=args.rate / args.gen_procs,
                           users=args.users // args.gen_procs, seconds=args.seconds,
                           prompt_words=args.prompt_words, output_tokens=args.output_tokens,
                           shared_prefix=args.shared_prefix, seed=args.seed + g,
                           ramp_s=args.ramp)
        receive, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=generator_process, args=(config, send))
        procs.append(proc)
        pipes.append(receive)
    cpu_before = {role: sum(cpu_s(p) for p in ps) for role, ps in pids.items()}
    by_command_before = redis_calls_by_command(client)
    calls_before = sum(by_command_before.values())
    started = time.perf_counter()
    split = (ScriptSplit(redis_url, args.monitor_log).__enter__()
             if args.split_scripts or args.monitor_log else None)
    for proc in procs:
        proc.start()
    gen_cpu: dict[int, float] = {}
    shots: list[Shot] = []
    for proc, pipe in zip(procs, pipes, strict=True):
        while not pipe.poll(0.5):
            assert proc.pid is not None
            gen_cpu[proc.pid] = max(gen_cpu.get(proc.pid, 0.0), cpu_s(proc.pid))
        shots += [Shot(**s) for s in pipe.recv()]
        assert proc.pid is not None
        gen_cpu[proc.pid] = max(gen_cpu.get(proc.pid, 0.0), cpu_s(proc.pid))
        proc.join()
    wall = time.perf_counter() - started
    cpu = {role: sum(cpu_s(p) for p in ps) - cpu_before[role] for role, ps in pids.items()}
    cpu["generator"] = sum(gen_cpu.values())
    if split is not None:
        split.__exit__()
    by_command_after = redis_calls_by_command(client)
    calls = sum(by_command_after.values()) - calls_before
    by_command = {name: n - by_command_before.get(name, 0)
                  for name, n in by_command_after.items()}
    ok = [s for s in shots if s.status == 200 and not s.error]
    tokens = sum(s.tokens for s in ok)
    window = (max((s.started + s.total_s for s in shots), default=0.0)
              - min((s.started for s in shots), default=0.0)) or wall
    gaps = [g for s in ok for g in s.gaps_ms]
    added = [g - args.sim_itl_ms for g in gaps]
    refused = [s for s in shots if s.status in (429, 503)]
    per_token = {role: (seconds / tokens * 1e6 if tokens else 0.0)
                 for role, seconds in cpu.items()}
    stream_s = sum(s.total_s for s in shots) if not args.no_stream else 0.0
    """Seconds that streams were open, all of them: what a slow stream costs goes by it."""
    peak, held_open, held_generating = most_open(shots)
    return {
        "config": {k: v for k, v in vars(args).items()},
        "load_average": os.getloadavg(),
        "wall_s": wall, "window_s": window,
        "requests": len(shots), "ok": len(ok),
        "errored": len([s for s in shots if s.error and s.status not in (429, 503)]),
        "refused": len(refused),
        "refused_with_retry_after": len([s for s in refused if s.retry_after]),
        "refused_p50_ms": pct([s.total_s * 1000 for s in refused], 0.5),
        "refused_p99_ms": pct([s.total_s * 1000 for s in refused], 0.99),
        "errored_after_start": len([s for s in shots if s.status == 200 and s.error]),
        "offered_tokens_per_s": args.rate * statistics.fmean(
            [draw(args.output_tokens, random.Random(i)) for i in range(200)])
        if args.rate else 0.0,
        "tokens": tokens, "tokens_per_s": tokens / window,
        "tokens_per_event": tokens / max(1, sum(s.events for s in ok)) if not args.no_stream
        else 0.0,
        "requests_per_s": len(ok) / window,
        "ttft_ms": {"p50": pct([s.ttft_s * 1000 for s in ok], 0.5),
                    "p99": pct([s.ttft_s * 1000 for s in ok], 0.99)},
        "itl_ms": {"p50": pct(gaps, 0.5), "p99": pct(gaps, 0.99),
                   "mean": statistics.fmean(gaps) if gaps else 0.0},
        "added_itl_ms": {"p50": pct(added, 0.5), "p99": pct(added, 0.99)},
        "cpu_s": cpu, "cpu_us_per_token": per_token,
        "fleet_cpu_us_per_token": per_token.get("api", 0) + per_token.get("worker", 0)
        + per_token.get("redis", 0),
        "stream_s": stream_s, "open_streams_max": peak,
        "open_streams_held_s": {"open": held_open, "generating": held_generating},
        "cpu_us_per_stream_s": {role: seconds / stream_s * 1e6 if stream_s else 0.0
                                for role, seconds in cpu.items()},
        "redis_commands_per_stream_s": calls / stream_s if stream_s else 0.0,
        "redis_commands": calls, "redis_commands_per_token": calls / tokens if tokens else 0,
        "redis_commands_per_request": calls / len(ok) if ok else 0,
        "redis_commands_split_per_token": {} if split is None or not tokens else {
            "top_level": split.top / tokens, "in_scripts": split.inner / tokens},
        "redis_commands_split_per_request": {} if split is None or not ok else {
            "top_level": split.top / len(ok), "in_scripts": split.inner / len(ok)},
        "redis_commands_by_name_per_request": {
            name: round(n / len(ok), 2) for name, n in
            sorted(by_command.items(), key=lambda item: -item[1]) if n and ok},
        "rss_mib": {role: sum(rss_mib(p) for p in ps) for role, ps in pids.items()
                    if role != "redis"},
        "errors_sample": [s.error for s in shots if s.error][:5],
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=float, default=0.0, help="open loop: requests a second")
    p.add_argument("--users", type=int, default=0, help="closed loop: concurrent clients")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--ramp", type=float, default=0.0,
                   help="closed loop: the users start evenly over this many seconds")
    p.add_argument("--no-stream", action="store_true")
    p.add_argument("--prompt-words", default="20")
    p.add_argument("--output-tokens", default="200")
    p.add_argument("--shared-prefix", type=int, default=0)
    p.add_argument("--gen-procs", type=int, default=1)
    p.add_argument("--seed", type=int, default=44)
    p.add_argument("--api", default="", help="measure this api (no fleet started)")
    p.add_argument("--redis-url", default="")
    p.add_argument("--pids", default="", help="role=pid,pid;role=pid (with --api)")
    p.add_argument("--apis", type=int, default=1)
    p.add_argument("--workers", type=int, default=2, help="simulated worker processes")
    p.add_argument("--sim-workers", type=int, default=5, help="simulated workers in each")
    p.add_argument("-np", type=int, default=32)
    p.add_argument("--sim-itl-ms", type=float, default=50.0)
    p.add_argument("--sim-prefill-tps", type=float, default=20000.0)
    p.add_argument("--worker-flags", default="")
    p.add_argument("--api-flags", default="")
    p.add_argument("--api-cpus", default="", help="taskset lists per api pod, `;`-separated")
    p.add_argument("--worker-cpus", default="")
    p.add_argument("--out", default="")
    p.add_argument("--split-scripts", action="store_true",
                   help="count top-level commands apart from those inside scripts (MONITOR)")
    p.add_argument("--monitor-log", default="",
                   help="write every command MONITOR shows to this file (implies "
                        "--split-scripts)")
    args = p.parse_args(argv)
    if bool(args.rate) == bool(args.users):
        p.error("give one of --rate (open loop) or --users (closed loop)")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    logs = REPO / "bench" / "results" / f"fleet_scale-{stamp}"
    logs.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        if args.api:
            urls, redis_url = [args.api], args.redis_url
            pids = {role: [int(p) for p in ps.split(",")] for role, ps in
                    (part.split("=") for part in args.pids.split(";") if part)}
        else:
            urls, redis_url, pids = start_fleet(args, stack, logs)
        report = measure(args, urls, redis_url, pids)
    out = Path(args.out) if args.out else logs.with_suffix(".json")
    out.write_text(json.dumps(report, indent=1))
    brief = {k: report[k] for k in ("load_average", "window_s", "requests", "ok", "errored",
                                    "refused", "refused_with_retry_after", "refused_p50_ms",
                                    "refused_p99_ms", "errored_after_start",
                                    "offered_tokens_per_s", "tokens_per_s", "tokens_per_event",
                                    "requests_per_s", "ttft_ms",
                                    "itl_ms", "added_itl_ms", "cpu_us_per_token",
                                    "fleet_cpu_us_per_token", "stream_s",
                                    "open_streams_max", "open_streams_held_s",
                                    "cpu_us_per_stream_s", "redis_commands_per_stream_s",
                                    "redis_commands_per_token",
                                    "redis_commands_per_request",
                                    "redis_commands_split_per_token",
                                    "redis_commands_split_per_request",
                                    "redis_commands_by_name_per_request",
                                    "rss_mib", "errors_sample")}
    print(json.dumps(brief, indent=1))
    print(f"written: {out.relative_to(REPO) if out.is_relative_to(REPO) else out}")


if __name__ == "__main__":
    main()
