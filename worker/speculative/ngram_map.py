"""ngram-map-k and ngram-map-k4v: per sequence, the key n-grams seen again in its history and
the m-grams that followed them (llama.cpp's common_ngram_map and
common_speculative_impl_ngram_map_k, ported line by line, quirks included).

Owns: a sequence's map (a 2^18-entry hash from n-gram to its last position, the keys with their
hit counts and up to four values with their counts and last acceptance), its clean-up when a
new prompt is shorter than the history checked so far, a draft (ngram-map-k: the m tokens after
the key's match, as many as were accepted last time; ngram-map-k4v: only once the key was hit
min_hits times and its most frequent value is at least twice as frequent as the others
together), and the acceptance update.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from worker.speculative.config import NgramMapParams

MAX_VALUES = 4
HASH_MAP_SIZE = 262144
MAX_VALUE_COUNT = 16380
LCG_FACTOR = 2654435761
MASK32 = (1 << 32) - 1


def ngram_hash(tokens: list[int], start: int, length: int) -> int:
    """common_ngram_map_hash: a 32-bit LCG hash of tokens[start:start + length]."""
    value = 0
    for i in range(start, start + length):
        value = (value * LCG_FACTOR + tokens[i]) & MASK32
    return value


@dataclass
class _Value:
    value_idx: int = 0
    value_num: int = 0
    n_accepted: int = -1


@dataclass
class _Key:
    key_idx: int
    stat_idx: int = 0
    key_num: int = 0
    values: list[_Value] = field(default_factory=list)


def _same(tokens: list[int], start: int, other: list[int], other_start: int, n: int) -> bool:
    """tokens[start:start+n] == other[other_start:other_start+n]; indices past the end (a key
    of an earlier, longer history) do not match."""
    if start + n > len(tokens) or other_start + n > len(other):
        return False
    return tokens[start:start + n] == other[other_start:other_start + n]


class NgramMap:
    """One sequence's common_ngram_map."""

    def __init__(self, size_key: int, size_value: int, key_only: bool, min_hits: int) -> None:
        self.n, self.m = size_key, size_value
        self.key_only = key_only
        self.min_hits = min_hits
        self.keys: list[_Key] = []
        self.key_map = [0] * HASH_MAP_SIZE
        self.key_map_last_idx = 0
        self.size_last_begin = 0
        self.idx_last_check = 0
        self.last_draft_created = False
        self.last_draft_key_idx = 0
        self.last_draft_value_idx = 0

    def begin(self, tokens: list[int]) -> None:
        size_begin = len(tokens)
        cleanup = self.size_last_begin
        if cleanup > size_begin:
            cleanup = size_begin - self.n - self.m if size_begin > self.n + self.m else 0
        if size_begin < self.idx_last_check:
            for i, key_idx in enumerate(self.key_map):
                if key_idx != 0 and key_idx >= cleanup:
                    self.key_map[i] = 0
            self.key_map_last_idx = cleanup - 1 if cleanup > 0 else 0
        if size_begin < self.idx_last_check and self.keys:
            for i in range(len(self.keys) - 1, -1, -1):
                key = self.keys[i]
                if key.key_idx >= cleanup:
                    del self.keys[i]
                    continue
                if self.key_only:
                    continue
                for j in range(MAX_VALUES - 1, -1, -1):
                    value = key.values[j]
                    if value.value_idx != 0 and value.value_idx >= cleanup:
                        for k in range(j, MAX_VALUES - 1):
                            key.values[k] = key.values[k + 1]
                        last = key.values[MAX_VALUES - 1]
                        # the C++ clears the last slot's idx and num in place (that slot's
                        # struct may be shared with the one just moved left: copy first)
                        key.values[MAX_VALUES - 1] = _Value(0, 0, last.n_accepted)
                if key.values[0].value_idx == 0:
                    del self.keys[i]
        self.idx_last_check = size_begin
        self.size_last_begin = size_begin

    def _search(self, inp: list[int], key_tokens: list[int], high: int, low: int) -> int:
        for j in range(high, low, -1):
            if inp[j] == key_tokens[0] and _same(inp, j, key_tokens, 0, self.n):
                return j
        return 0

    def draft(self, inp: list[int], sampled: int) -> list[int]:
        self.last_draft_created = False
        self.last_draft_key_idx = self.last_draft_value_idx = 0
        cur_len, n, m = len(inp), self.n, self.m
        if cur_len < 2 * n + m:
            return []
        self.idx_last_check = cur_len
        key_tokens = [*inp[cur_len - n + 1:], sampled]
        match_pos = 0
        idx_key = self.key_map[ngram_hash(key_tokens, 0, n) % HASH_MAP_SIZE]
        if idx_key != 0 and idx_key < cur_len - n - m - 1 and _same(inp, idx_key, key_tokens, 0, n):
            match_pos = idx_key
        begin = self.size_last_begin
        if match_pos == 0 and begin > n + m + 1:
            match_pos = self._search(inp, key_tokens, begin - n - m - 1, self.key_map_last_idx)
        if match_pos == 0:
            match_pos = self._search(inp, key_tokens, cur_len - n - m - 1,
                                     max(begin, self.key_map_last_idx))
        if begin > n + m + 1:
            for j in range(begin - n - m - 1, self.key_map_last_idx, -1):
                slot = ngram_hash(inp, j, n) % HASH_MAP_SIZE
                if self.key_map[slot] == 0:
                    self.key_map[slot] = j
        for j in range(cur_len - n - m - 1, max(begin, self.key_map_last_idx), -1):
            slot = ngram_hash(inp, j, n) % HASH_MAP_SIZE
            if self.key_map[slot] == 0:
                self.key_map[slot] = j
        self.key_map_last_idx = max(cur_len - n - m - 1, self.key_map_last_idx)
        if match_pos == 0:
            return []
        offset = next((i for i, key in enumerate(self.keys)
                       if _same(inp, key.key_idx, key_tokens, 0, n)), len(self.keys))
        if offset == len(self.keys):
            self.keys.append(_Key(key_idx=match_pos,
                                  values=[_Value(0, 0, m) for _ in range(MAX_VALUES)]))
        key = self.keys[offset]
        key.key_num = min(key.key_num + 1, MAX_VALUE_COUNT)
        if self.key_only:
            n_draft = min(m, key.values[0].n_accepted)
            self.last_draft_created = True
            self.last_draft_key_idx, self.last_draft_value_idx = offset, 0
            return inp[match_pos + n:match_pos + n + max(0, n_draft)]
        if key.key_num < self.min_hits:
            return []
        for i in range(key.stat_idx, match_pos + 1):
            if not _same(inp, i, key_tokens, 0, n):
                continue
            begin_value = i + n
            found = -1
            for v in range(MAX_VALUES):
                value = key.values[v]
                if value.value_idx == 0:
                    key.values[v] = _Value(begin_value, 0, m)
                    found = v
                    break
                if _same(inp, begin_value, inp, value.value_idx, m):
                    found = v
                    break
            if found >= 0:
                key.values[found].value_num = min(key.values[found].value_num + 1,
                                                  MAX_VALUE_COUNT)
        key.stat_idx = match_pos
        max_occur, slot_max = 0, 0
        for v in range(MAX_VALUES):
            if key.values[v].value_num > max_occur:
                max_occur, slot_max = key.values[v].value_num, v
        sum_occur = sum(key.values[v].value_num for v in range(MAX_VALUES) if v != slot_max)
        if sum_occur > 0 and max_occur < 2 * sum_occur:
            return []
        n_draft = min(m, key.values[slot_max].n_accepted)
        self.last_draft_created = True
        self.last_draft_key_idx, self.last_draft_value_idx = offset, slot_max
        return inp[match_pos + n:match_pos + n + max(0, n_draft)]

    def accept(self, n_accepted: int) -> None:
        if not self.last_draft_created:
            return
        key = self.keys[self.last_draft_key_idx]
        key.values[self.last_draft_value_idx].n_accepted = n_accepted


class NgramMapK:
    """common_speculative_impl_ngram_map_k: one map per sequence (ngram-map-k: keys only;
    ngram-map-k4v: keys and their values)."""

    def __init__(self, params: NgramMapParams, key_only: bool, n_seq: int) -> None:
        self.name = "ngram-map-k" if key_only else "ngram-map-k4v"
        self.n_max = params.size_m
        self.maps = [NgramMap(params.size_n, params.size_m, key_only, params.min_hits)
                     for _ in range(n_seq)]

    def begin(self, seq: int, prompt: list[int]) -> None:
        self.maps[seq].begin(prompt)

    def draft(self, seq: int, prompt: list[int], id_last: int) -> list[int]:
        return self.maps[seq].draft(prompt, id_last)

    def accept(self, seq: int, n_accepted: int, is_other: bool) -> None:
        if not is_other:
            self.maps[seq].accept(n_accepted)
