"""Speculative decoding in the slot engine, in-process on Gemma 3 270M: the output is the
output without speculation, token for token (greedy and seeded at temperature 0.2, one run and
a speculating run beside a plain one in the same steps), drafts are made and accepted on
repetitive text, each token is its own streamed event, and the counters add up."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from scheduler.contract.jobs import CompletionJob, DraftLimits, SamplingParams, SamplingSettings
from scheduler.contract.results import CompletionResult, FinalEvent, TokenEvent
from tests.worker.engine.test_engine_tiny import Events
from worker.engine.loop import Engine
from worker.engine.requests import EngineDefaults
from worker.runtime.model import ContextPlan, LoadedModel
from worker.speculative.config import NgramMapParams, NgramModParams, SpecConfig, resolve

N_SLOTS = 2
CODE = "".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(6))
"""Repetitive text: the n-gram modes find what comes next in it."""
GREEDY = SamplingParams(temperature=0.0)
SEEDED = SamplingParams(temperature=0.2, seed=42)


PLAN = ContextPlan(n_ctx=4096, n_slots=N_SLOTS, kv_unified=False, n_batch=512, n_ubatch=512,
                   n_threads=1, n_threads_batch=1, swa_full=True, flash_attn="auto",
                   cache_type_k="f16", cache_type_v="f16")


def _engine(path: Path, spec: SpecConfig,
            plan: ContextPlan = PLAN) -> tuple[Engine, Events, LoadedModel]:
    model = LoadedModel(path, plan)
    events = Events()
    defaults = EngineDefaults(sampling=SamplingSettings(seed=1), n_predict=-1, n_keep=0,
                              cache_prompt=False, special=False, model_alias="gemma",
                              worker_id="w-test", spec=spec)
    engine = Engine(model, defaults, events.sink)
    engine.start()
    return engine, events, model


SPEC = resolve(["ngram-simple,ngram-mod"], False, NgramModParams(n_match=4, n_min=2, n_max=16),
               NgramMapParams(size_n=4, size_m=16))


@pytest.fixture(scope="module")
def engines(gemma_path: Path) -> Iterator[dict[str, tuple[Engine, Events]]]:
    plain, plain_events, plain_model = _engine(gemma_path, SpecConfig())
    spec, spec_events, spec_model = _engine(gemma_path, SPEC)
    yield {"plain": (plain, plain_events), "spec": (spec, spec_events)}
    for engine, model in ((plain, plain_model), (spec, spec_model)):
        engine.stop()
        model.close()


def _run(engine: Engine, events: Events, *jobs: CompletionJob) -> list[list[object]]:
    for job in jobs:
        engine.submit(engine.prepare(job))
    done = events.until_done([job.job_id for job in jobs])
    return [done[job.job_id] for job in jobs]


Plain = Callable[..., list[CompletionResult]]


@pytest.fixture(scope="module")
def plain(engines: dict[str, tuple[Engine, Events]]) -> Plain:
    """The plain engine's results for jobs handed over together, each set run once a module:
    without a prompt cache (cache_prompt false) they are a function of the jobs (their prompts,
    sampling, lengths and order), and two tests compare with the same set. Keyed on everything
    in the jobs but their ids."""
    done: dict[tuple[str, ...], list[CompletionResult]] = {}

    def run(*jobs: CompletionJob) -> list[CompletionResult]:
        key = tuple(job.model_dump_json(exclude={"job_id"}) for job in jobs)
        if key not in done:
            done[key] = [_result(r) for r in _run(*engines["plain"], *jobs)]
        return done[key]

    return run


def _result(run: list[object]) -> CompletionResult:
    final = run[-1]
    assert isinstance(final, FinalEvent) and isinstance(final.result, CompletionResult), final
    return final.result


def _job(prompt: str, sampling: SamplingParams, n_predict: int = 80,
         stream: bool = False, n_probs: int = 0) -> CompletionJob:
    return CompletionJob(model="gemma", prompt=prompt, n_predict=n_predict, stream=stream,
                         return_tokens=True, sampling=sampling, n_probs=n_probs)


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded-t0.2"])
def test_the_output_is_the_output_without_speculation(
        engines: dict[str, tuple[Engine, Events]], sampling: SamplingParams) -> None:
    [plain] = _run(*engines["plain"], _job(CODE, sampling))
    [spec] = _run(*engines["spec"], _job(CODE, sampling))
    want, got = _result(plain), _result(spec)
    assert got.tokens == want.tokens and got.content == want.content
    assert got.stop_type == want.stop_type and got.timings.predicted_n == 80
    assert want.timings.draft_n == 0 and "draft_n" not in want.timings.model_dump()
    assert got.timings.draft_n > 0, "repetitive code must draft"
    assert 0 < got.timings.draft_n_accepted <= got.timings.draft_n
    assert got.generation_settings.speculative_types == "none,ngram-simple,ngram-mod"


def test_a_speculating_run_and_a_plain_one_in_the_same_steps(
        engines: dict[str, tuple[Engine, Events]], plain: Plain) -> None:
    """Continuous batching: the code prompt drafts while a prose prompt (nothing to look up)
    decodes one token a step beside it; both are what they are alone without speculation."""
    prose = "The weather in spring is"
    want = plain(_job(CODE, SEEDED), _job(prose, SEEDED, n_predict=40))
    got = [_result(r) for r in _run(*engines["spec"], _job(CODE, SEEDED),
                                    _job(prose, SEEDED, n_predict=40))]
    assert [r.tokens for r in got] == [r.tokens for r in want]
    assert [r.content for r in got] == [r.content for r in want]
    assert got[0].timings.draft_n_accepted > 0


def test_each_accepted_token_is_its_own_streamed_event(
        engines: dict[str, tuple[Engine, Events]]) -> None:
    [plain] = _run(*engines["plain"], _job(CODE, GREEDY, n_predict=50, stream=True))
    [spec] = _run(*engines["spec"], _job(CODE, GREEDY, n_predict=50, stream=True))

    def tokens(run: list[object]) -> list[list[int]]:
        return [e.tokens for e in run if isinstance(e, TokenEvent) and e.tokens]

    assert tokens(spec) == tokens(plain) and all(len(t) == 1 for t in tokens(spec))
    assert len(tokens(spec)) == 50
    decoded = [e.n_decoded for e in spec if isinstance(e, TokenEvent) and e.tokens]
    assert decoded == list(range(1, 51))


def test_n_predict_and_probabilities_hold_under_speculation(
        engines: dict[str, tuple[Engine, Events]]) -> None:
    """n_predict stops at its count (the draft is cut to what is left), and every token has
    its probabilities, from the logits of its own position (computed in a batch of the draft's
    size, so equal to plain decoding's within float error)."""
    [plain] = _run(*engines["plain"], _job(CODE, GREEDY, n_predict=33, n_probs=3))
    [spec] = _run(*engines["spec"], _job(CODE, GREEDY, n_predict=33, n_probs=3))
    want, got = _result(plain), _result(spec)
    assert got.tokens == want.tokens and len(got.tokens) == 33
    assert [p.id for p in got.probs] == got.tokens
    for a, b in zip(got.probs, want.probs, strict=True):
        assert a.top[0].id == b.top[0].id == a.id  # greedy: the most probable
        assert a.p == pytest.approx(b.p, abs=0.01)
        near = {c.id: c.p for c in b.top}  # near-equal candidates may swap places
        assert all(c.p == pytest.approx(near.get(c.id, c.p), abs=0.01) for c in a.top)


def test_the_cache_holds_only_accepted_tokens(engines: dict[str, tuple[Engine, Events]]) -> None:
    """Rejected draft positions leave the slot's tokens (and the KV cache: the next request
    with the same prompt and its cache reused decodes to the same output)."""
    engine, events = engines["spec"]
    job = _job(CODE, GREEDY, n_predict=40)
    [first] = _run(engine, events, job)
    result = _result(first)
    slot = engine.slots[result.id_slot]
    prompt = engine.prepare(job).prompt_tokens
    assert slot.tokens == prompt + result.tokens[:-1]
    assert result.tokens_cached == len(slot.tokens)


def test_the_metrics_count_drafts_and_acceptance(
        engines: dict[str, tuple[Engine, Events]]) -> None:
    engine, events = engines["spec"]
    before = engine.metrics_snapshot()
    [run] = _run(engine, events, _job(CODE, GREEDY, n_predict=60))
    result = _result(run)
    after = engine.metrics_snapshot()
    assert after.spec_draft_tokens_total - before.spec_draft_tokens_total == result.timings.draft_n
    assert after.spec_accepted_tokens_total - before.spec_accepted_tokens_total == \
        result.timings.draft_n_accepted
    assert after.spec_drafts_total > before.spec_drafts_total
    assert len(after.spec_accepted_per_pos) == 16  # the largest draft of the modes
    assert after.spec_accepted_per_pos[0] >= after.spec_accepted_per_pos[-1]
    assert sum(after.spec_accepted_per_pos) == after.spec_accepted_tokens_total
    plain = engines["plain"][0].metrics_snapshot()
    assert plain.spec_draft_tokens_total == plain.spec_drafts_total == 0
    assert plain.spec_accepted_per_pos == []
    assert all(s.speculative for s in engine.slot_states())
    assert not any(s.speculative for s in engines["plain"][0].slot_states())


def test_a_requests_speculative_limits_hold(engines: dict[str, tuple[Engine, Events]]) -> None:
    """speculative.n_max caps each draft (0: none), speculative.n_min drops shorter drafts;
    the output stays the plain one."""
    engine, events = engines["spec"]
    [plain] = _run(*engines["plain"], _job(CODE, GREEDY, n_predict=40))
    want = _result(plain).tokens
    for limits, most in ((DraftLimits(n_max=2), 2), (DraftLimits(n_max=0), 0),
                         (DraftLimits(n_min=17), 0)):
        job = _job(CODE, GREEDY, n_predict=40).model_copy(update={"draft_limits": limits})
        [run] = _run(engine, events, job)
        result = _result(run)
        assert result.tokens == want
        if most == 0:
            assert result.timings.draft_n == 0, limits
        else:
            assert 0 < result.timings.draft_n <= most * 40, limits


CACHE_SPEC = resolve(["ngram-cache"], False, NgramModParams(), NgramMapParams())


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded-t0.2"])
def test_ngram_cache_output_is_the_output_without_speculation(
        plain: Plain, gemma_path: Path, sampling: SamplingParams) -> None:
    """--spec-type ngram-cache (lookup decoding, a context cache per slot): the code prompt
    drafting beside a prose one in the same steps, both what they are without speculation."""
    prose = "The weather in spring is"
    want = plain(_job(CODE, sampling), _job(prose, sampling, n_predict=40))
    engine, events, model = _engine(gemma_path, CACHE_SPEC)
    try:
        got = [_result(r) for r in _run(engine, events, _job(CODE, sampling),
                                        _job(prose, sampling, n_predict=40))]
    finally:
        engine.stop()
        model.close()
    assert [r.tokens for r in got] == [r.tokens for r in want]
    assert [r.content for r in got] == [r.content for r in want]
    assert got[0].timings.draft_n > 0, "repetitive code must draft"
    assert 0 < got[0].timings.draft_n_accepted <= got[0].timings.draft_n
    assert got[0].generation_settings.speculative_types == "none,ngram-cache"
