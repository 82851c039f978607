"""A step's speculation for the engine: each generating run's draft (the drafter's, cut to the
room its slot and the step's batch leave), the draft tokens in the batch after the run's
sampled token (logits on for all), and after the decode the verification position by position
with the run's own sampler chain (llama.cpp's common_sampler_sample_and_accept_n), the rejected
positions out of the KV cache and the slot's tokens (llama_memory_seq_rm), and the counts
llama-server reports (timings.draft_n/draft_n_accepted, llamacpp:spec_decode_*).

Owns: the per-run draft state and counters, the verification and its KV clean-up. The engine
puts the run's sampled token in the batch and hands each accepted token to its token rules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from scheduler.contract.jobs import DEFAULT_SEED
from scheduler.contract.results import TokenProbs
from scheduler.registry import WorkerMetrics
from worker.engine.slot_run import SlotRun
from worker.engine.step_batch import StepBatch
from worker.speculative.drafter import Drafter
from worker.speculative.synthetic import SynthRng, conditional, resolve_rates

Sample = Callable[[SlotRun, int, bool], tuple[int, TokenProbs | None]]
"""The run's next token (and its probabilities) from the logits at a view index; the bool:
whether the run's sampler chain accepts it (synthetic acceptance decides that itself)."""
Emit = Callable[[SlotRun, int, TokenProbs | None], bool]
"""One accepted token through the run's token rules; False when the run ended."""
Remove = Callable[[int, int], None]
"""Remove a slot's KV cache from a position on (llama_memory_seq_rm(seq, pos, -1))."""
IsEog = Callable[[int], bool]


@dataclass
class RunSpec:
    """One run's speculation: its draft in this step, and what it drafted and had accepted."""

    draft: list[int] = field(default_factory=list)
    base: int = -1
    """Position of the run's sampled token in this step (its draft follows it)."""
    begun: bool = False
    n_verif_steps: int = 0
    rng: SynthRng | None = None
    """Synthetic acceptance's random numbers (seeded with the request's seed)."""
    accepted_per_pos: list[int] = field(default_factory=list)


class Speculation:
    """The engine's speculation (one per engine, for all its slots)."""

    def __init__(self, drafter: Drafter, n_ctx_slot: int) -> None:
        self.drafter = drafter
        self.n_ctx_slot = n_ctx_slot
        config = drafter.config
        self.synth_probs = conditional(resolve_rates(config.synth_len, config.synth_rates,
                                                     drafter.n_max))
        """--spec-synth-*: per draft position, the chance it is accepted (empty: off)."""
        self.runs: dict[int, RunSpec] = {}
        """By slot id, the runs on the slots (one RunSpec per request, made when the run
        first needs it, dropped when it leaves the slot)."""
        self._deferred: list[SlotRun] = []

    def of(self, active: SlotRun) -> RunSpec:
        return self.runs.setdefault(active.slot.slot_id, RunSpec())

    def begin(self, active: SlotRun) -> None:
        """The run's prompt is evaluated (its first token sampled): common_speculative_begin."""
        spec = self.of(active)
        if not spec.begun and speculates(active):
            spec.begun = True
            self.drafter.begin(active.slot.slot_id, list(active.slot.tokens))

    def n_draft_max(self, active: SlotRun) -> int:
        """llama-server's get_n_draft_max: what fits the slot (room for one more token, for a
        context shift) and the tokens left to predict."""
        n_max = self.n_ctx_slot - len(active.slot.tokens) - 2
        n_predict = active.request.n_predict
        if n_predict >= 0 and n_predict - len(active.generated) > 0:
            n_max = min(n_max, n_predict - len(active.generated) - 1)
        return n_max

    def make_drafts(self, generating: list[SlotRun], room: int) -> None:
        """Each generating run's draft for this step, in slot order, while the batch has
        `room` for draft tokens (beyond one token per generating run); a request's
        speculative.n_max caps its draft, a draft shorter than its speculative.n_min is
        dropped (as llama-server did before those fields were compiled out) and its
        speculative.p_min is a draft model's least probability (draft-simple)."""
        asked: list[SlotRun] = []  # their drafts come from the draft model, made together
        for active in generating:
            spec = self.of(active)
            spec.draft = []
            n_max = self.n_draft_max(active)
            if n_max <= 0 or room <= 0 or not spec.begun or not speculates(active):
                continue
            limits = active.request.job.draft_limits
            if limits is not None and limits.n_max is not None:
                n_max = min(n_max, limits.n_max)
                if n_max <= 0:
                    continue
            draft = self.drafter.draft(active.slot.slot_id, list(active.slot.tokens),
                                       active.next_token, min(n_max, room),
                                       None if limits is None else limits.p_min)
            if not draft and self.drafter.asks_model:
                asked.append(active)
                continue
            room -= self._take(active, draft)
        if asked:
            drafts = self.drafter.model_drafts()
            for active in asked:
                room -= self._take(active, drafts.get(active.slot.slot_id, [])[:max(room, 0)])

    def _take(self, active: SlotRun, draft: list[int]) -> int:
        """The run's draft for this step (none when shorter than its speculative.n_min)."""
        limits = active.request.job.draft_limits
        if limits is not None and limits.n_min is not None and len(draft) < limits.n_min:
            draft = []  # shorter than the request's speculative.n_min: not worth it
        self.of(active).draft = draft
        active.draft_n += len(draft)
        return len(draft)

    def add_draft(self, batch: StepBatch, n: int, active: SlotRun) -> int:
        """The run's draft into the batch after its sampled token (at batch index n - 1)."""
        spec = self.of(active)
        if not spec.draft:
            return n
        spec.base = n - 1
        n_end = batch.put_span(n, spec.draft, len(active.slot.tokens), active.slot.slot_id,
                               True, False)
        active.slot.tokens.extend(spec.draft)
        return n_end

    def has_draft(self, active: SlotRun) -> bool:
        spec = self.runs.get(active.slot.slot_id)
        return spec is not None and bool(spec.draft) and spec.base >= 0

    def verify(self, active: SlotRun, off: int, size: int, sample: Sample, emit: Emit,
               remove: Remove, is_eog: IsEog) -> None:
        """The run's draft against the target, in the view [off, off + size) that holds its
        sampled token: sample each position with the run's chain, stop at the first token
        that differs from the draft (or an EOG before the draft's end), then hand the tokens
        to `emit` in order with the slot's tokens as plain decoding would have them. A draft
        cut by the view's end is verified up to there; its later positions leave the cache
        once every view is decoded (finish_decode)."""
        spec = self.runs[active.slot.slot_id]
        draft, base = spec.draft, spec.base
        spec.draft, spec.base = [], -1
        n_in_view = min(len(draft), off + size - base - 1)
        checked = draft[:n_in_view]
        picked = self._synthetic(active, spec, checked, base - off, sample, is_eog) \
            if self.synth_probs else _matched(active, checked, base - off, sample, is_eog)
        n_accepted = len(picked) - 1
        self.drafter.accept(active.slot.slot_id, n_accepted)
        active.draft_n_accepted += n_accepted
        spec.n_verif_steps += 1
        if not spec.accepted_per_pos:
            spec.accepted_per_pos = [0] * self.drafter.n_max
        for i in range(min(n_accepted, len(spec.accepted_per_pos))):
            spec.accepted_per_pos[i] += 1
        slot = active.slot
        first = len(slot.tokens) - len(draft)  # where the draft begins
        del slot.tokens[first:]
        whole_view = n_in_view == len(draft)
        if whole_view:
            remove(slot.slot_id, first + n_accepted)
        for i, (token, probs) in enumerate(picked):
            if not emit(active, token, probs):
                break
            if i < n_accepted:
                slot.tokens.append(token)
        if not whole_view:
            self._deferred.append(active)
        elif len(slot.tokens) < first + n_accepted:  # ended before its accepted tokens
            remove(slot.slot_id, len(slot.tokens))

    def _synthetic(self, active: SlotRun, spec: RunSpec, checked: list[int], start: int,
                   sample: Sample, is_eog: IsEog) -> list[tuple[int, TokenProbs | None]]:
        """llama-server's server_sample_and_accept_synth: the target samples each position
        (its token not yet accepted), a draw decides whether the draft's token stands there
        (never a drafted end-of-generation token; the chain accepts it, the grammar does
        not), else the target's token does and ends the draft."""
        if spec.rng is None:
            seed = active.request.sampling.seed
            spec.rng = SynthRng(None if seed == DEFAULT_SEED else seed)
        picked: list[tuple[int, TokenProbs | None]] = []
        sampler = active.request.sampler
        for i, drafted in enumerate(checked):
            token, probs = sample(active, start + i, False)
            if spec.rng.uniform() < self.synth_probs[i] and not is_eog(drafted):
                sampler.accept_token(drafted, grammar=False)
                picked.append((drafted, None))
                continue
            sampler.accept_token(token, grammar=True)
            picked.append((token, probs))
            return picked
        picked.append(sample(active, start + len(checked), True))
        return picked

    def finish_decode(self, remove: Remove) -> None:
        """After every view of the step: the cache of drafts cut by a view's end ends where
        their slots' tokens do."""
        for active in self._deferred:
            remove(active.slot.slot_id, len(active.slot.tokens))
        self._deferred.clear()

    def end(self, active: SlotRun, metrics: WorkerMetrics) -> None:
        """The run left its slot: its tokens to the drafter (-lcd learns them), its counts
        into the worker's /metrics counters (as llama-server's metrics_on_prediction sums a
        released slot's)."""
        spec = self.runs.pop(active.slot.slot_id, None)
        if active.request.job.learn_lookup:  # under --tenants: a tenant that shares it
            self.drafter.learn(active.slot.tokens)
        metrics.spec_draft_tokens_total += active.draft_n
        metrics.spec_accepted_tokens_total += active.draft_n_accepted
        if spec is None:
            return
        metrics.spec_drafts_total += spec.n_verif_steps
        per_pos = metrics.spec_accepted_per_pos
        if len(per_pos) < len(spec.accepted_per_pos):
            per_pos += [0] * (len(spec.accepted_per_pos) - len(per_pos))
        for i, count in enumerate(spec.accepted_per_pos):
            per_pos[i] += count


def _matched(active: SlotRun, checked: list[int], start: int, sample: Sample,
             is_eog: IsEog) -> list[tuple[int, TokenProbs | None]]:
    """common_sampler_sample_and_accept_n: the target's token at each position, up to the
    first that differs from the draft (or an EOG before the draft's end), or one past it."""
    picked: list[tuple[int, TokenProbs | None]] = []
    for i in range(len(checked) + 1):
        token, probs = sample(active, start + i, True)
        picked.append((token, probs))
        if i == len(checked) or token != checked[i] or (is_eog(token) and i + 1 < len(checked)):
            break
    return picked


def speculates(active: SlotRun) -> bool:
    """Runs with media in their prompt do not speculate (their placeholders are not text)."""
    return active.request.media is None
