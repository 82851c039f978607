"""The llama_batch of one decode step, views of part of it (a step retried in smaller parts
when the KV cache has no room), and llama-server's words for a failed decode."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import llama_cpp as lc


class StepBatch:
    """One llama_batch of up to `n_batch` tokens, one sequence per token (owns its memory).

    Its fields are written through ctypes arrays over the batch's own memory, a span of tokens
    in one slice assignment each. The sequence ids lie in one array of this object's (every
    token's seq_id pointer points into it), so that a span's take one assignment too;
    llama_batch_init's own arrays are pointed back to before llama_batch_free."""

    def __init__(self, n_batch: int) -> None:
        self.raw = raw = lc.llama_batch_init(n_batch, 0, 1)
        self._token = _array(raw.token, ctypes.c_int32, n_batch)
        self._pos = _array(raw.pos, ctypes.c_int32, n_batch)
        self._n_seq_id = _array(raw.n_seq_id, ctypes.c_int32, n_batch)
        self._logits = _array(raw.logits, ctypes.c_int8, n_batch)
        self._seq_ids = _array(raw.seq_id, ctypes.c_void_p, n_batch)
        self._allocated = list(self._seq_ids)
        """llama_batch_init's seq_id arrays, for llama_batch_free."""
        self._seq = (ctypes.c_int32 * n_batch)()
        base = ctypes.addressof(self._seq)
        self._seq_ids[:] = [base + i * ctypes.sizeof(ctypes.c_int32) for i in range(n_batch)]
        self._n_seq_id[:] = [1] * n_batch
        self._ones = [1] * n_batch
        self._zeros = [0] * n_batch

    def free(self) -> None:
        self._seq_ids[:] = self._allocated
        lc.llama_batch_free(self.raw)

    def put(self, n: int, token: int, pos: int, seq: int, logits: bool) -> None:
        """Token `n` of the step."""
        self._token[n] = token
        self._pos[n] = pos
        self._n_seq_id[n] = 1
        self._seq[n] = seq
        self._logits[n] = logits

    def put_span(self, n: int, tokens: Sequence[int], pos: int, seq: int, every: bool,
                 last: bool) -> int:
        """`tokens` from token `n` of the step on, at positions `pos`, `pos` + 1, ... of
        sequence `seq`; an output for `every` token, or for the `last` one only. Returns the
        index after them."""
        k = len(tokens)
        end = n + k
        self._token[n:end] = tokens
        self._pos[n:end] = range(pos, pos + k)
        self._n_seq_id[n:end] = self._ones[:k]
        self._seq[n:end] = [seq] * k
        self._logits[n:end] = self._ones[:k] if every else self._zeros[:k]
        if last and k and not every:
            self._logits[end - 1] = 1
        return end

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


def _array(pointer: Any, item: type[Any], size: int) -> Any:
    """The `size` items at a ctypes pointer, as a ctypes array over that memory."""
    address = ctypes.cast(pointer, ctypes.c_void_p).value
    return (item * size).from_address(address or 0)
