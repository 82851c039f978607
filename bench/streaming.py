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
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.processes import free_port, running, server_env, wait_healthy  # noqa: E402
from bench.stream_clients import (  # noqa: E402
    LATE_DELAY_S,
    Late,
    Round,
    run_late,
    run_round,
)
from bench.stream_systems import (  # noqa: E402
    DEFAULT_LLAMA_SERVER,
    RESULTS,
    SYSTEMS,
    command,
    shared_flags,
    system_env,
)
from bench.streaming_ab import interleaved  # noqa: E402
from storage import default_model_path  # noqa: E402


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


def bench_system(system: str, args: argparse.Namespace, model: Path, log: Path) -> Result:
    result = Result(system)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    shared = shared_flags(args)
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
        f"model `{model.name}`; flags `{' '.join(shared_flags(args))}`;"
        f" n_predict {args.n_predict}, ignore_eos,"
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
    parser.add_argument("--server-flags", default="", metavar="FLAGS",
                        help='more flags for both systems, e.g. "-ngl 99" (bench/gpu/run)')
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
