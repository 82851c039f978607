"""A prompt's way into a slot's cache, step by step: where this step's chunk may end, the
context checkpoint before it, the KV tier's state at its boundary, and media chunks evaluated
in decodes of their own (`media_chunks`, which the embedder's media inputs take too).

Owns: those per-run decisions and the llama.cpp calls they make; the engine decides when
(worker/engine/loop.py), the step's plan how much (worker/engine/step_plan.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import llama_cpp as lc

from scheduler.contract.errors import LlamaqError
from scheduler.registry import WorkerMetrics
from worker.engine.slot_run import SlotRun
from worker.kv import moves as kv_moves
from worker.kv.checkpoints import CheckpointRules
from worker.kv.snapshots import save_slot
from worker.runtime.media import MediaPrompt, MediaSpan, Projector
from worker.runtime.model import LoadedModel

log = logging.getLogger(__name__)

TierState = Callable[[list[int], bytes, str | None], None]
"""Takes a prompt prefix's KV state, with its cache salt, for the fleet-wide KV tier
(worker/kv/tier.py)."""


class Prefill:
    def __init__(self, model: LoadedModel, kv: kv_moves.LlamaKv, checkpoints: CheckpointRules,
                 metrics: WorkerMetrics, on_tier_state: TierState) -> None:
        self._model = model
        self._kv = kv
        self._checkpoints = checkpoints
        self._metrics = metrics
        self._on_tier_state = on_tier_state

    def take_tier_state(self, active: SlotRun) -> None:
        """The run's prefill reached its tier boundary: its slot holds exactly that prefix."""
        tier = active.request.tier
        if tier is None or tier.saved or tier.save_at != active.prompt_done:
            return
        tier.saved = True
        try:
            data, tokens = save_slot(self._model, active.slot)
        except LlamaqError as error:
            log.warning("kv tier: state of %d tokens not taken (%s)", tier.save_at, error)
            return
        self._on_tier_state(tokens, data, tier.salt)

    def take_checkpoint(self, active: SlotRun, end: int) -> None:
        """A context checkpoint before the run's prompt tokens up to `end` are decoded, when
        llama-server would take one (worker/kv/checkpoints.py); none for prompts with media."""
        n_prompt = len(active.request.prompt_tokens)
        if self._checkpoints.wanted(n_prompt, active.prompt_done, end,
                                    active.request.media is not None,
                                    active.request.user_starts, active.slot.checkpoints):
            kv_moves.take_checkpoint(self._kv, active.slot, self._checkpoints,
                                     active.prompt_done, active.task_no)

    def evaluate_media(self, runs: list[SlotRun]) -> list[tuple[SlotRun, Exception]]:
        """The media chunks that come next in a prefilling run's prompt, each in a decode of
        its own (worker/runtime/media.py): the text before them was decoded in an earlier step.
        Returns the runs whose media failed (their slot's cache cleared), with the error."""
        projector = self._model.projector
        failed: list[tuple[SlotRun, Exception]] = []
        for active in runs:
            media = active.request.media
            if media is None or projector is None or not active.prefilling:
                continue
            try:
                for span in media_chunks(projector, self._model.ctx, media, active.prompt_done,
                                         active.slot.slot_id, self._model.plan.n_batch):
                    active.slot.tokens.extend(active.request.prompt_tokens[span.start:span.end])
                    active.prompt_done = span.end
                    self._metrics.n_decode_total += 1
            except Exception as error:  # one request's media must not stop the engine
                kv_moves.clear(self._kv, active.slot)
                failed.append((active, error))
        return failed

    def prompt_end(self, active: SlotRun) -> int:
        """Where this step's prompt tokens of a run may go up to: its next media chunk, and
        the cuts at user messages and before the prompt's last tokens that llama-server makes
        for its checkpoints (with media too, where it takes none right after a chunk but cuts
        all the same)."""
        media, tier = active.request.media, active.request.tier
        n_prompt = len(active.request.prompt_tokens)
        text_end = media.text_end(active.prompt_done) if media is not None else n_prompt
        end = self._checkpoints.chunk_end(n_prompt, active.prompt_done, text_end,
                                          active.request.user_starts, active.slot.checkpoints)
        if tier is not None and tier.save_at is not None and active.prompt_done < tier.save_at:
            end = min(end, tier.save_at)  # its state is taken there (worker/kv/tier.py)
        alora = active.request.alora
        if alora is not None and active.prompt_done < alora.pre_end:
            end = min(end, alora.pre_end)  # the base phase ends there (worker/adapters/alora.py)
        return end


def media_chunks(projector: Projector, ctx: lc.llama_context_p, media: MediaPrompt, pos: int,
                 seq_id: int, n_batch: int) -> Iterator[MediaSpan]:
    """The media chunks of the prompt at index `pos` and right after it into sequence
    `seq_id`, each in a decode of its own (worker/runtime/media.py); each yielded once it is
    in the cache. The text before them was decoded already; the text after them is the
    caller's (the step's batch)."""
    while (span := media.span_at(pos)) is not None:
        projector.evaluate(ctx, span, seq_id, n_batch)
        yield span
        pos = span.end


def mrope(active: SlotRun) -> bool:
    media = active.request.media
    return media is not None and media.mrope


def position(active: SlotRun, index: int) -> int:
    """The model position of the run's token at `index` (prompt or generated): the index,
    less what M-RoPE media chunks before it take in tokens beyond their positions
    (worker/runtime/media.py MediaPrompt.pos_of; llama-server's server_tokens::pos_next)."""
    media = active.request.media
    return index if media is None or not media.spans else media.pos_of(index)
