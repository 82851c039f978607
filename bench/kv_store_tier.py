"""The fleet-wide KV tier (--kv-store), issue 24's first figure: a ~3,000-token document with 20
questions on 2 workers. Worker A answers 5 questions and is stopped; worker B answers the rest.
Reports B's first TTFT from the stored state against B prefilling the same prompt cold
(`cache_prompt: false`), cache_n as a share of the prompt, and whether the greedy answers are
equal, per round (each round a new document, so nothing is reused across rounds).

    .venv/bin/python bench/kv_store_tier.py [--rounds 3] [--questions 20] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from storage import default_model_path  # noqa: E402
from tests.processes import Fleet, wait_until  # noqa: E402
from tests.redis_server import RestartableRedis  # noqa: E402

COLORS = ["red", "blue", "green", "yellow", "black", "white"]


def document(salt: int) -> str:
    return " ".join(f"Crate {salt}-{i} holds {i % 7 + 1} {COLORS[(i + salt) % 6]} boxes."
                    for i in range(230))


def ask(api: str, doc: str, question: str, **fields: Any) -> tuple[float, dict[str, Any]]:
    """(seconds to the first streamed token, the final event) of a greedy streamed answer."""
    body = {"prompt": f"{doc}\nQuestion: {question}\nAnswer:", "n_predict": 16,
            "temperature": 0, "stream": True, **fields}
    started = time.perf_counter()
    first = 0.0
    final: dict[str, Any] = {}
    text = ""
    with httpx.stream("POST", f"{api}/completion", json=body, timeout=300) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if not first and event.get("content"):
                first = time.perf_counter() - started
            text += event.get("content", "")
            if event.get("stop"):
                final = event
    final["text"] = text
    return first or time.perf_counter() - started, final


def one_round(fleet: Fleet, api: str, flags: tuple[str, ...], round_no: int,
              n_questions: int) -> dict[str, float]:
    doc = document(round_no)
    questions = [f"How many boxes does crate {round_no}-{i * 11} hold?"
                 for i in range(n_questions)]
    worker_a = fleet.add_worker(*flags)
    wait_until(lambda: httpx.get(f"{api}/health").status_code == 200, timeout=180,
               what="worker A")
    for question in questions[:5]:
        ask(api, doc, question)
    time.sleep(2)  # A's state reaches the store
    fleet.stop_process(worker_a)
    fleet.add_worker(*flags)
    wait_until(lambda: httpx.get(f"{api}/health").status_code == 200, timeout=180,
               what="worker B")
    warm_s, warm = ask(api, doc, questions[5])
    cold_s, cold = ask(api, doc, questions[5], cache_prompt=False)
    for question in questions[6:]:
        ask(api, doc, question)
    prompt_n = warm["timings"]["prompt_n"] + warm["timings"]["cache_n"]
    result = {"ttft_tier_ms": warm_s * 1000, "ttft_cold_ms": cold_s * 1000,
              "speedup": cold_s / warm_s, "cache_share": warm["timings"]["cache_n"] / prompt_n,
              "equal": float(warm["text"] == cold["text"]), "prompt_n": prompt_n}
    print(f"round {round_no + 1}: B's first TTFT {result['ttft_tier_ms']:.0f} ms from the tier "
          f"vs {result['ttft_cold_ms']:.0f} ms cold ({result['speedup']:.1f}x); cache_n "
          f"{result['cache_share']:.0%} of {prompt_n}; greedy equal: {bool(result['equal'])}",
          flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--questions", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="llamaq-kv-tier-"))
    redis = RestartableRedis(workdir / "redis")
    redis.start()
    model = default_model_path(Path.home() / ".cache" / "llamaq-tests")
    fleet = Fleet(redis.url, workdir, ["-m", str(model), "--alias", "bench-kv", "--store-url",
                                       str(workdir / "store"), "--cache-dir",
                                       str(workdir / "cache")], logs=workdir / "logs")
    flags = ("-c", "8192", "-np", "1", "-t", str(args.threads), "--kv-store")
    results = []
    try:
        api = fleet.add_api()
        for round_no in range(args.rounds):
            results.append(one_round(fleet, api, flags, round_no, args.questions))
            fleet.stop()
            fleet.processes.clear()
            api = fleet.add_api()
    finally:
        fleet.stop()
        redis.kill()
    speedups = [r["speedup"] for r in results]
    print(f"\nB's first TTFT, cold / from the tier: median {statistics.median(speedups):.1f}x "
          f"[{min(speedups):.1f}-{max(speedups):.1f}] over {len(results)} rounds; cache_n "
          f"{min(r['cache_share'] for r in results):.0%} of the prompt at least; greedy equal "
          f"in {sum(int(r['equal']) for r in results)} of {len(results)} (logs in {workdir})")


if __name__ == "__main__":
    main()
