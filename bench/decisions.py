"""Decision benchmark (not a test): the labelled set bench/data/decisions.jsonl (24 support
messages, 72 questions: 24 choice, 24 noul, 24 score) through POST /v1/systemone of a llamaq
fleet serving a text model with --decisions, on 127.0.0.1.

    .venv/bin/python bench/decisions.py [--model GGUF] [-np 8] [--typed-gguf 4]

Prints (and writes to bench/results/decisions-<stamp>.md): accuracy per type and overall (a
choice is right when its top option is the expected one, a score when its most likely level
is, a noul when P(yes) is on the expected side of 0.5), mean confidence on right and wrong
answers (noul: |2p - 1|), and questions per second with 1 and with 8 concurrent requests.
Each pass marks every state with the pass's name so no pass reuses another's cached prefix.

`--typed-gguf N`: the first N requests also through the PyPI package typed-gguf (in this
process, on the same model file, with the libllama of llama-cpp-python as its runtime and its
`plain` template), side by side with llamaq's answers to the same N requests. typed-gguf
must be importable (`pip install typed-gguf`, or PYTHONPATH pointing at its source).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from storage import default_model_path  # noqa: E402
from tests.processes import Fleet, start_redis  # noqa: E402

DATA = REPO / "bench" / "data" / "decisions.jsonl"


@dataclass
class Tally:
    right: dict[str, int] = field(default_factory=dict)
    total: dict[str, int] = field(default_factory=dict)
    confidence_right: list[float] = field(default_factory=list)
    confidence_wrong: list[float] = field(default_factory=list)

    def add(self, qtype: str, ok: bool, confidence: float) -> None:
        self.total[qtype] = self.total.get(qtype, 0) + 1
        self.right[qtype] = self.right.get(qtype, 0) + ok
        (self.confidence_right if ok else self.confidence_wrong).append(confidence)

    def accuracy(self, qtype: str | None = None) -> float:
        kinds = [qtype] if qtype else list(self.total)
        total = sum(self.total.get(k, 0) for k in kinds)
        return sum(self.right.get(k, 0) for k in kinds) / total if total else 0.0


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def grade(item: dict[str, Any], answers: dict[str, Any], tally: Tally) -> None:
    for qid, question in item["questions"].items():
        answer, expected = answers[qid], item["expected"][qid]
        if question["type"] == "choice":
            tally.add("choice", answer["choice"] == expected, answer["confidence"])
        elif question["type"] == "score":
            probabilities = answer["probabilities"]
            best = max(probabilities, key=lambda k: probabilities[k])
            tally.add("score", int(best) == expected, answer["confidence"])
        else:
            p = answer["noul"]
            tally.add("noul", (p > 0.5) == expected, abs(2 * p - 1))


def marked(item: dict[str, Any], mark: str) -> dict[str, Any]:
    return {"state": f"({mark}) {item['state']}", "questions": item["questions"]}


async def run_pass(api: str, items: list[dict[str, Any]], concurrency: int,
                   mark: str) -> tuple[list[dict[str, Any]], float]:
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=600) as http:
        async def one(item: dict[str, Any]) -> dict[str, Any]:
            async with gate:
                response = await http.post(f"{api}/v1/systemone", json=marked(item, mark))
                response.raise_for_status()
                answers: dict[str, Any] = response.json()["answers"]
                return answers

        started = time.perf_counter()
        answers = await asyncio.gather(*(one(item) for item in items))
        return list(answers), time.perf_counter() - started


def typed_gguf_pass(model: Path, items: list[dict[str, Any]],
                    threads: int) -> tuple[list[dict[str, Any]], float]:
    import llama_cpp

    os.environ.setdefault("TYPED_GGUF_RUNTIME_DIR", str(Path(llama_cpp.__file__).parent / "lib"))
    from typed_gguf import cli  # type: ignore[import-not-found]
    from typed_gguf.engine import session  # type: ignore[import-not-found]

    home = Path(tempfile.mkdtemp(prefix="typed-gguf-"))
    answers = []
    started = time.perf_counter()
    first = {**marked(items[0], "typed"), "model": str(model),
             "options": {"template": "plain", "threads": threads}}
    prepared = cli.prepare_decision(first, home=home, fit_enabled=False)
    with session.open_model(prepared.model_path, home=home, fit_plan=None,
                            fit_disabled=True) as handle:
        for item in items:
            payload = {**marked(item, "typed"), "model": str(model),
                       "options": {"template": "plain", "threads": threads}}
            prepared = cli.prepare_decision(payload, home=home, fit_enabled=False)
            answers.append(cli.decide_on_handle(prepared, payload, handle)["answers"])
    return answers, time.perf_counter() - started


def report_rows(name: str, items: list[dict[str, Any]], answers: list[dict[str, Any]],
                seconds: float) -> list[str]:
    tally = Tally()
    for item, got in zip(items, answers, strict=True):
        grade(item, got, tally)
    n_questions = sum(len(item["questions"]) for item in items)
    return [f"| {name} | {n_questions} | {tally.accuracy():.3f} | {tally.accuracy('choice'):.3f} "
            f"| {tally.accuracy('score'):.3f} | {tally.accuracy('noul'):.3f} "
            f"| {mean(tally.confidence_right):.3f} | {mean(tally.confidence_wrong):.3f} "
            f"| {n_questions / seconds:.2f} |"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path,
                        default=default_model_path(REPO / ".llamaq" / "cache"))
    parser.add_argument("-np", type=int, default=8)
    parser.add_argument("-c", type=int, default=8192)
    parser.add_argument("-t", type=int, default=2)
    parser.add_argument("--kvu", action="store_true",
                        help="one unified KV cache (-kvu): all questions of a step in one "
                        "ubatch")
    parser.add_argument("--typed-gguf", type=int, default=0, metavar="N",
                        help="also run the first N requests through typed-gguf (0: skip)")
    args = parser.parse_args()
    items = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    workdir = Path(tempfile.mkdtemp(prefix="llamaq-bench-decisions-"))
    redis_process, redis_url = start_redis(workdir / "redis")
    fleet = Fleet(redis_url, workdir, ["-m", str(args.model), "--alias", "bench",
                                       "--store-url", str(workdir / "store")],
                  logs=workdir / "logs")
    header = ["| system | questions | accuracy | choice | score | noul | conf. right "
              "| conf. wrong | questions/s |", "|---|---|---|---|---|---|---|---|---|"]
    rows: list[str] = []
    try:
        fleet.add_worker("--decisions", "-np", str(args.np), "-c", str(args.c), "-t",
                         str(args.t), *(["-kvu"] if args.kvu else []))
        api = fleet.add_api()
        fleet.wait_healthy(api, timeout=300)
        asyncio.run(run_pass(api, items[:1], 1, "warm-up"))
        results = {}
        for concurrency in (1, 8):
            answers, seconds = asyncio.run(run_pass(api, items, concurrency,
                                                    f"c{concurrency}"))
            results[concurrency] = answers
            rows += report_rows(f"llamaq, {concurrency} concurrent", items, answers, seconds)
        if args.typed_gguf:
            subset = items[: args.typed_gguf]
            answers, seconds = asyncio.run(run_pass(api, subset, 1, "typed"))
            rows += report_rows(f"llamaq, first {len(subset)} requests", subset, answers,
                                seconds)
            fleet.stop()  # typed-gguf runs alone on the machine
            try:
                answers, seconds = typed_gguf_pass(args.model, subset, args.t)
                rows += report_rows(f"typed-gguf, first {len(subset)} requests", subset,
                                    answers, seconds)
            except Exception as error:  # reported, not hidden: it may not run here
                rows.append(f"| typed-gguf | did not run: {type(error).__name__}: {error} "
                            "| | | | | | | |")
    finally:
        fleet.stop()
        redis_process.terminate()
    kvu = ", -kvu" if args.kvu else ""
    text = "\n".join([f"model: {args.model.name}, -np {args.np}, -c {args.c}, -t {args.t}{kvu}",
                      "",
                      *header, *rows])
    print(text)
    out = REPO / "bench" / "results" / f"decisions-{time.strftime('%Y%m%d-%H%M%S')}.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
