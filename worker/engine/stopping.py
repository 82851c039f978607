"""When a generation ends: llama-server's stop rules as one pure function (as TGI's
StoppingCriteria), and the reasons it gives.

Owns: the order the rules apply in and the mapping of each reason to the wire's `stop_type`.
Does not own: what happens on a stop (the engine finishes the slot run), the context shift
(the engine tries it first when the context is full and --context-shift is on, and asks again),
stop-word matching (worker/engine/textstream.py finds the word; this only hears that it did).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class StopType(StrEnum):
    """The wire's `stop_type` (and the chat `finish_reason` is derived from it)."""

    NONE = "none"
    EOS = "eos"
    LIMIT = "limit"
    WORD = "word"


class StopReason(StrEnum):
    EOS = "eos"
    """An end-of-generation token (not with ignore_eos)."""
    WORD = "word"
    """A stop string was generated."""
    N_PREDICT = "n_predict"
    CONTEXT = "context"
    """The slot's context is full and cannot shift."""
    TIME_LIMIT = "t_max_predict_ms"
    N_INDENT = "n_indent"

    @property
    def stop_type(self) -> StopType:
        if self is StopReason.EOS:
            return StopType.EOS
        if self is StopReason.WORD:
            return StopType.WORD
        return StopType.LIMIT


@dataclass(frozen=True)
class StepState:
    """What the stop rules look at after one generated token."""

    is_eog: bool
    ignore_eos: bool
    stopping_word: bool
    n_generated: int
    n_predict: int
    """-1: no limit."""
    context_full: bool
    """The next token would not fit (after any context shift that could be done)."""
    elapsed_ms: float
    """Since the first generated token."""
    t_max_predict_ms: int
    has_new_line: bool
    under_indented: bool
    """The current line is less indented than n_indent asks (see `indent_cut`)."""


def stop_reason(s: StepState) -> StopReason | None:
    """Why the generation ends after this token, or None when it goes on. llama-server's
    order: EOS, stop word, n_predict, context, time limit (only once a line ended), n_indent."""
    if s.is_eog and not s.ignore_eos:
        return StopReason.EOS
    if s.stopping_word:
        return StopReason.WORD
    if 0 <= s.n_predict <= s.n_generated:
        return StopReason.N_PREDICT
    if s.context_full:
        return StopReason.CONTEXT
    if s.t_max_predict_ms > 0 and s.has_new_line and s.elapsed_ms > s.t_max_predict_ms:
        return StopReason.TIME_LIMIT
    if s.under_indented:
        return StopReason.N_INDENT
    return None


def indent_cut(text: str, line_start: int, n_indent: int) -> tuple[int | None, int]:
    """n_indent (llama-server's rule for code completion): a new line that starts with less
    indentation than `n_indent` ends the completion, cut before its first character.
    Returns (where to cut the text, or None; where the current line starts now)."""
    if n_indent <= 0:
        return None, line_start
    if line_start > 0:
        pos = line_start
        while pos < len(text) and text[pos] in " \t":
            pos += 1
        if pos < len(text) and pos - line_start < n_indent:
            return pos, line_start
    newline = text.find("\n", line_start)
    return None, (newline + 1 if newline != -1 else line_start)
