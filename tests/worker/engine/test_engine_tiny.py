"""The slot engine in-process on the tiny GGUF (tests/tiny_gguf.py): no Redis, no api, no
worker process; seconds, not minutes. Continuous batching (requests decoded together, a late
one joining running ones), prefix reuse, stop rules, cancellation and its free slot, and the
events a run emits in order."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler.contract.jobs import CompletionJob, SamplingParams, SamplingSettings
from scheduler.contract.results import (
    CompletionResult,
    ErrorEvent,
    FinalEvent,
    StartedEvent,
    TokenEvent,
)
from worker.engine.admission import BACKGROUND_STEP_S
from worker.engine.loop import Engine, JobEvent
from worker.engine.requests import EngineDefaults
from worker.runtime.model import ContextPlan, LoadedModel

N_SLOTS = 4
TIMEOUT_S = 60
ENDLESS = SamplingParams(temperature=0.0, ignore_eos=True)
"""Random weights often pick EOS first: runs that must go on ignore it."""


class Events:
    """The engine's sink: every step's events, read back per job in order."""

    def __init__(self) -> None:
        self.queue: queue.Queue[JobEvent] = queue.Queue()
        self.by_job: dict[str, list[object]] = {}

    def sink(self, events: list[JobEvent]) -> None:
        for event in events:
            self.queue.put(event)

    def until_done(self, job_ids: list[str]) -> dict[str, list[object]]:
        """Every event of `job_ids` up to their final or error event."""
        left = set(job_ids)
        while left:
            job_id, event = self.queue.get(timeout=TIMEOUT_S)
            self.by_job.setdefault(job_id, []).append(event)
            if isinstance(event, FinalEvent | ErrorEvent):
                left.discard(job_id)
        return {j: self.by_job[j] for j in job_ids}


@pytest.fixture(scope="module")
def model(tiny_model_path: Path) -> Iterator[LoadedModel]:
    plan = ContextPlan(n_ctx=2048, n_slots=N_SLOTS, kv_unified=False, n_batch=512,
                       n_ubatch=512, n_threads=1, n_threads_batch=1, swa_full=True,
                       flash_attn="auto", cache_type_k="f16", cache_type_v="f16")
    loaded = LoadedModel(tiny_model_path, plan)
    yield loaded
    loaded.close()


@pytest.fixture
def unstarted(model: LoadedModel) -> Iterator[tuple[Engine, Events]]:
    """An engine whose thread the test starts: requests submitted before it run from the
    first step together, however busy the machine is."""
    events = Events()
    defaults = EngineDefaults(sampling=SamplingSettings(seed=1), n_predict=-1, n_keep=0,
                              cache_prompt=True, special=False, model_alias="tiny",
                              worker_id="w-test")
    engine = Engine(model, defaults, events.sink)
    yield engine, events
    engine.stop()


@pytest.fixture
def engine(unstarted: tuple[Engine, Events]) -> tuple[Engine, Events]:
    unstarted[0].start()
    return unstarted


def job(prompt: str, n_predict: int, sampling: SamplingParams = ENDLESS,
        **fields: object) -> CompletionJob:
    return CompletionJob(model="tiny", prompt=prompt, n_predict=n_predict, sampling=sampling,
                         **fields)  # type: ignore[arg-type]


def result(events: list[object]) -> CompletionResult:
    final = events[-1]
    assert isinstance(final, FinalEvent), final
    assert isinstance(final.result, CompletionResult)
    return final.result


def test_requests_run_together_in_one_batch(unstarted: tuple[Engine, Events]) -> None:
    eng, events = unstarted
    jobs = [job(f"hello world {i}", 24, stream=True) for i in range(N_SLOTS)]
    decodes = eng.metrics.n_decode_total
    for j in jobs:
        eng.submit(eng.prepare(j))
    eng.start()  # after the submits: on a busy machine the thread could step between them
    done = events.until_done([j.job_id for j in jobs])
    for j in jobs:
        run = done[j.job_id]
        assert isinstance(run[0], StartedEvent)
        tokens = [t for e in run if isinstance(e, TokenEvent) for t in e.tokens]
        assert len(tokens) == 24 and result(run).tokens_predicted == 24
        assert result(run).stop_type == "limit"
    # 4 x 24 tokens in far fewer decodes than 96: one batch carried every slot per step.
    assert eng.metrics.n_decode_total - decodes <= 24 + 4
    assert eng.busy_slots() == 0


def test_a_late_request_joins_the_running_ones(engine: tuple[Engine, Events]) -> None:
    eng, events = engine
    long_job = job("once upon a time", 200, stream=True)
    eng.submit(eng.prepare(long_job))
    while True:  # the long one generates ...
        job_id, event = events.queue.get(timeout=TIMEOUT_S)
        events.by_job.setdefault(job_id, []).append(event)
        if isinstance(event, TokenEvent):
            break
    late = job("the cat", 4)
    eng.submit(eng.prepare(late))
    done = events.until_done([late.job_id])  # ... and the late one ends first
    assert result(done[late.job_id]).tokens_predicted == 4
    assert not any(isinstance(e, FinalEvent) for e in events.by_job[long_job.job_id])
    eng.cancel(long_job.job_id)
    cancelled = events.until_done([long_job.job_id])[long_job.job_id]
    assert isinstance(cancelled[-1], ErrorEvent)
    assert eng.busy_slots() == 0


def test_the_same_prompt_again_reuses_the_slots_cache(engine: tuple[Engine, Events]) -> None:
    eng, events = engine
    prompt = "the sky is blue and the cat is a dog " * 4
    first = job(prompt, 2, id_slot=2)
    eng.submit(eng.prepare(first))
    n_prompt = result(events.until_done([first.job_id])[first.job_id]).tokens_evaluated
    again = job(prompt, 2, id_slot=2)
    eng.submit(eng.prepare(again))
    second = result(events.until_done([again.job_id])[again.job_id])
    assert second.timings.cache_n >= n_prompt - 1  # all but the last prompt token
    assert second.timings.prompt_n <= 1
    off = job(prompt, 2, id_slot=2, cache_prompt=False)
    eng.submit(eng.prepare(off))
    assert result(events.until_done([off.job_id])[off.job_id]).timings.cache_n == 0


def test_stop_words_end_a_run_and_are_not_sent(engine: tuple[Engine, Events]) -> None:
    eng, events = engine
    free = job("hello", 12)
    eng.submit(eng.prepare(free))
    text = result(events.until_done([free.job_id])[free.job_id]).content
    word = text[len(text) // 2:][:3]
    if not word.strip():
        pytest.skip(f"no usable stop word in {text!r}")
    stopped = job("hello", 12, stop=[word])
    eng.submit(eng.prepare(stopped))
    out = result(events.until_done([stopped.job_id])[stopped.job_id])
    assert out.stop_type == "word" and out.stopping_word == word
    assert word not in out.content and text.startswith(out.content)


def _until(events: Events, job_id: str, kind: type) -> list[JobEvent]:
    """Every event read until `job_id`'s first event of `kind` (included)."""
    seen: list[JobEvent] = []
    while True:
        got, event = events.queue.get(timeout=TIMEOUT_S)
        events.by_job.setdefault(got, []).append(event)
        seen.append((got, event))
        if got == job_id and isinstance(event, kind):
            return seen


def test_a_batch_line_sits_out_while_an_online_prompt_is_evaluated(
        engine: tuple[Engine, Events]) -> None:
    eng, events = engine
    line = job("once upon a time", 400, stream=True, background=True, id_slot=0)
    eng.submit(eng.prepare(line))
    _until(events, line.job_id, TokenEvent)  # the batch line generates
    online = job("the cat sat on the mat and looked at the dog " * 4, 2, stream=True,
                 id_slot=1)
    eng.submit(eng.prepare(online))
    seen = _until(events, online.job_id, StartedEvent)
    seen = _until(events, online.job_id, TokenEvent)
    # the step that evaluated the online prompt carried no token of the batch line
    assert not [e for j, e in seen if j == line.job_id and isinstance(e, TokenEvent)]
    events.until_done([online.job_id])
    eng.cancel(line.job_id)
    events.until_done([line.job_id])
    assert eng.busy_slots() == 0


def test_a_batch_lines_prompt_goes_in_parts(engine: tuple[Engine, Events]) -> None:
    eng, events = engine
    eng.speed.s_per_token = BACKGROUND_STEP_S / 16  # as if measured: 16 tokens in the next step
    prompt = "the sky is blue and the cat is a dog " * 12
    line = job(prompt, 1, stream=True, return_progress=True, background=True, id_slot=3,
               cache_prompt=False)
    eng.submit(eng.prepare(line))
    run = events.until_done([line.job_id])[line.job_id]
    steps = [e.progress.processed for e in run if isinstance(e, TokenEvent) and e.progress]
    n_prompt = result(run).tokens_evaluated
    assert n_prompt > 64 and steps[0] == 0 and steps[1] == 16 and steps[-1] == n_prompt
    online = job(prompt, 1, stream=True, return_progress=True, id_slot=2, cache_prompt=False)
    eng.submit(eng.prepare(online))  # an online prompt goes whole
    run = events.until_done([online.job_id])[online.job_id]
    assert [e.progress.processed for e in run if isinstance(e, TokenEvent) and e.progress] \
        == [0, n_prompt]



def test_a_cancelled_runs_slot_goes_to_a_request_waiting_in_the_same_step(
        engine: tuple[Engine, Events]) -> None:
    """A preemption (worker/process/preempt.py) cancels the victim and submits the urgent
    request; when both reach the engine together (its step was decoding meanwhile), the freed
    slot takes the request in that same round, before the next decode of the others, not one
    decode later (issue 47: the priority bench's 4x alone)."""
    eng, events = engine
    hogs = [job(f"story number {i}", 400, stream=True) for i in range(N_SLOTS)]
    for hog in hogs:
        eng.submit(eng.prepare(hog))
    for hog in hogs:  # every slot generates
        _until(events, hog.job_id, TokenEvent)
    urgent = job("the cat", 2, stream=True)
    with eng._inbox.wake:  # one hand over: the engine thread takes both at once
        eng.cancel(hogs[0].job_id)
        eng.submit(eng.prepare(urgent))
    seen = _until(events, hogs[0].job_id, ErrorEvent)
    seen = _until(events, urgent.job_id, StartedEvent)
    tokens = [j for j, e in seen if isinstance(e, TokenEvent)]
    assert not tokens, f"{len(tokens)} tokens of the others went before the urgent request"
    assert result(events.until_done([urgent.job_id])[urgent.job_id]).tokens_predicted == 2
    for hog in hogs[1:]:
        eng.cancel(hog.job_id)
    events.until_done([hog.job_id for hog in hogs[1:]])
    assert eng.busy_slots() == 0


def test_a_slot_change_is_told_once_the_engine_counts_it(
        unstarted: tuple[Engine, Events]) -> None:
    """`on_slots_changed` is called (on the engine thread) after the run it tells of is among
    the busy slots, and after a freed one left them: what it tells reads the engine's state
    (worker/process/preempt_call.py joins the preemptors when every slot is busy; told before
    the admitted run counted, it read a free slot, and no later change told it otherwise:
    Gemma's urgent requests waited for the safety poll, 1-2 s, issue 47)."""
    eng, events = unstarted
    seen: list[int] = []
    eng.on_slots_changed = lambda: seen.append(eng.busy_slots())
    one = job("hello there", 3)
    eng.submit(eng.prepare(one))
    eng.start()
    events.until_done([one.job_id])
    assert seen[:2] == [1, 0], seen
