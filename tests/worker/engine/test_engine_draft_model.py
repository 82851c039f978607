"""Speculative decoding with a draft model (--spec-type draft-simple, -md) in the slot engine,
in-process on real GGUF files: Gemma 3 270M drafting for itself (every draft accepted), a tiny
random model with Gemma's vocabulary drafting for Gemma (next to nothing accepted: the
rejection path), and the output token for token the output without a draft (greedy and seeded
at temperature 0.2, alone and beside a plain run in the same steps); a draft model whose
vocabulary differs is refused before the worker serves."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from scheduler.contract.jobs import CompletionJob, SamplingParams, SamplingSettings
from scheduler.contract.results import CompletionResult, FinalEvent
from tests.worker.engine.test_engine_tiny import Events
from worker.engine.loop import Engine
from worker.engine.requests import EngineDefaults
from worker.process.startup import load_draft
from worker.runtime import flags
from worker.runtime.model import ContextPlan, LoadedModel
from worker.runtime.settings import WorkerSettings
from worker.speculative.config import SpecConfig
from worker.speculative.draft_model import DraftLoadError

N_SLOTS = 2
PROSE = "Write a short story about a lighthouse keeper who finds a message in a bottle."
GREEDY = SamplingParams(temperature=0.0)
SEEDED = SamplingParams(temperature=0.2, seed=42)
PLAN = ContextPlan(n_ctx=4096, n_slots=N_SLOTS, kv_unified=False, n_batch=512, n_ubatch=512,
                   n_threads=1, n_threads_batch=1, swa_full=True, flash_attn="auto",
                   cache_type_k="f16", cache_type_v="f16")


def _settings(draft: Path | None, *types: str, n_max: int = 3) -> WorkerSettings:
    return WorkerSettings(spec_type=list(types), spec_draft_model=None if draft is None
                          else str(draft), spec_draft_n_max=n_max)


def _engine(path: Path, settings: WorkerSettings) -> tuple[Engine, Events, LoadedModel]:
    model = LoadedModel(path, PLAN)
    try:
        model.draft = load_draft(settings, model)
    except Exception:
        model.close()
        raise
    events = Events()
    spec = flags.speculative(settings) if settings.spec_type else SpecConfig()
    defaults = EngineDefaults(sampling=SamplingSettings(seed=1), n_predict=-1, n_keep=0,
                              cache_prompt=False, special=False, model_alias="gemma",
                              worker_id="w-test", spec=spec)
    engine = Engine(model, defaults, events.sink)
    engine.start()
    return engine, events, model


@pytest.fixture(scope="module")
def engines(gemma_path: Path, tiny_gemma_vocab_path: Path
            ) -> Iterator[dict[str, tuple[Engine, Events]]]:
    built = {
        "plain": _engine(gemma_path, _settings(None)),
        "self": _engine(gemma_path, _settings(gemma_path, "draft-simple")),
        "tiny": _engine(gemma_path, _settings(tiny_gemma_vocab_path, "draft-simple")),
    }
    yield {name: (engine, events) for name, (engine, events, _) in built.items()}
    for engine, _, model in built.values():
        engine.stop()
        model.close()


def _run(engine: Engine, events: Events, *jobs: CompletionJob) -> list[CompletionResult]:
    """The jobs' results; prepared first and handed over together, so their prompts are
    decoded in the same steps on every engine (a prompt's logits depend a little on what is
    decoded beside it, which would change a near tie)."""
    requests = [engine.prepare(job) for job in jobs]
    for request in requests:
        engine.submit(request)
    done = events.until_done([job.job_id for job in jobs])
    results = []
    for job in jobs:
        final = done[job.job_id][-1]
        assert isinstance(final, FinalEvent) and isinstance(final.result, CompletionResult), final
        results.append(final.result)
    return results


Plain = Callable[..., list[CompletionResult]]


@pytest.fixture(scope="module")
def plain(engines: dict[str, tuple[Engine, Events]]) -> Plain:
    """The plain engine's results for jobs handed over together (`_run`), each set run once a
    module: without a prompt cache (cache_prompt false) they are a function of the jobs (their
    prompts, sampling, lengths and order), and the tests of both drafts compare with the same
    sets. Keyed on everything in the jobs but their ids."""
    done: dict[tuple[str, ...], list[CompletionResult]] = {}

    def run(*jobs: CompletionJob) -> list[CompletionResult]:
        key = tuple(job.model_dump_json(exclude={"job_id"}) for job in jobs)
        if key not in done:
            done[key] = _run(*engines["plain"], *jobs)
        return done[key]

    return run


def _job(prompt: str, sampling: SamplingParams, n_predict: int = 48) -> CompletionJob:
    return CompletionJob(model="gemma", prompt=prompt, n_predict=n_predict,
                         return_tokens=True, sampling=sampling)


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded-t0.2"])
@pytest.mark.parametrize("draft", ["self", "tiny"])
def test_the_output_is_the_output_without_a_draft(
        engines: dict[str, tuple[Engine, Events]], plain: Plain, sampling: SamplingParams,
        draft: str) -> None:
    [want] = plain(_job(PROSE, sampling))
    [got] = _run(*engines[draft], _job(PROSE, sampling))
    assert got.tokens == want.tokens and got.content == want.content
    assert got.timings.predicted_n == 48 and got.stop_type == want.stop_type
    assert got.generation_settings.speculative_types == "none,draft-simple"
    assert got.timings.draft_n > 0


def test_gemma_drafting_for_itself_is_accepted_whole(
        engines: dict[str, tuple[Engine, Events]]) -> None:
    """Greedy: the draft model is the target, so every drafted token is the target's; drafts
    are 3 tokens (--spec-draft-n-max's default) but for the last, cut to what n_predict
    leaves."""
    engine, events = engines["self"]
    before = engine.metrics_snapshot()
    [got] = _run(engine, events, _job(PROSE, GREEDY))
    after = engine.metrics_snapshot()
    assert got.timings.draft_n_accepted == got.timings.draft_n >= 33
    steps = after.spec_drafts_total - before.spec_drafts_total
    assert 1 + steps + got.timings.draft_n_accepted == 48  # each step: its token, the draft's
    assert steps <= 48 // 4 + 1  # 4 tokens a step (the sampled one and 3 accepted)
    assert after.spec_draft_tokens_total - before.spec_draft_tokens_total == got.timings.draft_n
    assert after.spec_accepted_tokens_total - before.spec_accepted_tokens_total == \
        got.timings.draft_n_accepted
    assert len(after.spec_accepted_per_pos) == 3
    assert all(s.speculative for s in engine.slot_states())


def test_a_random_draft_is_rejected(engines: dict[str, tuple[Engine, Events]]) -> None:
    """The tiny random model's drafts are (almost) never Gemma's tokens: each step drafts and
    the target's own token replaces the first draft token, so the output goes on one token a
    step, the rejected positions out of the cache."""
    engine, events = engines["tiny"]
    job = _job(PROSE, GREEDY)
    [got] = _run(engine, events, job)
    assert got.timings.draft_n >= 3 * 40
    assert got.timings.draft_n_accepted <= got.timings.draft_n // 10
    slot = engine.slots[got.id_slot]
    assert slot.tokens == engine.prepare(job).prompt_tokens + got.tokens[:-1]


@pytest.mark.parametrize("draft", ["self", "tiny"])
def test_a_drafting_run_and_a_plain_one_in_the_same_steps(
        engines: dict[str, tuple[Engine, Events]], plain: Plain, draft: str) -> None:
    """Continuous batching: two runs in one engine's steps, one speculating and one that may
    not (speculative.n_max 0), each its plain output."""
    from scheduler.contract.jobs import DraftLimits

    other = "The capital of France is"
    may_not = _job(other, SEEDED, n_predict=32).model_copy(
        update={"draft_limits": DraftLimits(n_max=0)})
    want = plain(_job(PROSE, SEEDED), _job(other, SEEDED, n_predict=32))
    got = _run(*engines[draft], _job(PROSE, SEEDED), may_not)
    assert [r.tokens for r in got] == [r.tokens for r in want]
    assert got[0].timings.draft_n > 0 and got[1].timings.draft_n == 0


def test_a_draft_model_of_another_vocabulary_is_refused(gemma_path: Path,
                                                        tiny_model_path: Path) -> None:
    model = LoadedModel(gemma_path, PLAN)
    try:
        with pytest.raises(DraftLoadError, match="the target and draft vocabs are not compatible"):
            load_draft(_settings(tiny_model_path, "draft-simple"), model)
    finally:
        model.close()


def test_a_draft_model_without_draft_simple_is_not_loaded(gemma_path: Path) -> None:
    """llama-server's rule: -md alone drafts with nothing (it loads the model and lets it go)."""
    model = LoadedModel(gemma_path, PLAN)
    try:
        assert load_draft(_settings(gemma_path), model) is None
        assert not flags.speculative(_settings(gemma_path)).enabled
    finally:
        model.close()


LLAMA_SERVER_TOKENS = ([108, 6974, 496, 2822, 3925, 1003, 496, 63937, 64222, 1015, 15249, 496,
                        3618, 528, 496, 11988, 236761] * 3)[:48]
"""The vendored llama-server's 48 greedy tokens for PROSE (with either draft, and at
temperature 0.2 seed 42 too: Gemma repeats its first sentence)."""


@pytest.mark.parametrize(("draft", "draft_n", "accepted"), [
    # llama-server -m gemma -md gemma --spec-type draft-simple -c 4096 -np 2
    ("self", 35, 35),
    # llama-server -m gemma -md tiny-gemma-vocab.gguf --spec-type draft-simple -c 4096 -np 2
    ("tiny", 135, 0),
], ids=["self", "tiny"])
def test_drafts_and_acceptance_are_llama_servers(engines: dict[str, tuple[Engine, Events]],
                                                 draft: str, draft_n: int,
                                                 accepted: int) -> None:
    """The same greedy request with llama-server's defaults (--spec-draft-n-max 3, p_min 0):
    the same tokens and exactly the drafts and acceptance llama-server reported
    (`timings.draft_n`, `draft_n_accepted`, recorded from ~/.cache/llamaq-bench/bin/llama-server
    with `cache_prompt: false`)."""
    [got] = _run(*engines[draft], _job(PROSE, GREEDY))
    assert got.tokens == LLAMA_SERVER_TOKENS
    assert (got.timings.draft_n, got.timings.draft_n_accepted) == (draft_n, accepted)


def test_a_requests_p_min_cuts_the_drafts(engines: dict[str, tuple[Engine, Events]]) -> None:
    """speculative.p_min: a draft stops at a token the draft model is less sure of (its
    probability among the 10 largest logits); Gemma drafting for itself is not 99 % sure of
    every token of its story, so fewer tokens are drafted, and the output is the same."""
    from scheduler.contract.jobs import DraftLimits

    engine, events = engines["self"]
    job = _job(PROSE, GREEDY, n_predict=24)
    [strict, loose] = [_run(engine, events, job.model_copy(update={
        "draft_limits": DraftLimits(p_min=p_min)}))[0] for p_min in (0.99, 0.0)]
    assert strict.timings.draft_n < loose.timings.draft_n
    assert strict.tokens == loose.tokens == LLAMA_SERVER_TOKENS[:24]


@pytest.mark.parametrize("draft", ["self", "tiny"])
def test_two_drafting_runs_draft_together(engines: dict[str, tuple[Engine, Events]],
                                          plain: Plain, draft: str) -> None:
    """Two speculating runs in the same steps (their drafts made in one draft-model decode per
    position): each its plain output, and each drafts and has accepted what it does alone."""
    other = "The capital of France is"
    jobs = (_job(PROSE, GREEDY), _job(other, GREEDY, n_predict=32))
    want = plain(*jobs)
    got = _run(*engines[draft], *jobs)
    assert [r.tokens for r in got] == [r.tokens for r in want]
    alone = [_run(*engines[draft], job)[0] for job in jobs]
    assert [(r.timings.draft_n, r.timings.draft_n_accepted) for r in got] == \
        [(r.timings.draft_n, r.timings.draft_n_accepted) for r in alone]
    assert all(r.timings.draft_n > 0 for r in got)


def test_draft_threads_flags_reach_the_draft_context(gemma_path: Path,
                                                     tiny_gemma_vocab_path: Path) -> None:
    """-td/--threads-draft and -tbd/--threads-batch-draft are the draft context's threads, as
    llama-server's (common_base_params_to_speculative); without them the target's."""
    import llama_cpp as lc

    model = LoadedModel(gemma_path, PLAN)
    try:
        for argv, expected in ((["-td", "1", "-tbd", "3"], (1, 3)), (["-td", "1"], (1, 1)),
                               ([], (PLAN.n_threads, PLAN.n_threads_batch))):
            settings = WorkerSettings.from_args(["--spec-type", "draft-simple", "-md",
                                             str(tiny_gemma_vocab_path), *argv])
            draft = load_draft(settings, model)
            assert draft is not None
            try:
                assert (lc.llama_n_threads(draft.ctx),
                        lc.llama_n_threads_batch(draft.ctx)) == expected, argv
            finally:
                draft.close()
    finally:
        model.close()
