"""ngram-simple: the last `size_n` tokens (the sampled one last) looked up backwards in the
sequence's own tokens; the `size_m` tokens after the nearest earlier match are the draft
(llama.cpp's common_ngram_simple_draft and common_speculative_impl_ngram_simple, ported;
--spec-ngram-simple-min-hits is read by llama.cpp but this mode does not use it)."""

from __future__ import annotations

from worker.speculative.config import NgramMapParams


def simple_draft(size_n: int, size_m: int, tokens: list[int], sampled: int) -> list[int]:
    """common_ngram_simple_draft: position 0 never matches; a match must leave at least
    `size_n` tokens after it to copy."""
    cur_len = len(tokens)
    if cur_len <= size_n + size_m + 1:
        return []
    pattern = [*tokens[cur_len - size_n + 1:], sampled]
    match_pos = 0
    for j in range(cur_len - size_n - 1, 0, -1):
        if tokens[j] == pattern[0] and tokens[j:j + len(pattern)] == pattern:
            match_pos = j
            break
    if match_pos == 0:
        return []
    copy_max = min(size_m, cur_len - (match_pos + size_n))
    if copy_max < size_n:
        return []
    start = match_pos + size_n
    return tokens[start:start + copy_max]


class NgramSimple:
    """The mode's drafter: stateless, one configuration for every sequence."""

    name = "ngram-simple"

    def __init__(self, params: NgramMapParams) -> None:
        self.params = params
        self.n_max = params.size_m

    def begin(self, seq: int, prompt: list[int]) -> None:
        pass

    def draft(self, seq: int, prompt: list[int], id_last: int) -> list[int]:
        return simple_draft(self.params.size_n, self.params.size_m, prompt, id_last)

    def accept(self, seq: int, n_accepted: int, is_other: bool) -> None:
        pass
