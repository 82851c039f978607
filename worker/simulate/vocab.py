"""The simulator's vocabulary: words (with their leading space) as tokens, ids from a stable
hash, so that every simulated worker and every run tokenizes a text the same way (prefix
caching and cache-aware routing see the same tokens); and the text the simulated model
writes: a deterministic sequence of words, then EOS.

Owns: tokenizing, pieces and the generator. A Vocab (worker/runtime/vocab.py) to the engine's
parts that read one (token rules, reports), without llama.cpp.
"""

from __future__ import annotations

import re
import zlib

from worker.runtime.vocab import Vocab

N_TOKENS = 65536
BOS, EOS = 1, 2
FIRST_WORD = 3
PIECES = re.compile(r"\s*\S+|\s+")
WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "and", "then", "runs",
         "far", "away", "into", "a", "green", "field", "where", "many", "small", "birds", "sing",
         "every", "morning", "while", "old", "trees", "stand", "tall")
LINE_EVERY = 16
"""Every this many words, the generator writes a new line."""


class SimVocab(Vocab):
    """Shared by the simulated workers of a process: the pieces seen are kept for their text."""

    def __init__(self) -> None:  # no llama.cpp vocabulary behind it
        self.n_tokens = N_TOKENS
        self.bos, self.eos = BOS, EOS
        self.add_bos = True
        self.mask = self.sep = -1
        self.eog_tokens = [EOS]
        self._pieces: dict[int, bytes] = {BOS: b"", EOS: b""}
        self.words = [self.word_token(" " + w) for w in WORDS]
        self.new_line = self.word_token("\n")

    def word_token(self, piece: str) -> int:
        data = piece.encode("utf-8", errors="replace")
        token = FIRST_WORD + zlib.crc32(data) % (N_TOKENS - FIRST_WORD)
        self._pieces.setdefault(token, data)
        return token

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        tokens = [BOS] if add_special else []
        tokens.extend(self.word_token(piece) for piece in PIECES.findall(text))
        return tokens

    def piece(self, token: int, special: bool) -> bytes:
        return self._pieces.get(token, b"")

    def fim_tokens(self) -> dict[str, int]:
        return {}

    def is_eog(self, token: int) -> bool:
        return token == EOS

    def text_of(self, token: int) -> str:
        return self.piece(token, True).decode("utf-8", errors="replace")

    def generated(self, prompt: list[int], index: int, eos_after: int, ignore_eos: bool) -> int:
        """The simulated model's token number `index` (0-based) after `prompt`: the same prompt
        always gets the same text; EOS after `eos_after` tokens unless `ignore_eos`."""
        if index >= eos_after and not ignore_eos:
            return EOS
        if index % LINE_EVERY == LINE_EVERY - 1:
            return self.new_line
        start = zlib.crc32(str(prompt[-8:]).encode()) + len(prompt)
        return self.words[(start + index * 7) % len(self.words)]
