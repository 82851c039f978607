"""A completion continued where a dead worker stopped (issue 26), in-process on Gemma 3 270M:
the continuation is built from the events the first run streamed (scheduler/migration.py
continuation_from, as the worker that takes the lapsed job builds it from the job's log) and
run by the engine (prompt + generated tokens prefilled, sampler replayed). No Redis, no
worker process: the greedy-equality check over 20 cuts at random tokens costs seconds."""

from __future__ import annotations

import json
import queue
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler.contract.jobs import CompletionJob, SamplingParams, SamplingSettings
from scheduler.contract.results import (
    CompletionResult,
    Continuation,
    ErrorEvent,
    EventEnvelope,
    FinalEvent,
    StartedEvent,
    TokenEvent,
)
from scheduler.migration import continuation_from
from worker.engine.loop import Engine, JobEvent
from worker.engine.requests import EngineDefaults
from worker.runtime.model import ContextPlan, LoadedModel

TIMEOUT_S = 120
GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)
PROMPT = "The history of the city of Rome begins"


@pytest.fixture(scope="module")
def model(gemma_path: Path) -> Iterator[LoadedModel]:
    plan = ContextPlan(n_ctx=2048, n_slots=2, kv_unified=False, n_batch=512, n_ubatch=512,
                       n_threads=1, n_threads_batch=1, swa_full=True, flash_attn="auto",
                       cache_type_k="f16", cache_type_v="f16")
    loaded = LoadedModel(gemma_path, plan)
    yield loaded
    loaded.close()


class Runner:
    """An engine and its events, one job at a time."""

    def __init__(self, model: LoadedModel) -> None:
        self.queue: queue.Queue[JobEvent] = queue.Queue()
        defaults = EngineDefaults(sampling=SamplingSettings(seed=1), n_predict=-1, n_keep=0,
                                  cache_prompt=True, special=False, model_alias="gemma",
                                  worker_id="w-test")
        self.engine = Engine(model, defaults, self._sink)

    def _sink(self, events: list[JobEvent]) -> None:
        for event in events:
            self.queue.put(event)

    def run(self, job: CompletionJob, resumed: Continuation | None = None) -> list[object]:
        self.engine.submit(self.engine.prepare(job, resumed))
        events: list[object] = []
        while True:
            job_id, event = self.queue.get(timeout=TIMEOUT_S)
            assert job_id == job.job_id
            events.append(event)
            if isinstance(event, FinalEvent | ErrorEvent):
                return events


@pytest.fixture(scope="module")
def runner(model: LoadedModel) -> Iterator[Runner]:
    runner = Runner(model)
    runner.engine.start()
    yield runner
    runner.engine.stop()


def job(n_predict: int, sampling: SamplingParams = GREEDY, **fields: object) -> CompletionJob:
    return CompletionJob(model="gemma", prompt=PROMPT, n_predict=n_predict, sampling=sampling,
                         stream=True, **fields)  # type: ignore[arg-type]


def tokens_of(events: list[object]) -> list[TokenEvent]:
    return [e for e in events if isinstance(e, TokenEvent) and e.progress is None]


def cut(events: list[object], k: int) -> Continuation:
    """The continuation of a run whose worker died after its k-th token event went out: the
    log as the worker wrote it (seq 0 is "started"), then continuation_from."""
    logged: list[EventEnvelope] = []
    for event in events:
        if len([e for e in logged if isinstance(e.event, TokenEvent)]) == k:
            break
        assert isinstance(event, TokenEvent | StartedEvent)
        logged.append(EventEnvelope(job_id="j", seq=len(logged), event=event))
    resumed = continuation_from(logged)
    assert resumed is not None
    assert resumed.next_seq == len(logged)
    return resumed


def final(events: list[object]) -> CompletionResult:
    last = events[-1]
    assert isinstance(last, FinalEvent), last
    assert isinstance(last.result, CompletionResult)
    return last.result


def test_greedy_text_equals_the_undisturbed_run_over_random_cuts(runner: Runner) -> None:
    """20 deaths at a random token: prior tokens + continued tokens equal the undisturbed
    run's tokens, in at least 19 of 20 (a prefill can round differently from step-by-step
    decoding); where one differs, the first difference comes after the seam. Each
    continuation goes on from where the client is: no token twice, none missing, the
    tokens_predicted count and the n_decoded of its events going on."""
    n_predict = 24
    whole = runner.run(job(n_predict))
    reference = [t for e in tokens_of(whole) for t in e.tokens]
    text = "".join(e.content for e in tokens_of(whole))
    assert len(reference) == n_predict
    rng = random.Random(26)
    equal = 0
    for k in [rng.randrange(1, n_predict) for _ in range(20)]:
        resumed = cut(whole, k)
        continued = runner.run(job(n_predict), resumed)
        assert isinstance(continued[0], StartedEvent)
        new = tokens_of(continued)
        assert [e.n_decoded for e in new] == list(range(k + 1, n_predict + 1))
        tokens = resumed.tokens + [t for e in new for t in e.tokens]
        assert len(tokens) == n_predict  # the remaining n_predict, nothing more
        assert final(continued).tokens_predicted == n_predict
        assert final(continued).tokens_evaluated == len(whole_prompt_tokens(runner))
        if tokens == reference:
            equal += 1
            assert resumed.content + "".join(e.content for e in new) == text
        else:
            first_difference = next(i for i, (a, b) in enumerate(zip(tokens, reference,
                                                                     strict=True)) if a != b)
            assert first_difference >= k, (k, first_difference)
    assert equal >= 19, equal


def whole_prompt_tokens(runner: Runner) -> list[int]:
    return runner.engine.model.vocab.tokenize_prompt(PROMPT)


def test_a_stop_string_split_by_the_seam_still_stops(runner: Runner) -> None:
    """A stop string made of the end of the last token before the death and the start of the
    first after it: the held-back beginning stays held across the migration, the continued
    run stops there, and the client never sees any of the stop string."""
    whole = runner.run(job(24))
    pieces = tokens_of(whole)
    texts = [runner.engine.model.vocab.piece(e.tokens[0], False).decode("utf-8", "replace")
             for e in pieces]
    k = next(i for i in range(4, len(texts) - 1)
             if len(texts[i - 1].strip()) >= 2 and len(texts[i].strip()) >= 1)
    stop = texts[k - 1][-2:] + texts[k][:1]  # spans tokens k-1 and k (0-based: the seam)
    plain = "".join(texts)
    assert stop in plain
    undisturbed = runner.run(job(24, stop=[stop]))
    expected = "".join(e.content for e in tokens_of(undisturbed))
    assert final(undisturbed).stopping_word == stop
    stopped_at = len(tokens_of(undisturbed))
    assert stopped_at > k - 1  # the held text is inside the cut below
    resumed = cut(undisturbed, k)
    assert expected.startswith(resumed.content)  # what the client had: the stop's start held
    continued = runner.run(job(24, stop=[stop]), resumed)
    result = final(continued)
    assert result.stopping_word == stop
    assert resumed.content + "".join(e.content for e in tokens_of(continued)) == expected
    assert stop not in resumed.content + "".join(e.content for e in tokens_of(continued))


def test_a_grammar_is_replayed_and_the_continuation_stays_in_it(runner: Runner) -> None:
    """A JSON-schema run cut in the middle: the continuation's grammar state comes from the
    replayed tokens, so the whole text is still valid JSON of the schema, and greedy makes
    it the undisturbed text."""
    schema = json.dumps({"type": "object", "properties": {"city": {"type": "string"},
                                                          "year": {"type": "integer"}},
                         "required": ["city", "year"]})
    sampling = SamplingParams(temperature=0.0)
    whole = runner.run(job(64, sampling, json_schema=schema))
    text = "".join(e.content for e in tokens_of(whole))
    assert set(json.loads(text)) == {"city", "year"}
    k = len(tokens_of(whole)) // 2
    resumed = cut(whole, k)
    continued = runner.run(job(64, sampling, json_schema=schema), resumed)
    joined = resumed.content + "".join(e.content for e in tokens_of(continued))
    assert set(json.loads(joined)) == {"city", "year"}
    assert joined == text


def test_n_probs_and_timings_go_on(runner: Runner) -> None:
    """n_probs: each continued token has its probabilities; timings_per_token: the
    generation count and time include the earlier run's."""
    whole = runner.run(job(12, n_probs=3, timings_per_token=True))
    resumed = cut(whole, 5)
    assert len(resumed.probs) == 5 and resumed.predicted_ms > 0
    continued = runner.run(job(12, n_probs=3, timings_per_token=True), resumed)
    new = tokens_of(continued)
    assert all(len(e.probs) == 1 and len(e.probs[0].top) == 3 for e in new)
    assert new[0].timings is not None and new[0].timings.predicted_n == 6
    assert new[0].timings.predicted_ms >= resumed.predicted_ms


def test_a_sampled_continuation_uses_a_seed_of_the_request_and_the_position(
        runner: Runner) -> None:
    """With sampling, a continuation is a valid sample, reproducible for the same request
    and cut (its seed is derived from the request's seed and the position)."""
    sampling = SamplingParams(temperature=1.0, seed=42, ignore_eos=True)
    whole = runner.run(job(16, sampling))
    resumed = cut(whole, 6)
    once = [t for e in tokens_of(runner.run(job(16, sampling), resumed)) for t in e.tokens]
    again = [t for e in tokens_of(runner.run(job(16, sampling), resumed)) for t in e.tokens]
    assert once == again and len(once) == 10
