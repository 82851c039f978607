"""The llama_batch of one decode step, views of part of it (a step retried in smaller parts
when the KV cache has no room), and llama-server's words for a failed decode."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import llama_cpp as lc


class StepBatch:
    """One llama_batch of up to `n_batch` tokens, one sequence per token (owns its memory)."""

    def __init__(self, n_batch: int) -> None:
        self.raw = lc.llama_batch_init(n_batch, 0, 1)

    def free(self) -> None:
        lc.llama_batch_free(self.raw)

    def put(self, n: int, token: int, pos: int, seq: int, logits: bool) -> None:
        """Token `n` of the step."""
        batch = self.raw
        batch.token[n] = token
        batch.pos[n] = pos
        batch.n_seq_id[n] = 1
        batch.seq_id[n][0] = seq
        batch.logits[n] = logits

    def put_span(self, n: int, tokens: Sequence[int], pos: int, seq: int, every: bool,
                 last: bool) -> int:
        """`tokens` from token `n` of the step on, at positions `pos`, `pos` + 1, ... of
        sequence `seq`; an output for `every` token, or for the `last` one only. Returns the
        index after them."""
        for i, token in enumerate(tokens):
            self.put(n + i, token, pos + i, seq, every)
        if last and tokens and not every:
            self.raw.logits[n + len(tokens) - 1] = True
        return n + len(tokens)

    def view(self, off: int, size: int) -> lc.llama_batch:
        """Tokens [off, off + size) of the step's batch, as a batch of their own."""
        batch = self.raw
        if off == 0:
            batch.n_tokens = size
            return batch
        return lc.llama_batch(
            n_tokens=size, token=_at(batch.token, off, ctypes.c_int32), embd=batch.embd,
            pos=_at(batch.pos, off, ctypes.c_int32),
            n_seq_id=_at(batch.n_seq_id, off, ctypes.c_int32),
            seq_id=_at(batch.seq_id, off, ctypes.c_void_p),
            logits=_at(batch.logits, off, ctypes.c_int8))


def decode_error_message(rc: int) -> str:
    """llama-server's words for a failed llama_decode."""
    if rc == 1:
        return "Context size has been exceeded."
    if rc == -1:
        return "Invalid input batch."
    if rc < -1:
        return "Compute error."
    return f"llama_decode failed with status {rc}"


def _at(pointer: Any, off: int, item: type[Any]) -> Any:
    """`pointer + off` for a ctypes pointer to items of type `item`."""
    address = ctypes.cast(pointer, ctypes.c_void_p).value
    return ctypes.cast((address or 0) + off * ctypes.sizeof(item), type(pointer))
