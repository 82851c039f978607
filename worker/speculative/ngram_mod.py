"""ngram-mod: a hash table from the last `n_match` tokens to the token that followed them,
shared by every slot of the worker (llama.cpp's common_ngram_mod and
common_speculative_impl_ngram_mod, ported).

Owns: the table (4 Mi entries, keyed by a 64-bit multiplicative hash of the n-gram modulo the
size, as llama.cpp computes it), filling it from a sequence's tokens, a draft (follow the table
from the last n-gram for up to n_max tokens; none when it stops before n_min), and the resets
(occupancy over a quarter after a prompt; five drafts in a row under a quarter accepted).
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.speculative.config import NgramModParams

EMPTY = -1
TABLE_SIZE = 4 * 1024 * 1024
MULTIPLIER = 6364136223846793005
MASK64 = (1 << 64) - 1
CHUNK = 32
"""A sequence's new n-grams go into the table once this many have come (draft_one)."""
OCCUPANCY_RESET = 0.25
LOW_ACCEPTANCE = 0.25
LOW_STREAK_RESET = 5


class NgramTable:
    """common_ngram_mod: n-gram → next token, last writer wins."""

    def __init__(self, n: int, size: int = TABLE_SIZE) -> None:
        import numpy as np

        self.n = n
        self.entries = np.full(size, EMPTY, dtype=np.int32)
        self.used = 0

    def reset(self) -> None:
        self.entries.fill(EMPTY)
        self.used = 0

    def index(self, key: list[int]) -> int:
        res = 0
        for token in key:
            res = (res * MULTIPLIER + (token & MASK64)) & MASK64
        return res % len(self.entries)

    def get(self, key: list[int]) -> int:
        return int(self.entries[self.index(key)])

    def add_all(self, tokens: list[int], start: int, stop: int) -> None:
        """add() for every n-gram starting at start..stop-1 (each followed by its next token),
        in order: numpy's uint64 arithmetic wraps as C's size_t does."""
        if stop <= start:
            return
        import numpy as np

        arr = np.asarray(tokens[start:stop + self.n], dtype=np.int64).astype(np.uint64)
        count = stop - start
        res = np.zeros(count, dtype=np.uint64)
        mult = np.uint64(MULTIPLIER)
        with np.errstate(over="ignore"):
            for i in range(self.n):
                res = res * mult + arr[i:i + count]
        idx = (res % np.uint64(len(self.entries))).astype(np.int64)
        values = arr[self.n:self.n + count].astype(np.int32)
        # the last write of an index wins, as in the C++ loop
        rev_idx = idx[::-1]
        unique, first = np.unique(rev_idx, return_index=True)
        last_values = values[::-1][first]
        self.used += int(np.count_nonzero(self.entries[unique] == EMPTY))
        self.entries[unique] = last_values

    @property
    def occupancy(self) -> float:
        return self.used / len(self.entries)


@dataclass
class _SeqInfo:
    i_last: int = 0
    n_draft_last: int = 0
    n_low: int = 0


class NgramMod:
    """common_speculative_impl_ngram_mod: one table for all sequences, a state per sequence."""

    name = "ngram-mod"

    def __init__(self, params: NgramModParams, n_seq: int, size: int = TABLE_SIZE) -> None:
        self.params = params
        self.n_max = params.n_max
        self.table = NgramTable(params.n_match, size)
        self._seqs = [_SeqInfo() for _ in range(n_seq)]

    def begin(self, seq: int, prompt: list[int]) -> None:
        info = self._seqs[seq]
        info.i_last = info.n_draft_last = 0
        n = self.table.n
        if len(prompt) < n:
            return
        self.table.add_all(prompt, 0, len(prompt) - n)
        info.i_last = len(prompt) - n
        if self.table.occupancy > OCCUPANCY_RESET:
            self.table.reset()

    def draft(self, seq: int, prompt: list[int], id_last: int) -> list[int]:
        info = self._seqs[seq]
        info.n_draft_last = 0
        n = self.table.n
        cur_len = len(prompt)
        if cur_len < n:
            return []
        if info.i_last + CHUNK < cur_len:
            self.table.add_all(prompt, info.i_last, cur_len - n)
            info.i_last = cur_len - n
        window = [*prompt[cur_len - n + 1:], id_last] if n > 1 else [id_last]
        drafted: list[int] = []
        for i in range(self.params.n_max):
            token = self.table.get(window[i:i + n])
            if token == EMPTY:
                if i < self.params.n_min:
                    return []
                break
            window.append(token)
            drafted.append(token)
        info.n_draft_last = len(drafted)
        return drafted

    def accept(self, seq: int, n_accepted: int, is_other: bool) -> None:
        if is_other:
            return
        info = self._seqs[seq]
        if info.n_draft_last <= 0:
            return
        if n_accepted / info.n_draft_last < LOW_ACCEPTANCE:
            info.n_low += 1
            if info.n_low >= LOW_STREAK_RESET:
                self.table.reset()
                info.n_low = 0
                info.i_last = 0
        else:
            info.n_low = 0
