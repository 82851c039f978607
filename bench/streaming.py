"""Streaming benchmark: llamaq vs llama-server built from the same llama.cpp.

    .venv/bin/python bench/streaming.py [--only llamaq|llama-server] [--concurrency 1,4,8]
                                        [--n-predict 128] [--repeats 2]
    .venv/bin/python bench/streaming.py --rounds 3 [--concurrency 1,4,8] [--n-predict 64]

Runs one system at a time (start, measure, stop, then the other), with the same model and the
same -np/-c/-t/-b/-ub. For each concurrency N, N streaming clients POST /completion at once and
read the SSE events; we report the aggregate generated tokens/s (all tokens / wall time of the
round) and the median time to first token. A "late arrival" round starts 7 long generations and
an 8th one a second later: continuous batching should give it its first token long before the 7
others finish. See bench/README.md.

With `--rounds N`, both systems run at once (each idle while the other is measured) and the
rounds are interleaved A/B, B/A, …, so that both see the same machine load: one run gives, per
concurrency, each system's median tokens/s, the median of the per-round ratios with its spread
(min–max), the median TTFT, and CPU seconds per generated token (each system's whole process
group, and llamaq's worker process alone), read from /proc around each round.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.processes import free_port, running, server_env, wait_healthy  # noqa: E402
from storage import default_model_path  # noqa: E402

RESULTS = REPO / "bench" / "results"
SYSTEMS = ("llama-server", "llamaq")
DEFAULT_LLAMA_SERVER = Path.home() / ".cache" / "llamaq-bench" / "bin" / "llama-server"
# About 30 tokens with the Gemma 3 tokenizer. Each request gets its own prefix (round and
# client number), so no two requests share a prompt prefix; cache_prompt is off as well.
PROMPT = ("Write a long story about a lighthouse keeper who finds a strange glowing bottle on "
          "the beach one stormy night, and what happens next in the village.")
ROUND_TIMEOUT_S = 120.0
LATE_DELAY_S = 1.0


@dataclass
class Stream:
    """What one streaming client saw."""

    start: float
    first_token: float | None = None
    end: float | None = None
    tokens: int = 0
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start


@dataclass
class Round:
    concurrency: int
    streams: list[Stream]
    wall_s: float

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.streams)

    @property
    def errors(self) -> list[str]:
        return [s.error for s in self.streams if s.error]


@dataclass
class Late:
    ttft_s: float | None
    first_of_others_done_s: float | None
    joined: bool
    errors: list[str]


@dataclass
class Result:
    system: str
    rounds: dict[int, list[Round]] = field(default_factory=dict)
    late: Late | None = None
    failure: str | None = None
    load: str = ""

    def best(self, n: int) -> Round | None:
        """The round with the most tokens/s: noise from other work only ever slows down."""
        rounds = self.rounds.get(n, [])  # with errors or timeouts too: see the notes
        return max(rounds, key=lambda r: r.tokens / r.wall_s) if rounds else None

    def tok_s(self, n: int) -> float | None:
        best = self.best(n)
        return None if best is None else best.tokens / best.wall_s

    def ttft_ms(self, n: int) -> float | None:
        best = self.best(n)
        ttfts = [] if best is None else [s.ttft for s in best.streams if s.ttft is not None]
        return statistics.median(ttfts) * 1000 if ttfts else None

    def errors(self, n: int) -> list[str]:
        return [e for r in self.rounds.get(n, []) for e in r.errors]

    def late_ttft_ms(self) -> float | None:
        return None if self.late is None or self.late.ttft_s is None else self.late.ttft_s * 1000

    def late_joined(self) -> str:
        return "—" if self.late is None else ("yes" if self.late.joined else "no")


# ---------------------------------------------------------------- clients


def body(prompt: str, n_predict: int, seed: int) -> dict[str, object]:
    return {"prompt": prompt, "n_predict": n_predict, "stream": True, "ignore_eos": True,
            "temperature": 0.8, "seed": seed, "cache_prompt": False}


async def stream_one(client: httpx.AsyncClient, url: str, payload: dict[str, object],
                     result: Stream) -> None:
    """Fill `result` as the stream goes, so a round that times out still shows what it got."""
    predicted: int | None = None
    try:
        async with client.stream("POST", url + "/completion", json=payload) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                result.error = f"HTTP {response.status_code}: {text[:200]}"
                return
            async for line in response.aiter_lines():
                if line.startswith("error:"):
                    result.error = line[:200]
                    break
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    result.error = json.dumps(event["error"])[:200]
                    break
                tokens = event.get("tokens") or []
                if (tokens or event.get("content")) and result.first_token is None:
                    result.first_token = time.perf_counter()
                result.tokens += len(tokens)
                if event.get("stop"):
                    predicted = event.get("tokens_predicted")
                    break
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:200]
    finally:
        result.end = time.perf_counter()
    if isinstance(predicted, int):
        result.tokens = predicted


async def gather_streams(url: str, requests: list[tuple[float, dict[str, object]]]
                         ) -> tuple[list[Stream], float]:
    """Send each request after its delay (s); returns the streams (in order) and the wall time.
    Streams still running after ROUND_TIMEOUT_S are cancelled and marked, keeping what came."""
    streams = [Stream(start=0.0) for _ in requests]
    async with httpx.AsyncClient(timeout=None) as client:

        async def one(stream: Stream, delay: float, payload: dict[str, object]) -> None:
            await asyncio.sleep(delay)
            stream.start = time.perf_counter()
            await stream_one(client, url, payload, stream)

        start = time.perf_counter()
        tasks = {asyncio.create_task(one(s, d, p)): s
                 for s, (d, p) in zip(streams, requests, strict=True)}
        _, pending = await asyncio.wait(tasks, timeout=ROUND_TIMEOUT_S)
        for task in pending:
            task.cancel()
            tasks[task].error = f"timed out after {ROUND_TIMEOUT_S:.0f} s"
        await asyncio.gather(*pending, return_exceptions=True)
        return streams, time.perf_counter() - start


async def run_round(url: str, concurrency: int, n_predict: int, tag: str) -> Round:
    streams, wall = await gather_streams(url, [
        (0.0, body(f"[{tag} client {i}] {PROMPT}", n_predict, i)) for i in range(concurrency)])
    return Round(concurrency, streams, wall)


async def run_clients(url: str, concurrency: int, n_predict: int, tag: str,
                      per_client: int) -> Round:
    """`concurrency` clients at once, each sending `per_client` streams one after another
    (a new one as soon as its last one ends); the wall time spans them all."""
    rounds = []
    start = time.perf_counter()

    async def client(i: int) -> None:
        for k in range(per_client):
            streams, _ = await gather_streams(url, [(0.0, body(
                f"[{tag} client {i} stream {k}] {PROMPT}", n_predict, i))])
            rounds.extend(streams)

    await asyncio.gather(*(client(i) for i in range(concurrency)))
    return Round(concurrency, rounds, time.perf_counter() - start)


async def run_late(url: str, n_predict: int) -> Late:
    requests = [(0.0, body(f"[late long {i}] {PROMPT}", 2 * n_predict, i)) for i in range(7)]
    requests.append((LATE_DELAY_S, body(f"[late 8] {PROMPT}", n_predict, 7)))
    streams, _ = await gather_streams(url, requests)
    *others, mine = streams
    ends = [s.end for s in others if s.end is not None and not s.error]
    first_done = min(ends) if ends else None
    joined = (mine.first_token is not None
              and (first_done is None or mine.first_token < first_done))
    return Late(ttft_s=mine.ttft,
                first_of_others_done_s=None if first_done is None else first_done - mine.start,
                joined=joined,
                errors=[s.error for s in streams if s.error])


async def measure(result: Result, url: str, concurrency: list[int], n_predict: int,
                  repeats: int) -> None:
    warm = await run_round(url, 1, n_predict, "warm-up")
    if warm.errors:
        raise RuntimeError(f"warm-up failed: {warm.errors[0]}")
    for n in concurrency:
        for r in range(repeats):
            done = await run_round(url, n, n_predict, f"c{n} r{r}")
            result.rounds.setdefault(n, []).append(done)
            print(f"  {result.system}: c={n} round {r}: {done.tokens} tokens in "
                  f"{done.wall_s:.2f} s = {done.tokens / done.wall_s:.1f} tok/s"
                  + (f", errors: {done.errors}" if done.errors else ""), flush=True)
    result.late = await run_late(url, n_predict)
    print(f"  {result.system}: late arrival: ttft {fmt_s(result.late.ttft_s)}, first of the 7 "
          f"done at {fmt_s(result.late.first_of_others_done_s)}, joined: {result.late.joined}",
          flush=True)


# ---------------------------------------------------------------- servers


def command(system: str, binary: Path, model: Path, port: int, shared: list[str]) -> list[str]:
    """llama-server, or `llamaq up` (for "llamaq" and every llamaq variant "llamaq:NAME")."""
    if system == "llama-server":
        return [str(binary), "-m", str(model), *shared, "--host", "127.0.0.1",
                "--port", str(port)]
    return [str(REPO / ".venv" / "bin" / "llamaq"), "up", "-m", str(model), *shared,
            "--host", "127.0.0.1", "--port", str(port)]


def system_env(system: str, args: argparse.Namespace) -> dict[str, str]:
    """--llama-server-env KEY=VALUE: for llama-server only (e.g. OMP_WAIT_POLICY=PASSIVE, to
    compare serving with the same ggml thread behaviour); --variant NAME:KEY=VALUE,...: the
    environment of the llamaq system "llamaq:NAME"."""
    if system == "llama-server":
        return dict(item.split("=", 1) for item in args.llama_server_env)
    return variant_envs(args).get(system, {})


def variant_envs(args: argparse.Namespace) -> dict[str, dict[str, str]]:
    """--variant NAME:KEY=VALUE,KEY=VALUE (repeatable) as {"llamaq:NAME": {KEY: VALUE}}."""
    variants = {}
    for item in args.variant:
        name, _, pairs = item.partition(":")
        variants[f"llamaq:{name}"] = dict(p.split("=", 1) for p in pairs.split(",") if p)
    return variants


def systems_of(args: argparse.Namespace) -> tuple[str, ...]:
    return (*SYSTEMS, *variant_envs(args))


def bench_system(system: str, args: argparse.Namespace, model: Path, log: Path) -> Result:
    result = Result(system)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    shared = ["-np", str(args.parallel), "-c", str(args.ctx_size), "-t", str(args.threads),
              "-b", str(args.batch_size), "-ub", str(args.ubatch_size)]
    cmd = command(system, args.llama_server, model, port, shared)
    print(f"{system}: {' '.join(cmd)}  (log: {log})", flush=True)
    load_before = os.getloadavg()[0]
    with running(cmd, log, server_env(system_env(system, args))) as process:
        try:
            ready = wait_healthy(url, args.start_timeout, process)
            print(f"  {system}: healthy after {ready:.1f} s", flush=True)
            asyncio.run(measure(result, url, args.concurrency, args.n_predict, args.repeats))
        except (RuntimeError, TimeoutError) as exc:
            result.failure = f"{type(exc).__name__}: {exc}"
            print(f"  {system}: FAILED: {result.failure}", flush=True)
    result.load = f"{load_before:.1f} → {os.getloadavg()[0]:.1f}"
    return result


# ---------------------------------------------------------------- A/B interleaved rounds


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
    shared = ["-np", str(args.parallel), "-c", str(args.ctx_size), "-t", str(args.threads),
              "-b", str(args.batch_size), "-ub", str(args.ubatch_size)]
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
        f"model `{model.name}`; flags `-np {args.parallel} -c {args.ctx_size} -t {args.threads}"
        f" -b {args.batch_size} -ub {args.ubatch_size}`; n_predict {args.n_predict}, ignore_eos,"
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


# ---------------------------------------------------------------- report


def fmt(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def fmt_s(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f} s"


def ratio(ours: float | None, theirs: float | None) -> str:
    return "—" if ours is None or theirs is None or theirs == 0 else f"{ours / theirs:.2f}"


def report(results: dict[str, Result], args: argparse.Namespace, model: Path) -> str:
    both = len(results) == 2
    ref, ours = results.get("llama-server"), results.get("llamaq")
    names = [s for s in SYSTEMS if s in results]
    head = ["metric", *names, *(["llamaq / llama-server"] if both else [])]
    rows: list[list[str]] = []

    def row(label: str, values: dict[str, float | None], digits: int = 1) -> None:
        cells = [fmt(values[s], digits) for s in names]
        rows.append([label, *cells, *([ratio(values["llamaq"], values["llama-server"])]
                                       if both else [])])

    for n in args.concurrency:
        row(f"c={n} tokens/s (aggregate)", {s: results[s].tok_s(n) for s in names})
        row(f"c={n} TTFT median (ms)", {s: results[s].ttft_ms(n) for s in names}, 0)
    row("late 8th: TTFT (ms)", {s: results[s].late_ttft_ms() for s in names}, 0)
    rows.append(["late 8th: first token before any of the 7 finished",
                 *[results[s].late_joined() for s in names], *([""] if both else [])])
    lines = [
        f"# Streaming benchmark, {time.strftime('%Y-%m-%d %H:%M:%S')}",
        "",
        f"model `{model.name}`; flags `-np {args.parallel} -c {args.ctx_size} -t {args.threads}"
        f" -b {args.batch_size} -ub {args.ubatch_size}`; n_predict {args.n_predict}, ignore_eos,"
        f" temperature 0.8, seed = client index, cache_prompt false, distinct prompts;"
        f" best of {args.repeats} round(s) per concurrency after 1 warm-up request;"
        f" late arrival: 7 x"
        f" n_predict {2 * args.n_predict}, 8th after {LATE_DELAY_S:.0f} s; {os.cpu_count()} CPUs.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" for _ in head) + "|",
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
        "1-minute load average before → after each system's run: "
        + ", ".join(f"{s} {results[s].load}" for s in names) + ".",
    ]
    notes: list[str] = []
    for s in names:
        r = results[s]
        if r.failure:
            notes.append(f"- {s} failed: {r.failure}")
        for n in args.concurrency:
            if r.errors(n):
                notes.append(f"- {s} c={n}: {len(r.errors(n))} errors, first: {r.errors(n)[0]}")
        if r.late and r.late.errors:
            notes.append(f"- {s} late arrival: errors: {r.late.errors[0]}")
    if ref and ours:
        lines += ["", "Ratios: tokens/s above 1 means llamaq is faster; TTFT above 1 means "
                      "llamaq is slower to first token."]
    return "\n".join([*lines, *([""] if notes else []), *notes]) + "\n"


# ---------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=SYSTEMS, help="bench one system only")
    parser.add_argument("--concurrency", default="1,4,8",
                        type=lambda s: [int(x) for x in s.split(",") if x],
                        help="comma-separated client counts (default: 1,4,8)")
    parser.add_argument("--n-predict", type=int, default=128, help="tokens per request")
    parser.add_argument("--repeats", type=int, default=2,
                        help="rounds per concurrency; the best one is reported (default: 2)")
    parser.add_argument("-np", "--parallel", type=int, default=8, help="slots (both systems)")
    parser.add_argument("-c", "--ctx-size", type=int, default=8192)
    parser.add_argument("-t", "--threads", type=int, default=2)
    parser.add_argument("-b", "--batch-size", type=int, default=2048)
    parser.add_argument("-ub", "--ubatch-size", type=int, default=512)
    parser.add_argument("--llama-server", type=Path,
                        default=Path(os.environ.get("LLAMA_SERVER_BIN", DEFAULT_LLAMA_SERVER)),
                        help="llama-server binary (bench/build_llama_server.sh builds it)")
    parser.add_argument("--model", type=Path, help="GGUF (default: Gemma 3 270M Q4_K_M)")
    parser.add_argument("--start-timeout", type=float, default=120.0)
    parser.add_argument("--llama-server-env", action="append", default=[], metavar="KEY=VALUE",
                        help="environment for llama-server only (repeatable), e.g. "
                             "OMP_WAIT_POLICY=PASSIVE as llamaq's worker sets it")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE,...",
                        help="A/B rounds: one more llamaq system, 'llamaq:NAME', run with this "
                             "environment (repeatable), e.g. spin:GOMP_SPINCOUNT=30000")
    parser.add_argument("--streams-per-client", type=int, default=3,
                        help="A/B rounds: streams each client sends one after another")
    parser.add_argument("--hog", type=int, default=0,
                        help="busy-loop processes running beside both systems (a loaded box)")
    parser.add_argument("--rounds", type=int, default=0,
                        help="A/B interleaved: both systems up, N rounds alternating order; "
                             "reports the ratio's median and spread (see the module doc)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    systems = [args.only] if args.only else list(SYSTEMS)
    if "llama-server" in systems and not args.llama_server.is_file():
        sys.exit(f"no llama-server at {args.llama_server}: run bench/build_llama_server.sh")
    model = args.model or default_model_path(REPO / ".llamaq" / "cache")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.rounds > 0:
        text = interleaved(args, model, stamp)
        out = RESULTS / f"streaming-{stamp}-ab.md"
        out.write_text(text)
        print("\n" + text + f"\nwritten to {out}")
        return 0
    results = {s: bench_system(s, args, model, RESULTS / f"streaming-{stamp}-{s}.log")
               for s in systems}
    text = report(results, args, model)
    out = RESULTS / f"streaming-{stamp}.md"
    out.write_text(text)
    print("\n" + text + f"\nwritten to {out}")
    return 1 if any(r.failure for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
