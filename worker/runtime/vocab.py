"""The model's vocabulary: tokenize, pieces, detokenize.

Safe from any thread by construction: the engine thread and the event loop call it at once, and
ctypes releases the GIL during each llama.cpp call, so no call writes into memory another call
may be using: every call has its own buffers, and the llama_vocab is only read.

Owns: text ↔ tokens, token pieces, the special tokens (FIM, end of generation). Does not
own: the model handle (worker/runtime/model.py)."""

from __future__ import annotations

import ctypes
import functools

import llama_cpp as lc

from scheduler.contract.errors import InvalidRequest
from scheduler.contract.jobs import PromptPiece

PIECE_BUFFER = 64
"""Bytes for one token's piece; a longer piece gets a buffer of its own size."""


class Vocab:
    def __init__(self, vocab: lc.llama_vocab_p) -> None:
        self._vocab = vocab
        self.n_tokens = lc.llama_vocab_n_tokens(vocab)
        self.bos = lc.llama_vocab_bos(vocab)
        self.eos = lc.llama_vocab_eos(vocab)
        self.add_bos = bool(lc.llama_vocab_get_add_bos(vocab))
        self.mask = lc.llama_vocab_mask(vocab)
        self.sep = lc.llama_vocab_sep(vocab)
        """The mask and separator tokens (-1: none), a decision head's markers."""

    @functools.cached_property
    def eog_tokens(self) -> list[int]:
        """Every end-of-generation token (EOS, EOT, …): what ignore_eos bans. Found when first
        asked for, not at load: one llama.cpp call a token (0.1 s of CPU for Gemma 3's 262k),
        which only ignore_eos needs. Any thread may find it: the list is the same."""
        return [t for t in range(self.n_tokens) if lc.llama_vocab_is_eog(self._vocab, t)]

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidRequest("The text holds a lone UTF-16 surrogate, which is not valid "
                                 "Unicode") from None
        capacity = len(data) + 2
        buf = (lc.llama_token * capacity)()
        n = lc.llama_tokenize(self._vocab, data, len(data), buf, capacity, add_special,
                              parse_special)
        if n < 0:
            capacity = -n
            buf = (lc.llama_token * capacity)()
            n = lc.llama_tokenize(self._vocab, data, len(data), buf, capacity, add_special,
                                  parse_special)
        return list(buf[:n])

    def tokenize_prompt(self, prompt: str | list[PromptPiece]) -> list[int]:
        """Strings and token ids, as llama-server mixes them: BOS (when the model wants one)
        only if the prompt starts with a string; special tokens are parsed."""
        pieces = [prompt] if isinstance(prompt, str) else prompt
        tokens: list[int] = []
        for i, piece in enumerate(pieces):
            if isinstance(piece, str):
                tokens.extend(self.tokenize(piece, add_special=i == 0, parse_special=True))
            else:
                tokens.append(piece)
        return tokens

    def single_tokens(self, texts: list[str]) -> frozenset[int]:
        """The ids of those texts that are one token each (special tokens parsed), as
        llama-server resolves `preserved_tokens`."""
        ids = (self.tokenize(text, add_special=False, parse_special=True) for text in texts)
        return frozenset(found[0] for found in ids if len(found) == 1)

    def piece(self, token: int, special: bool) -> bytes:
        """The bytes of one token (its UTF-8 may be incomplete)."""
        buf = ctypes.create_string_buffer(PIECE_BUFFER)  # this call's own: see the docstring
        n = lc.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = lc.llama_token_to_piece(self._vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens: list[int], special: bool = True) -> str:
        # < 0: media (worker/runtime/media.py)
        return b"".join(self.piece(t, special) for t in tokens
                        if t >= 0).decode("utf-8", errors="replace")

    def fim_tokens(self) -> dict[str, int]:
        """The model's fill-in-the-middle tokens that exist (pre, suf, mid, rep, sep)."""
        found = {
            "pre": lc.llama_vocab_fim_pre(self._vocab), "suf": lc.llama_vocab_fim_suf(self._vocab),
            "mid": lc.llama_vocab_fim_mid(self._vocab), "rep": lc.llama_vocab_fim_rep(self._vocab),
            "sep": lc.llama_vocab_fim_sep(self._vocab),
        }
        return {name: token for name, token in found.items() if token >= 0}

    def is_eog(self, token: int) -> bool:
        return bool(lc.llama_vocab_is_eog(self._vocab, token))

    def valid(self, token: int) -> bool:
        return 0 <= token < self.n_tokens

    def text_of(self, token: int) -> str:
        text = lc.llama_vocab_get_text(self._vocab, token)
        return text.decode("utf-8", errors="replace") if text else ""
