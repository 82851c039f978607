"""Does batch composition alone change greedy tokens? (not a test; issue 26's baseline)

    .venv/bin/python bench/greedy_batching.py [--prompts 8] [--n-predict 64] [--stagger 0.05]

One engine in-process (Gemma 3 270M, one slot per prompt, one thread, no prompt cache, no
migration, no other process): greedy prompts run each alone, then all together twice, then
submitted `--stagger` seconds apart. Prints, per comparison, the index of each prompt's first
differing token (None: equal). Counts, not timings: a given batch composition gives the same
tokens under any load; which prompts share a decode step is what changes them (ggml's CPU
kernels depend on the batch's shape). bench/faults.py --scenario worker-migrate measures the
same effect across a fleet (its baseline); see docs/faults.md, "Greedy output across a
migration".
"""

from __future__ import annotations

import argparse
import queue
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from scheduler.contract.jobs import CompletionJob, SamplingParams, SamplingSettings  # noqa: E402
from scheduler.contract.results import ErrorEvent, FinalEvent, TokenEvent  # noqa: E402
from storage import default_model_path  # noqa: E402
from worker.engine.loop import Engine, JobEvent  # noqa: E402
from worker.engine.requests import EngineDefaults  # noqa: E402
from worker.runtime.model import ContextPlan, LoadedModel  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)


class Runner:
    def __init__(self, model: LoadedModel) -> None:
        self.events: queue.Queue[JobEvent] = queue.Queue()
        defaults = EngineDefaults(sampling=SamplingSettings(seed=1), n_predict=-1, n_keep=0,
                                  cache_prompt=False, special=False, model_alias="bench",
                                  worker_id="bench")
        self.engine = Engine(model, defaults, self._sink)

    def _sink(self, events: list[JobEvent]) -> None:
        for event in events:
            self.events.put(event)

    def run(self, prompts: list[str], n_predict: int, stagger_s: float = 0.0) -> list[list[int]]:
        """The greedy tokens of each prompt, all submitted at once (or `stagger_s` apart)."""
        jobs = [CompletionJob(model="bench", prompt=p, n_predict=n_predict, sampling=GREEDY,
                              stream=True) for p in prompts]
        tokens: dict[str, list[int]] = {job.job_id: [] for job in jobs}
        for job in jobs:
            self.engine.submit(self.engine.prepare(job))
            time.sleep(stagger_s)
        ended = 0
        while ended < len(jobs):
            job_id, event = self.events.get(timeout=300)
            if isinstance(event, TokenEvent) and event.progress is None:
                tokens[job_id] += event.tokens
            elif isinstance(event, ErrorEvent):
                raise RuntimeError(f"job {job_id}: {event.error}")
            elif isinstance(event, FinalEvent):
                ended += 1
        return [tokens[job.job_id] for job in jobs]


def first_differences(runs: list[list[int]], others: list[list[int]]) -> list[int | None]:
    found: list[int | None] = []
    for a, b in zip(runs, others, strict=True):
        found.append(next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                          None if len(a) == len(b) else min(len(a), len(b))))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n-predict", type=int, default=64)
    parser.add_argument("--stagger", type=float, default=0.05,
                        help="seconds between the submissions of the staggered run")
    args = parser.parse_args()
    plan = ContextPlan(n_ctx=512 * args.prompts, n_slots=args.prompts, kv_unified=False,
                       n_batch=2048, n_ubatch=512, n_threads=1, n_threads_batch=1,
                       swa_full=False, flash_attn="auto", cache_type_k="f16",
                       cache_type_v="f16")
    model = LoadedModel(default_model_path(Path.home() / ".cache" / "llamaq-tests"), plan)
    runner = Runner(model)
    runner.engine.start()
    try:
        prompts = [f"Story {i}:" for i in range(args.prompts)]
        alone = [runner.run([prompt], args.n_predict)[0] for prompt in prompts]
        together = runner.run(prompts, args.n_predict)
        again = runner.run(prompts, args.n_predict)
        staggered = runner.run(prompts, args.n_predict, args.stagger)
    finally:
        runner.engine.stop()
        model.close()
    for name, runs, others in [("together vs each alone", together, alone),
                               ("together vs together again", together, again),
                               (f"{args.stagger} s apart vs together", staggered, together)]:
        found = first_differences(runs, others)
        differ = sum(f is not None for f in found)
        print(f"{name}: {differ} of {len(found)} differ; first differing token {found}")


if __name__ == "__main__":
    main()
