"""Cache-aware routing benchmark (issue 12): 2 workers, 8 long shared system prompts x many
short questions, with prefix affinity on and off. Not a test: it measures and prints.

    .venv/bin/python bench/routing.py                       # both modes, interleaved rounds
    .venv/bin/python bench/routing.py --affinity off        # one mode only
    .venv/bin/python bench/routing.py --rounds 2 --questions 8 --concurrency 4

One fleet (own Redis on 127.0.0.1, Gemma 3 270M, two workers with -np slots each) and two api
pods on it: one with `--prefix-affinity` (default) and one with `--prefix-affinity 0` (off:
every completion goes to the model's shared queue, as before issue 12). Each round sends the
same shuffled list of requests through one pod: `system prompt i + question j`, streamed
`/completion`, `n_predict` tokens, from `--concurrency` clients at once. Before each round
the workers' slots are erased (`/slots/{id}?action=erase` on every fleet slot), so each round
starts cold.

Reports per mode: the prefix-cache hit rate, sum(timings.cache_n) / sum(prompt tokens)
(prompt tokens = cache_n + prompt_n), the median and p90 time to first token (request sent
to the first streamed token), and the ratios on / off. Results go to
bench/results/routing-<stamp>.md too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from storage import default_model_path  # noqa: E402
from tests.processes import Fleet, start_redis, wait_until  # noqa: E402

TOPICS = ["a harbour ferry office", "a mountain railway", "a city library", "a bicycle repair "
          "shop", "a hospital pharmacy", "a tax advice bureau", "a zoo's visitor desk",
          "an airline's baggage service", "a university admissions office", "a bakery chain"]
WORDS = " ".join([
    "always answer briefly and politely with the facts you are given and never invent",
    "opening hours prices rules or names that are not listed here when a visitor asks",
    "about something you do not know say so and point them to the front desk which is",
    "open every weekday morning keep a friendly tone use plain words avoid jargon and",
    "repeat the key number at the end of the answer so it is easy to remember"]).split()
QUESTIONS = ["When do you open?", "How much does it cost?", "Where do I park?",
             "Can I bring my dog?", "Is there wifi?", "Who do I call about a refund?",
             "Do you take cards?", "Is it open on Sunday?", "How long is the wait?",
             "Can children come?", "Where are the toilets?", "Is there a discount?"]


def system_prompt(i: int, chars: int) -> str:
    rng = random.Random(i)
    text = f"You are the assistant of {TOPICS[i % len(TOPICS)]} (desk {i}). Rules: "
    while len(text) < chars:
        text += " ".join(rng.choice(WORDS) for _ in range(12)) + ". "
    return text


@dataclass
class Round:
    mode: str
    ttft: list[float] = field(default_factory=list)
    cache_n: int = 0
    prompt_n: int = 0
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    placed: dict[int, list[int]] = field(default_factory=dict)
    """Per system prompt: the fleet slot ids its requests ran on."""

    @property
    def hit_rate(self) -> float:
        total = self.cache_n + self.prompt_n
        return self.cache_n / total if total else 0.0


async def one_request(http: httpx.AsyncClient, api: str, prompt: tuple[int, str],
                      n_predict: int, record: Round) -> None:
    index, text = prompt
    body = {"prompt": text, "n_predict": n_predict, "stream": True, "temperature": 0.0,
            "cache_prompt": True}
    sent = time.monotonic()
    first = None
    async with http.stream("POST", f"{api}/completion", json=body) as response:
        if response.status_code != 200:
            record.errors.append(f"status {response.status_code}: {await response.aread()!r}")
            return
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = json.loads(line[6:])
            if "error" in data:
                record.errors.append(str(data["error"]))
                return
            if first is None and (data.get("content") or data.get("tokens")):
                first = time.monotonic() - sent
            if data.get("stop"):
                timings = data.get("timings", {})
                record.cache_n += int(timings.get("cache_n", 0))
                record.prompt_n += int(timings.get("prompt_n", 0))
                record.placed.setdefault(index, []).append(int(data.get("id_slot", -1)))
    record.ttft.append(first if first is not None else time.monotonic() - sent)


async def run_round(api: str, prompts: list[tuple[int, str]], concurrency: int,
                    n_predict: int, mode: str) -> Round:
    record = Round(mode)
    queue: asyncio.Queue[tuple[int, str]] = asyncio.Queue()
    for prompt in prompts:
        queue.put_nowait(prompt)

    async def client(http: httpx.AsyncClient) -> None:
        while not queue.empty():
            await one_request(http, api, queue.get_nowait(), n_predict, record)

    started = time.monotonic()
    async with httpx.AsyncClient(timeout=600) as http:
        await asyncio.gather(*(client(http) for _ in range(concurrency)))
    record.wall_s = time.monotonic() - started
    return record


def erase_slots(api: str) -> None:
    for slot in httpx.get(f"{api}/slots", timeout=30).json():
        httpx.post(f"{api}/slots/{slot['id']}?action=erase", timeout=60).raise_for_status()


def requests(n_prompts: int, n_questions: int, chars: int, seed: int) -> list[tuple[int, str]]:
    systems = [system_prompt(i, chars) for i in range(n_prompts)]
    pairs = [(i, j) for i in range(n_prompts) for j in range(n_questions)]
    random.Random(seed).shuffle(pairs)
    return [(i, f"{systems[i]}\nUser: {QUESTIONS[j % len(QUESTIONS)]} (#{j})\nAssistant:")
            for i, j in pairs]


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(rounds: list[Round], args: argparse.Namespace) -> str:
    lines = [f"# routing bench: 2 workers x -np {args.n_slots}, {args.prompts} system prompts "
             f"of ~{args.system_chars} chars x {args.questions} questions, concurrency "
             f"{args.concurrency}, n_predict {args.n_predict}, {args.rounds} round(s) per mode",
             "", "| mode | round | hit rate | median TTFT (s) | p90 TTFT (s) | wall (s) | errors |",
             "|---|---|---|---|---|---|---|"]
    by_mode: dict[str, list[Round]] = {}
    for r in rounds:
        by_mode.setdefault(r.mode, []).append(r)
        lines.append(f"| {r.mode} | {len(by_mode[r.mode])} | {r.hit_rate:.3f} | "
                     f"{statistics.median(r.ttft):.3f} | {quantile(r.ttft, 0.9):.3f} | "
                     f"{r.wall_s:.1f} | {len(r.errors)} |")
    summary = {}
    for mode, rs in by_mode.items():
        cache = sum(r.cache_n for r in rs)
        total = sum(r.cache_n + r.prompt_n for r in rs)
        ttft = [t for r in rs for t in r.ttft]
        summary[mode] = (cache / total if total else 0.0, statistics.median(ttft))
        lines.append(f"\n{mode}: hit rate {summary[mode][0]:.3f} ({cache}/{total} prompt tokens "
                     f"from the cache), median TTFT {summary[mode][1]:.3f} s over {len(ttft)} "
                     "requests")
    if "on" in summary and "off" in summary:
        hit = summary["on"][0] / max(summary["off"][0], 1e-9)
        ttft_gain = summary["off"][1] / max(summary["on"][1], 1e-9)
        lines.append(f"\nhit rate on/off: {hit:.2f}x (target >= 2x); median TTFT off/on: "
                     f"{ttft_gain:.2f}x (target >= 1.5x)")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--affinity", choices=("on", "off", "both"), default="both",
                        help="which mode(s) to measure (off: --prefix-affinity 0)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds per mode (interleaved)")
    parser.add_argument("--prompts", type=int, default=8, help="distinct system prompts")
    parser.add_argument("--questions", type=int, default=12, help="questions per prompt")
    parser.add_argument("--system-chars", type=int, default=1600)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--n-predict", type=int, default=8)
    parser.add_argument("--np", type=int, default=4, dest="n_slots", help="slots per worker")
    parser.add_argument("--ctx-per-slot", type=int, default=1024)
    parser.add_argument("-t", "--threads", type=int, default=1, help="threads per worker")
    parser.add_argument("--model", type=Path,
                        default=default_model_path(Path.home() / ".cache" / "llamaq-tests"))
    args = parser.parse_args()
    modes = ["on", "off"] if args.affinity == "both" else [args.affinity]
    workdir = Path(tempfile.mkdtemp(prefix="llamaq-routing-"))
    redis_process, redis_url = start_redis(workdir / "redis")
    fleet = Fleet(redis_url, workdir, ["-m", str(args.model), "--alias", "bench-routing",
                                       "--store-url", str(workdir / "store"),
                                       "--cache-dir", str(workdir / "cache")],
                  logs=workdir / "logs")
    rounds = []
    try:
        flags = ("-c", str(args.ctx_per_slot * args.n_slots), "-np", str(args.n_slots),
                 "-t", str(args.threads), "--slot-save-path", str(workdir / "slots"))
        fleet.add_worker(*flags)
        fleet.add_worker(*flags)
        apis = {"on": fleet.add_api(), "off": fleet.add_api("--prefix-affinity", "0")}
        fleet.wait_healthy(apis["on"])
        wait_until(lambda: len(httpx.get(f"{apis['on']}/slots").json()) == 2 * args.n_slots,
                   timeout=120, what="both workers")
        prompts = requests(args.prompts, args.questions, args.system_chars, seed=1)
        for n in range(args.rounds):
            for mode in modes if n % 2 == 0 else reversed(modes):
                erase_slots(apis[mode])
                record = asyncio.run(run_round(apis[mode], prompts, args.concurrency,
                                               args.n_predict, mode))
                print(f"{mode} round {n + 1}: hit rate {record.hit_rate:.3f}, median TTFT "
                      f"{statistics.median(record.ttft):.3f} s, {record.wall_s:.1f} s, "
                      f"{len(record.errors)} errors", flush=True)
                print("  workers per system prompt: " + ", ".join(
                    f"{i}: " + "".join("AB"[s // args.n_slots] if s >= 0 else "?" for s in slots)
                    for i, slots in sorted(record.placed.items())), flush=True)
                rounds.append(record)
    finally:
        fleet.stop()
        redis_process.terminate()
        redis_process.wait()
    text = report(rounds, args)
    print(text)
    results = REPO / "bench" / "results"
    results.mkdir(exist_ok=True)
    (results / f"routing-{time.strftime('%Y%m%d-%H%M%S')}.md").write_text(text + "\n")


if __name__ == "__main__":
    main()
