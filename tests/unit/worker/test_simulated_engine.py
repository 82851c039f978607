"""The simulated engine (worker/simulate/, `llamaq worker --simulate`): its timing model
produces what it is asked (TTFT from uncached prompt tokens, inter-token latency with jitter
and batch slowdown) within 10 %, measured on the runs' own timings rather than the box's wall
clock; its text is deterministic and honours n_predict, stop strings and ignore_eos; its
prefix cache by block gives cache_n hits and evicts past the KV budget. The real engine's
parts (admission, token rules, reports) run under it; the sink is a list."""

from __future__ import annotations

import asyncio
import random
import statistics
from typing import Any

import pytest

from scheduler.contract.jobs import CompletionJob, SamplingParams
from scheduler.contract.results import CompletionResult, FinalEvent, TokenEvent
from worker.engine.runs import JobEvent
from worker.process.simulated import sim_engine
from worker.runtime.settings import WorkerSettings
from worker.simulate.engine import SimEngine
from worker.simulate.kv import BlockCache
from worker.simulate.model import SimModel
from worker.simulate.timing import TimingModel
from worker.simulate.vocab import EOS, SimVocab


class Sink:
    def __init__(self) -> None:
        self.events: list[JobEvent] = []
        self.steps = 0
        self.tokens_by_call: list[int] = []
        """The token events of each call (one call per engine step)."""

    def __call__(self, events: list[JobEvent]) -> None:
        self.events.extend(events)
        self.steps += 1
        self.tokens_by_call.append(sum(isinstance(e, TokenEvent) for _, e in events))

    def final(self, job_id: str) -> CompletionResult:
        for jid, event in self.events:
            if jid == job_id and isinstance(event, FinalEvent):
                assert isinstance(event.result, CompletionResult)
                return event.result
        raise AssertionError(f"no final event for {job_id}")

    def streamed(self, job_id: str) -> str:
        return "".join(e.content for j, e in self.events
                       if j == job_id and isinstance(e, TokenEvent))


def engine(sink: Sink, *flags: str) -> SimEngine:
    settings = WorkerSettings.from_args(["--simulate", "-m", "sim", *flags])
    model = SimModel(settings, SimVocab())

    class Publisher:
        publish = sink

    built = sim_engine(settings, model, "sim", "w1", Publisher())  # type: ignore[arg-type]
    assert isinstance(built, SimEngine)
    return built


async def run_jobs(built: SimEngine, sink: Sink, jobs: list[CompletionJob],
                   timeout: float = 30, stop: bool = True) -> None:
    if built._task is None:
        built.start()
    try:
        for job in jobs:
            built.submit(built.prepare(job))

        async def all_done() -> None:
            while not all(any(j == job.job_id and isinstance(e, FinalEvent)
                              for j, e in sink.events) for job in jobs):
                await asyncio.sleep(0.01)

        await asyncio.wait_for(all_done(), timeout)
    finally:
        if stop:
            built.stop()


def job(prompt: str = "tell me a story", **fields: Any) -> CompletionJob:
    return CompletionJob(model="sim", prompt=prompt, **fields)


def within(measured: float, asked: float, fraction: float = 0.10) -> bool:
    return abs(measured - asked) <= fraction * asked


def produced_matches_asked(built: SimEngine, sink: Sink, one: CompletionJob) -> None:
    """A run's measured generation time is what the model asked plus how late the loop was
    to its first and last token (a starved process on a loaded box), nothing else."""
    asked = built.asked[one.job_id]
    timings = sink.final(one.job_id).timings
    assert asked.n_itl == timings.predicted_n - 1
    produced_s = timings.predicted_ms / 1000
    assert abs(produced_s - (asked.itl_s + asked.last_late_s - asked.first_late_s)) < 0.002


def test_inter_token_latency_is_what_it_is_asked() -> None:
    sink = Sink()
    built = engine(sink, "--sim-itl-ms", "15", "-np", "2")
    one = job(n_predict=40)
    asyncio.run(run_jobs(built, sink, [one]))
    asked = built.asked[one.job_id]
    assert sink.final(one.job_id).timings.predicted_n == 40
    assert within(asked.itl_s / asked.n_itl * 1000, 15), asked
    produced_matches_asked(built, sink, one)


def test_prefill_time_is_uncached_tokens_at_the_prefill_speed() -> None:
    sink = Sink()
    built = engine(sink, "--sim-prefill-tps", "2000", "--sim-itl-ms", "5")
    long = job(" ".join(f"w{i}" for i in range(400)), n_predict=2)
    asyncio.run(run_jobs(built, sink, [long]))
    timings = sink.final(long.job_id).timings
    asked = built.asked[long.job_id]
    assert timings.prompt_n == 401  # BOS and 400 words
    assert within(asked.prefill_s, 401 / 2000)
    assert abs(timings.prompt_ms / 1000 - asked.prefill_s - asked.first_late_s) < 0.002


def test_batch_slowdown_and_jitter_keep_their_mean() -> None:
    sink = Sink()
    built = engine(sink, "--sim-itl-ms", "10", "--sim-batch-slowdown", "0.25",
                   "--sim-itl-jitter", "0.5", "-np", "4")
    jobs = [job(f"prompt number {i}", n_predict=60) for i in range(4)]
    asyncio.run(run_jobs(built, sink, jobs))
    asked = [built.asked[j.job_id] for j in jobs]
    # four slots together: 10 ms × (1 + 0.25 × 3), the jitter's mean is 0
    mean_ms = sum(a.itl_s for a in asked) / sum(a.n_itl for a in asked) * 1000
    assert within(mean_ms, 17.5), mean_ms
    for one in jobs:
        produced_matches_asked(built, sink, one)


@pytest.mark.serial  # the per-slot hand-overs come apart only on time: alone (tests/lanes.py)
def test_a_batched_step_gives_every_generating_slot_its_token_at_once() -> None:
    """--sim-step batched (the default): as the real engine decodes all its active slots in
    one step, every generating slot's token comes in the step's one hand-over (the publisher
    flushes them together); prompts that end between steps join the next step. Per slot
    (--sim-step slot), each slot's jittered tokens come on their own."""
    def run(step: str) -> tuple[Sink, SimEngine, list[CompletionJob]]:
        sink = Sink()
        built = engine(sink, "--sim-step", step, "--sim-itl-ms", "10", "--sim-itl-jitter",
                       "0.5", "--sim-prefill-tps", "20000", "-np", "4")
        # prompts of 101 to 401 tokens: their first tokens due 5 to 20 ms apart
        jobs = [job(" ".join(f"w{i}" for i in range(100 * (k + 1))), n_predict=30,
                    stream=True)
                for k in range(4)]
        asyncio.run(run_jobs(built, sink, jobs))
        return sink, built, jobs

    sink, built, jobs = run("batched")
    with_tokens = [n for n in sink.tokens_by_call if n]
    assert sum(with_tokens) == 4 * 30
    # the first job's 30 steps and the few before the last prompt joined: not 4 × 30
    assert len(with_tokens) <= 30 + 3, with_tokens
    assert with_tokens.count(4) >= 30 - 3, with_tokens
    for one in jobs:
        produced_matches_asked(built, sink, one)
    asked = [built.asked[j.job_id] for j in jobs]
    assert within(sum(a.itl_s for a in asked) / sum(a.n_itl for a in asked) * 1000, 10)

    sink, built, jobs = run("slot")
    assert len([n for n in sink.tokens_by_call if n]) > 2 * 30, sink.tokens_by_call
    for one in jobs:
        produced_matches_asked(built, sink, one)


def test_the_timing_model_alone() -> None:
    model = TimingModel(prefill_tps=1000, itl_ms=20, itl_jitter=0.2, batch_slowdown=0.1)
    assert model.prefill_s(500) == 0.5
    assert model.mean_itl_s(1) == 0.02
    assert abs(model.mean_itl_s(11) - 0.04) < 1e-12
    rng = random.Random(1)
    draws = [model.itl_s(1, rng) for _ in range(5000)]
    assert min(draws) >= 0.016 and max(draws) <= 0.024
    assert within(statistics.mean(draws), 0.02, 0.01)


def test_text_is_deterministic_and_honours_n_predict_stop_and_ignore_eos() -> None:
    sink = Sink()
    built = engine(sink, "--sim-itl-ms", "1", "--sim-eos-tokens", "12", "-np", "4")
    a, b = job(n_predict=8), job(n_predict=8)
    eos, ignore = job(), job(n_predict=20, sampling=SamplingParams(ignore_eos=True))
    streamed = job(n_predict=8, stream=True)
    asyncio.run(run_jobs(built, sink, [a, b, eos, ignore, streamed]))
    first, second = sink.final(a.job_id), sink.final(b.job_id)
    assert first.content == second.content and first.content
    assert first.tokens_predicted == 8 and first.stop_type == "limit"
    assert sink.streamed(streamed.job_id) == first.content
    assert sink.final(eos.job_id).stop_type == "eos"
    assert sink.final(eos.job_id).tokens_predicted == 13  # 12 words, then EOS
    ignored = sink.final(ignore.job_id)
    assert ignored.stop_type == "limit" and ignored.tokens_predicted == 20
    word = first.content.split()[3]
    sink2 = Sink()
    stopped = job(n_predict=8, stop=[word])
    asyncio.run(run_jobs(engine(sink2, "--sim-itl-ms", "1"), sink2, [stopped]))
    result = sink2.final(stopped.job_id)
    assert result.stop_type == "word" and result.stopping_word == word
    assert result.content == first.content[:first.content.index(word)]


def test_a_repeated_prompt_is_cached_by_block() -> None:
    sink = Sink()
    built = engine(sink, "--sim-itl-ms", "1", "--sim-kv-block", "16", "-np", "2")
    prompt = " ".join(f"w{i}" for i in range(100))
    first, again = job(prompt, n_predict=2), job(prompt + " more", n_predict=2, id_slot=1)

    async def one_then_the_other() -> None:
        await run_jobs(built, sink, [first], stop=False)
        await run_jobs(built, sink, [again])

    asyncio.run(one_then_the_other())
    assert sink.final(first.job_id).timings.cache_n == 0
    # on the other slot: 6 whole blocks of 16 of its 101 shared tokens (BOS and 100 words)
    assert sink.final(again.job_id).timings.cache_n == 96


def test_the_block_cache_evicts_past_the_budget() -> None:
    cache = BlockCache(kv_tokens=64, block=16)
    a = list(range(1, 65))
    b = list(range(100, 164))
    cache.start(len(a))
    cache.end(len(a), a)
    assert cache.lookup([*a, 7]) == 64
    cache.start(len(b))  # b runs: only 0 tokens of room left for cached blocks
    assert cache.cached_tokens == 0
    cache.end(len(b), b)
    assert cache.lookup([*b, 7]) == 64 and cache.lookup([*a, 7]) == 0
    assert cache.hits == 8 and cache.misses == 4


def test_the_vocab_is_stable_and_words_round_trip() -> None:
    one, two = SimVocab(), SimVocab()
    tokens = one.tokenize("hello there, friend", True, True)
    assert tokens == two.tokenize("hello there, friend", True, True)
    assert one.detokenize(tokens) == "hello there, friend"
    assert one.generated([1, 5], 3, 2, ignore_eos=False) == EOS
    assert one.generated([1, 5], 3, 2, ignore_eos=True) != EOS
