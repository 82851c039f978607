"""What a sampled token does to its run: the text it makes final (stop words held back), the
reasoning tracker, its probabilities' text, the stop rules (worker/engine/stopping.py) with a
context shift first when the slot is full, and the run's streamed event.

Owns: the per-token rules. The engine samples the token and ends the run when a rule says so.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from scheduler.contract.results import TokenEvent, TokenProbs
from worker.engine.slot_run import SlotRun
from worker.engine.stopping import StepState, StopReason, indent_cut, stop_reason
from worker.kv import moves as kv_moves
from worker.runtime.vocab import Vocab

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TokenRules:
    vocab: Vocab
    special: bool
    """-sp: special tokens are written as text (without it, only a request's preserved
    tokens are)."""
    context_shift: bool
    n_ctx_slot: int
    shift: Callable[[SlotRun], bool]
    """Shift a full slot's context (worker/kv/moves.py); False when the cache cannot."""

    def apply(self, active: SlotRun, token: int, probs: TokenProbs | None,
              now: float) -> tuple[TokenEvent | None, StopReason | None]:
        """`token` into `active`; its event (streamed runs) and why the run stops (None: on)."""
        request = active.request
        active.generated.append(token)
        active.next_token = token
        is_eog = self.vocab.is_eog(token)
        ends = is_eog and not request.sampling.ignore_eos
        special = self.special or token in request.preserved
        content = active.text.push(b"" if ends else self.vocab.piece(token, special))
        if active.reasoning is not None:
            active.reasoning.after_token(active.text.text, self.vocab)
        if "\n" in content:
            active.has_new_line = True
        reason = self.stop_reason(active, is_eog, now)
        if reason is not None:
            content += active.text.finish()
        if probs is not None:
            probs.token = content
            probs.bytes = list(content.encode())
            active.probs.append(probs)
        if not request.job.stream:
            return None, reason
        timings = active.timings(now) if request.job.timings_per_token else None
        return TokenEvent(
            content=content, tokens=[token], timings=timings,
            n_decoded=len(active.generated), n_prompt_tokens=request.n_prompt,
            probs=[probs] if probs is not None else [],
            post_sampling_probs=request.job.post_sampling_probs), reason

    def resume(self, active: SlotRun) -> None:
        """A continuation's run takes up where the dead worker stopped (its tokens replayed,
        its probabilities and generation time kept)."""
        resumed = active.request.resumed
        if resumed is not None:
            self.replay(active, resumed.tokens)
            active.probs = list(resumed.probs)
            active.earlier_predicted_ms = resumed.predicted_ms

    def replay(self, active: SlotRun, tokens: list[int]) -> None:
        """A continuation's earlier tokens into its fresh run (scheduler/migration.py): the
        text they made (a stop string's beginning stays held back, so a stop string split by
        the migration still stops), the reasoning tracker, new lines, n_indent's line; no
        events, no stop rules (none fired before, or the job would have ended)."""
        n_indent = active.request.job.n_indent
        for token in tokens:
            active.generated.append(token)
            content = active.text.push(self.vocab.piece(token, self.special))
            if active.reasoning is not None:
                active.reasoning.after_token(active.text.text, self.vocab)
                active.reasoning.forced.clear()  # a forced end already under way went out
            if "\n" in content:
                active.has_new_line = True
            _, active.line_start = indent_cut(active.text.text, active.line_start, n_indent)

    def stop_reason(self, active: SlotRun, is_eog: bool, now: float) -> StopReason | None:
        """The stop rules on this run's state; shifts the context first when it is full and
        --context-shift is on; cuts the text for n_indent."""
        request = active.request
        context_full = len(active.slot.tokens) + 1 >= self.n_ctx_slot
        predict_left = request.n_predict < 0 or len(active.generated) < request.n_predict
        if context_full and predict_left and not (is_eog and not request.sampling.ignore_eos) \
                and not active.text.stopping_word:
            active.truncated = True
            context_full = not (self.context_shift and self.shift(active))
        cut, line_start = indent_cut(active.text.text, active.line_start, request.job.n_indent)
        reason = stop_reason(StepState(
            is_eog=is_eog, ignore_eos=request.sampling.ignore_eos,
            stopping_word=bool(active.text.stopping_word), n_generated=len(active.generated),
            n_predict=request.n_predict, context_full=context_full,
            elapsed_ms=(now - active.t_prompt_done) * 1000,
            t_max_predict_ms=request.job.t_max_predict_ms, has_new_line=active.has_new_line,
            under_indented=cut is not None))
        if reason is StopReason.N_INDENT and cut is not None:
            active.text.text = active.text.text[:cut]
        active.line_start = line_start
        return reason


def shift_context(kv: kv_moves.LlamaKv, n_ctx_slot: int, active: SlotRun) -> bool:
    """--context-shift (worker/kv/moves.py); False when the cache cannot shift."""
    request = active.request
    if request.media is not None:  # llama-server: no context shift with media
        return False
    n_keep = len(request.prompt_tokens) if request.n_keep < 0 else request.n_keep
    dropped = kv_moves.shift_context(kv, active.slot, n_keep, request.n_discard, n_ctx_slot)
    if dropped is not None:
        log.debug("job %s: context shift, %d tokens dropped", request.job.job_id, dropped)
    return dropped is not None
