"""The FIM prompt layout, checked with a vocabulary whose tokens are easy to read."""

from __future__ import annotations

import pytest

from scheduler.contract.errors import NotSupported
from scheduler.contract.jobs import ExtraContext, InfillParts
from worker.engine.infill import infill_tokens


class LetterVocab:
    """Each character is a token (its code point); FIM tokens are negative-free large ids."""

    add_bos = True
    bos = 1

    def __init__(self, fim: dict[str, int]) -> None:
        self._fim = fim

    def fim_tokens(self) -> dict[str, int]:
        return self._fim

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        return [ord(c) for c in text]


FIM = {"pre": 1001, "suf": 1002, "mid": 1003}


def letters(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_prefix_suffix_middle() -> None:
    parts = InfillParts(input_prefix="def f(", input_suffix="):")
    tokens = infill_tokens(LetterVocab(FIM), parts, letters("x"), 512, 16, 4096, spm=False)
    assert tokens == [1, 1001, *letters("def f("), *letters("x"), 1002, *letters("):"), 1003]


def test_spm_order_puts_the_suffix_first() -> None:
    parts = InfillParts(input_prefix="a", input_suffix="b")
    tokens = infill_tokens(LetterVocab(FIM), parts, [], 512, 16, 4096, spm=True)
    assert tokens == [1, 1002, ord("b"), 1001, ord("a"), 1003]


def test_repo_level_pattern_with_extra_files() -> None:
    fim = {**FIM, "rep": 1004, "sep": 1005}
    parts = InfillParts(input_prefix="p", input_suffix="s",
                        input_extra=[ExtraContext(text="X", filename="a.py")])
    tokens = infill_tokens(LetterVocab(fim), parts, [], 512, 16, 4096, spm=False)
    extra = [1004, *letters("myproject\n"), 1005, *letters("a.py\n"), ord("X"),
             1005, *letters("filename\n")]
    assert tokens == [*extra, 1, 1001, ord("p"), 1002, ord("s"), 1003]


def test_long_prefix_keeps_its_end() -> None:
    parts = InfillParts(input_prefix="0123456789" * 10, input_suffix="")
    tokens = infill_tokens(LetterVocab(FIM), parts, [], 16, 16, 4096, spm=False)
    assert tokens[:2] == [1, 1001]
    assert tokens[2:14] == letters(("0123456789" * 10)[-12:])  # 3/4 of the batch


def test_a_model_without_fim_tokens_is_not_supported() -> None:
    parts = InfillParts(input_prefix="a", input_suffix="b")
    with pytest.raises(NotSupported, match="Infill is not supported by this model"):
        infill_tokens(LetterVocab({}), parts, [], 512, 16, 4096, spm=False)
