"""Context checkpoints: the part of a slot's KV that cannot be rolled back (the sliding-window
cells of an SWA model, the state of a recurrent or hybrid one), saved at a few points of a
prompt so that a later prompt that shares a prefix can go back to it (llama-server's
`-ctxcp/--ctx-checkpoints`, `-cms/--checkpoint-min-step`).

Owns: a checkpoint (its bytes and the positions it covers), the per-slot rules of
llama-server's server-context.cpp: where the prefill is cut for one (at the start of the last
user message, of a user message `min_step` past the slot's last checkpoint or of any when the
slot has none, and `4 + n_ubatch` and `4` tokens before the prompt's end), when one is taken
(before a chunk that starts such a user message or ends near the prompt's end; none right
after media), which ones are dropped to make room, and which one a new prompt restores
(`pos_min < pos_next - n_swa`, else the prompt is processed again). Pure: the llama.cpp
calls are in worker/kv/moves.py.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Checkpoint:
    """The partial state of a slot's sequence before its token `n_tokens` was decoded."""

    n_tokens: int
    pos_min: int
    pos_max: int
    data: bytes
    task: int = -1
    """The run that took it (llama-server's id_task): kept when the list makes room."""

    @property
    def size(self) -> int:
        return len(self.data)


@dataclass(frozen=True)
class CheckpointRules:
    """How a model's slots take and restore checkpoints."""

    n_max: int = 32
    """-ctxcp: at most this many per slot (0: none)."""
    min_step: int = 8192
    """-cms: the least spacing between two, in tokens (0: none)."""
    n_swa: int = 0
    """The model's sliding window (0: none, or --swa-full)."""
    rollback_only_full: bool = False
    """The memory cannot remove a part of a sequence (recurrent or hybrid models)."""
    n_batch: int = 2048
    n_ubatch: int = 512

    @property
    def needed(self) -> bool:
        """Whether a reused prefix can need a checkpoint at all (llama-server's rule: an SWA
        model without --swa-full, or a memory that cannot be partly removed)."""
        return self.n_swa > 0 or self.rollback_only_full

    @property
    def enabled(self) -> bool:
        return self.needed and self.n_max > 0

    def chunk_end(self, n_prompt: int, done: int, end: int, user_starts: tuple[int, ...] = (),
                  checkpoints: list[Checkpoint] | None = None) -> int:
        """Where a prefill chunk that starts at `done` and would go to `end` stops: at a user
        message's start that may take a checkpoint (`user_starts`, with the slot's
        `checkpoints`), and so that the last `4 + n_ubatch` and the last `4` tokens of the
        prompt start chunks of their own (a checkpoint is taken before each)."""
        if not self.enabled:
            return end
        for pos in user_starts:
            if pos >= end:
                break
            if pos > done and self._user_cut(pos, user_starts, checkpoints or []):
                end = pos
                break
        for offset in (4 + self.n_ubatch, 4):
            cut = n_prompt - min(self.n_batch, offset)
            if done < cut < end:
                return cut
        return end

    def wanted(self, n_prompt: int, start: int, end: int, after_media: bool,
               user_starts: tuple[int, ...] = (),
               checkpoints: list[Checkpoint] | None = None) -> bool:
        """Take one before decoding prompt tokens [start, end) of a prompt of `n_prompt`
        (llama-server's do_checkpoint): when the chunk ends within n_ubatch of the prompt's
        end, or starts a user message that may take one; never right after media, never with
        nothing cached yet."""
        if not self.enabled or start <= 0 or after_media:
            return False
        if n_prompt < end + self.n_ubatch:
            return True
        return start in user_starts and self._user_cut(start, user_starts, checkpoints or [])

    def _user_cut(self, pos: int, user_starts: tuple[int, ...],
                  checkpoints: list[Checkpoint]) -> bool:
        """Whether the user message at `pos` gets a cut and a checkpoint: the last one
        always, another when the slot has none or its last is `min_step` before it."""
        return (pos == user_starts[-1] or not checkpoints
                or pos > checkpoints[-1].n_tokens + self.min_step)

    def add(self, checkpoints: list[Checkpoint], new: Checkpoint) -> None:
        """Append `new`, first making room as create_checkpoint does: when the list is full,
        those within min_step of an earlier one (taken by another run), then the oldest; one
        at the same n_tokens is replaced."""
        if len(checkpoints) + 1 >= self.n_max:
            last = -1
            kept: list[Checkpoint] = []
            for cp in checkpoints:
                if cp.task != new.task and last >= 0 and cp.n_tokens <= last + self.min_step:
                    continue
                last = cp.n_tokens
                kept.append(cp)
            checkpoints[:] = kept
        while checkpoints and len(checkpoints) >= self.n_max:
            del checkpoints[0]
        checkpoints[:] = [cp for cp in checkpoints if cp.n_tokens != new.n_tokens]
        checkpoints.append(new)

    def restore_point(self, checkpoints: list[Checkpoint], n_past: int,
                      pos_min: int) -> tuple[int, Checkpoint | None]:
        """With `n_past` prompt tokens cached and the sequence's smallest position `pos_min`:
        how many tokens can be kept, and the checkpoint to restore first (None: the cache as
        it is). 0 when neither the cache nor a checkpoint holds what the next token attends
        to: the prompt is processed again. The caller then drops every checkpoint past what
        is kept (`invalidated`)."""
        if not self.needed or n_past <= 0:
            return n_past, None
        threshold = max(0, n_past - self.n_swa)  # there are always new tokens to decode
        if pos_min < threshold or (self.n_swa > 0 and pos_min == 0):
            # (ours: an SWA sequence that still holds position 0 lost nothing yet, where
            # llama-server restores a checkpoint anyway when the prompt is shorter than the
            # window, and so decodes a few tokens more)
            return n_past, None
        for cp in reversed(checkpoints):
            if cp.pos_max > n_past:
                continue
            if cp.pos_min < threshold or cp.pos_min == 0:
                pos_next = min(n_past, max(cp.pos_min + 1, cp.pos_max))
                return min(pos_next, cp.n_tokens), cp
        return 0, None

    @staticmethod
    def invalidated(checkpoints: list[Checkpoint], pos_next: int) -> None:
        """Drop the checkpoints that cover positions past `pos_next`."""
        checkpoints[:] = [cp for cp in checkpoints if cp.pos_max <= pos_next]
