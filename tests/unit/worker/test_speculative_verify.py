"""The verification's bookkeeping (worker/engine/verify.py) on a scripted target: which
tokens are emitted, in order, with the slot's tokens as plain decoding would have them at each;
where the KV cache is cut; a draft cut by a smaller retried view; a run that ends mid-draft;
and the counters."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from scheduler.contract.results import TokenProbs
from scheduler.registry import WorkerMetrics
from worker.engine.slot_run import SlotRun
from worker.engine.step_batch import StepBatch
from worker.engine.verify import Speculation
from worker.kv.slots import SlotCache
from worker.speculative.drafter import Drafter

EOG = 99


class FixedDraft:
    """A mode that always proposes the same draft."""

    name = "fixed"

    def __init__(self, draft: list[int]) -> None:
        self.n_max = 8
        self.drafted = draft
        self.accepted: list[int] = []

    def begin(self, seq: int, prompt: list[int]) -> None:
        pass

    def draft(self, seq: int, prompt: list[int], id_last: int) -> list[int]:
        return list(self.drafted)

    def accept(self, seq: int, n_accepted: int, is_other: bool) -> None:
        self.accepted.append(n_accepted)


class Target:
    """The target's picks by batch index, and what the engine would do with each token."""

    def __init__(self, picks: list[int], stop_after: int | None = None) -> None:
        self.picks = picks
        self.emitted: list[tuple[int, int]] = []  # (token, len(slot.tokens) when emitted)
        self.removed: list[tuple[int, int]] = []
        self.stop_after = stop_after

    def sample(self, active: SlotRun, index: int,
               accept: bool) -> tuple[int, TokenProbs | None]:
        return self.picks[index], None

    def emit(self, active: SlotRun, token: int, probs: TokenProbs | None) -> bool:
        self.emitted.append((token, len(active.slot.tokens)))
        active.next_token = token
        return self.stop_after is None or len(self.emitted) < self.stop_after

    def remove(self, seq: int, pos: int) -> None:
        self.removed.append((seq, pos))


def _run(prompt: list[int], next_token: int) -> SlotRun:
    slot = SlotCache(0)
    slot.tokens = list(prompt)
    request = SimpleNamespace(media=None, n_predict=-1, job=SimpleNamespace(draft_limits=None,
                                                                     learn_lookup=True))
    run = SlotRun(request=cast(Any, request), slot=slot, text=cast(Any, None), task_no=1,
                  n_cached=0, t_start=0.0)
    run.next_token = next_token
    return run


def _step(draft: list[int], picks: list[int], view: tuple[int, int] = (0, 64),
          stop_after: int | None = None) -> tuple[Speculation, SlotRun, Target, FixedDraft]:
    mode = FixedDraft(draft)
    config = SimpleNamespace(drafting=[], synth_len=None, synth_rates=[])
    spec = Speculation(Drafter(cast(Any, config), 1, modes=[mode]), 4096)
    run = _run([1, 2, 3], next_token=4)
    spec.begin(run)
    spec.make_drafts([run], room=64)
    batch = StepBatch(64)
    try:
        run.slot.tokens.append(run.next_token)  # the engine's _add of the sampled token
        n = spec.add_draft(batch, 1, run)
        assert n == 1 + len(draft) and run.slot.tokens == [1, 2, 3, 4, *draft]
        target = Target(picks, stop_after)
        spec.verify(run, view[0], view[1], target.sample, target.emit, target.remove,
                    lambda t: t == EOG)
    finally:
        batch.free()
    return spec, run, target, mode


def test_a_whole_draft_accepted_gives_one_more_token() -> None:
    _, run, target, mode = _step([5, 6, 7], picks=[5, 6, 7, 8])
    assert target.emitted == [(5, 4), (6, 5), (7, 6), (8, 7)]  # as plain decoding's
    assert run.slot.tokens == [1, 2, 3, 4, 5, 6, 7] and run.next_token == 8
    assert target.removed == [(0, 7)]  # nothing rejected: the cut is at the end
    assert (run.draft_n, run.draft_n_accepted, mode.accepted) == (3, 3, [3])


def test_the_first_differing_token_ends_the_draft() -> None:
    _, run, target, mode = _step([5, 6, 7], picks=[5, 9, 7, 8])
    assert target.emitted == [(5, 4), (9, 5)]
    assert run.slot.tokens == [1, 2, 3, 4, 5] and run.next_token == 9
    assert target.removed == [(0, 5)]  # 6 and 7 leave the cache
    assert (run.draft_n, run.draft_n_accepted, mode.accepted) == (3, 1, [1])


def test_an_end_of_generation_before_the_drafts_end_stops_it() -> None:
    _, run, target, _ = _step([5, EOG, 7], picks=[5, EOG, 7, 8])
    assert [t for t, _ in target.emitted] == [5, EOG]
    assert run.draft_n_accepted == 1


def test_a_draft_cut_by_the_view_is_verified_up_to_there_and_cleaned_after() -> None:
    spec, run, target, _ = _step([5, 6, 7, 8], picks=[5, 6, 9, 9, 9], view=(0, 3))
    # the view holds the sampled token and two draft tokens: both match, the third pick is
    # the logits after them
    assert [t for t, _ in target.emitted] == [5, 6, 9]
    assert target.removed == []  # positions of the next view are not decoded yet
    assert run.slot.tokens == [1, 2, 3, 4, 5, 6]
    spec.finish_decode(target.remove)
    assert target.removed == [(0, 6)]


def test_a_run_that_ends_mid_draft_keeps_only_what_plain_decoding_would() -> None:
    _, run, target, _ = _step([5, 6, 7], picks=[5, 6, 7, 8], stop_after=2)
    assert [t for t, _ in target.emitted] == [5, 6]
    assert run.slot.tokens == [1, 2, 3, 4, 5]  # the stopping token is not in the cache
    assert target.removed == [(0, 7), (0, 5)]


def test_the_run_counts_go_to_the_metrics_when_it_leaves() -> None:
    spec, run, _, _ = _step([5, 6, 7], picks=[5, 9, 7, 8])
    metrics = WorkerMetrics()
    spec.end(run, metrics)
    assert (metrics.spec_draft_tokens_total, metrics.spec_accepted_tokens_total,
            metrics.spec_drafts_total) == (3, 1, 1)
    assert metrics.spec_accepted_per_pos == [1, 0, 0, 0, 0, 0, 0, 0]
    assert spec.runs == {}
