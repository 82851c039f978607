"""Speculative decoding, llamaq against llama-server: tok/s with and without speculation on both,
side by side under the same flags, A/B interleaved.

Four servers stay up for the whole run (llama-server and `llamaq up`, each plain and with the
speculative flags); every round measures each (workload, clients) cell on all four, in an order
that alternates from round to round, so the rest of the machine loads them alike. Workloads:
`code-edit` (a ~300-line Python file to repeat with one small change) and `summarise` (a
document to summarise). Each client sends one greedy `POST /completion` (`cache_prompt: false`,
`n_predict`), all at once; tok/s is the generation's, from each answer's timings
(predicted_n / predicted_ms, summed over the clients: the prompt's time is left out). The report
gives per cell both servers' tok/s plain and speculating, each server's speedup, the ratio of
the speedups (llamaq's / llama-server's: the issue's target is >= 1.0) and the acceptance rate
(draft_n_accepted / draft_n); it is written to bench/results/speculative-<stamp>.md.

    .venv/bin/python bench/speculative.py                       # ngram-mod, 1 and 4 clients
    .venv/bin/python bench/speculative.py --spec "--spec-type ngram-simple" --rounds 5
    .venv/bin/python bench/speculative.py --rounds 1 --clients 1 --n-predict 32 \\
        --workloads code-edit                                   # a smoke run
    .venv/bin/python bench/speculative.py --draft-self          # draft-simple: the model
                                                                # drafting for itself
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import statistics
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.processes import REPO, free_port, running, server_env, wait_healthy
from storage.models import default_model_path

DEFAULT_LLAMA_SERVER = Path.home() / ".cache" / "llamaq-bench" / "bin" / "llama-server"
RESULTS = REPO / "bench" / "results"
SYSTEMS = ("llama-server", "llamaq")


def code_file(lines: int = 300) -> str:
    """A ~300-line Python module of small handlers, alike but not the same."""
    out = ['"""Request handlers."""', "", "from __future__ import annotations", ""]
    i = 0
    while len(out) < lines:
        out += [f"def handle_{i}(request: dict[str, int]) -> int:",
                f'    """Handle request kind {i}."""',
                f"    value = request.get('key_{i}', {i})",
                f"    if value > {i * 3}:",
                f"        return value - {i}",
                "    return value * 2", "", ""]
        i += 1
    return "\n".join(out[:lines])


def document() -> str:
    paragraphs = [
        f"Section {i}. The city council met on day {i} to discuss the budget for parks, "
        f"roads and libraries. Member {i % 5} proposed moving {i * 10} thousand from roads to "
        "libraries; the proposal was debated at length and put to a vote the following week."
        for i in range(1, 25)]
    return "\n\n".join(paragraphs)


WORKLOADS = {
    "code-edit": ("Here is a Python file:\n\n" + code_file()
                  + "\n\nRepeat the whole file exactly, renaming handle_7 to process_7:\n\n"),
    "summarise": ("Here is a document:\n\n" + document()
                  + "\n\nSummarise the document, section by section:\n\n"),
}


@dataclass
class Cell:
    tok_s: list[float] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0


async def measure(url: str, prompt: str, clients: int, n_predict: int) -> tuple[float, int, int]:
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0, "cache_prompt": False}
    async with httpx.AsyncClient(timeout=600) as http:
        answers = await asyncio.gather(*(http.post(f"{url}/completion", json=body)
                                         for _ in range(clients)))
    timings = [a.raise_for_status().json()["timings"] for a in answers]
    rate = sum(t["predicted_n"] * 1000 / t["predicted_ms"] for t in timings if t["predicted_ms"])
    return (rate, sum(t.get("draft_n", 0) for t in timings),
            sum(t.get("draft_n_accepted", 0) for t in timings))


def command(system: str, args: argparse.Namespace, model: Path, port: int,
            spec: bool) -> list[str]:
    flags = ["-m", str(model), "-c", str(args.ctx), "-np", str(args.np), "-t", str(args.threads),
             "--port", str(port), *(shlex.split(args.spec) if spec else [])]
    if system == "llama-server":
        return [str(args.llama_server), *flags]
    return [sys.executable, "-m", "llamaq", "up", *flags]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--llama-server", type=Path, default=DEFAULT_LLAMA_SERVER)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--spec", default="--spec-type ngram-mod",
                        help="the speculative flags, given to both servers alike")
    parser.add_argument("--draft-self", action="store_true",
                        help="draft-simple with the model as its own draft model: --spec "
                        "becomes `--spec-type draft-simple -md MODEL` (more flags: --draft-flags)")
    parser.add_argument("--draft-flags", default="",
                        help="with --draft-self: more flags for both servers, e.g. "
                        "'--spec-draft-n-max 8'")
    parser.add_argument("--workloads", default="code-edit,summarise")
    parser.add_argument("--clients", type=lambda s: [int(c) for c in s.split(",")],
                        default=[1, 4])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--n-predict", type=int, default=256)
    parser.add_argument("--np", type=int, default=4)
    parser.add_argument("--ctx", type=int, default=32768, help="-c (shared by the -np slots)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if not args.llama_server.is_file():
        sys.exit(f"no llama-server at {args.llama_server}: run bench/build_llama_server.sh")
    model = args.model or default_model_path(Path.home() / ".cache" / "llamaq-tests")
    if args.draft_self:
        args.spec = " ".join(["--spec-type draft-simple -md", shlex.quote(str(model)),
                              args.draft_flags]).strip()
    workloads = args.workloads.split(",")
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    keys = [(system, spec) for system in SYSTEMS for spec in (False, True)]
    cells: dict[tuple[str, bool, str, int], Cell] = {}
    with ExitStack() as stack:
        urls = {}
        for system, spec in keys:
            port = free_port()
            log = RESULTS / f"speculative-{stamp}-{system}-{'spec' if spec else 'plain'}.log"
            process = stack.enter_context(running(command(system, args, model, port, spec), log,
                                                  server_env()))
            urls[(system, spec)] = f"http://127.0.0.1:{port}"
            wait_healthy(urls[(system, spec)], process=process)
        for url in urls.values():  # one warm-up each
            asyncio.run(measure(url, "Hello", 1, 8))
        for round_no in range(args.rounds):
            order = keys if round_no % 2 == 0 else keys[::-1]
            for workload in workloads:
                for clients in args.clients:
                    for key in order:
                        tok_s, drafted, accepted = asyncio.run(measure(
                            urls[key], WORKLOADS[workload], clients, args.n_predict))
                        cell = cells.setdefault((*key, workload, clients), Cell())
                        cell.tok_s.append(tok_s)
                        cell.drafted += drafted
                        cell.accepted += accepted
                        mode = "spec" if key[1] else "plain"
                        print(f"  round {round_no + 1} {key[0]:12} {mode:5} {workload:9} "
                              f"c={clients}: {tok_s:6.1f} tok/s", flush=True)
    report = render(cells, workloads, args)
    out = RESULTS / f"speculative-{stamp}.md"
    out.write_text(report)
    print("\n" + report + f"\n(written to {out})")


def render(cells: dict[tuple[str, bool, str, int], Cell], workloads: list[str],
           args: argparse.Namespace) -> str:
    def med(key: tuple[str, bool, str, int]) -> float:
        return statistics.median(cells[key].tok_s)

    lines = [f"speculative flags: `{args.spec}`, {args.rounds} round(s), n_predict "
             f"{args.n_predict}, -np {args.np} -c {args.ctx} -t {args.threads}", "",
             "| workload | clients | llama-server plain / spec tok/s (speedup) | llamaq plain / "
             "spec tok/s (speedup) | ratio of speedups | acceptance llama-server / llamaq |",
             "|---|---|---|---|---|---|"]
    for workload in workloads:
        for clients in args.clients:
            row = []
            speedups = []
            for system in SYSTEMS:
                plain = med((system, False, workload, clients))
                spec = med((system, True, workload, clients))
                speedups.append(spec / plain if plain else 0.0)
                row.append(f"{plain:.1f} / {spec:.1f} ({speedups[-1]:.2f}x)")
            acceptance = []
            for system in SYSTEMS:
                cell = cells[(system, True, workload, clients)]
                acceptance.append(f"{cell.accepted / cell.drafted:.2f}" if cell.drafted else "-")
            ratio = speedups[1] / speedups[0] if speedups[0] else 0.0
            lines.append(f"| {workload} | {clients} | {row[0]} | {row[1]} | {ratio:.2f} | "
                         f"{' / '.join(acceptance)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
