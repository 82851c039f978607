"""The prompts of the decision-head families (laya, clef, lfm2-d1-omni), built as llama.cpp's
server builds them (tools/server/server-decision.cpp: fill_task_laya, fill_task_d1omni,
fill_task_joint) from the model's `tokenizer.chat_template.systemone`, so that their rules are
applied to the prompt the model would read: laya's question and options cut to its
`max_head_tokens`, lfm2-d1-omni's pieces cut to their budgets and the whole to 16384 tokens,
clef's questions all in one prompt. What comes out is each prompt's length, checked against
--ubatch-size by worker/decisions/plan.py; the head itself is not run (the llama.cpp bundled
with llama-cpp-python has none), so a valid request ends in a 501 there.

The template gets raw JSON values (it serializes what is not a string):
- laya: `id`, `type`, `instructions`, `state`, `options` (`key`, `description`), `images`; the
  text of the mask token is blanked out of the input, and the prompt must read
  [cls] question [sep] ([mask] option)* [sep] state [sep];
- lfm2-d1-omni: the same with special tokens escaped (`<|x|>` → `<¦x¦>`, keys too), `audio`,
  `sep`, `mark_state`, `mark_question`, `mark_option`: pieces joined by `sep`, each starting
  with its mark;
- clef: `state`, `questions` (`id`, `type`, `instructions`, `options`; every object's keys
  sorted, choice options by key, noul as (true, false)), `images`, `sep`, `mark_question`,
  `mark_option`.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

from scheduler.contract.errors import InvalidRequest, NotSupported
from scheduler.contract.jobs import SystemOneInput, SystemOneQuestion
from scheduler.decision_meta import DecisionCaps, DecisionMetaError
from worker.decisions.systemone_prompt import Tokenizer, render, systemone_template

LAYA_MAX_OPTION_TOKENS = 48
D1OMNI_MARKER = "<<d1omni:"
D1OMNI_SEP = "<<d1omni:sep>>"
D1OMNI_MARK_STATE = "<<d1omni:state>>"
D1OMNI_MARK_QUESTION = "<<d1omni:question>>"
D1OMNI_MARK_OPTION = "<<d1omni:option>>"
D1OMNI_MAX_TOKENS = 16384
CLEF_MARKER = "<<clef:"
CLEF_SEP = "<<clef:sep>>"
CLEF_MARK_QUESTION = "<<clef:question>>"
CLEF_MARK_OPTION = "<<clef:option>>"
SPECIAL = re.compile(r"<\|([A-Za-z0-9_]+)\|>")


class HeadVocab(Protocol):
    mask: int
    sep: int

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]: ...

    def text_of(self, token: int) -> str: ...


def replace_text(value: Any, search: str, replacement: str) -> Any:
    """`search` replaced in every string of a JSON value (not in keys)."""
    if isinstance(value, str):
        return value.replace(search, replacement)
    if isinstance(value, list):
        return [replace_text(item, search, replacement) for item in value]
    if isinstance(value, dict):
        return {key: replace_text(item, search, replacement) for key, item in value.items()}
    return value


def sort_keys(value: Any) -> Any:
    if isinstance(value, list):
        return [sort_keys(item) for item in value]
    if isinstance(value, dict):
        return {key: sort_keys(value[key]) for key in sorted(value)}
    return value


def escape_special(value: Any) -> Any:
    """Special tokens written in the input are not parsed as such: `<|x|>` → `<¦x¦>`, in
    keys too."""
    if isinstance(value, str):
        return SPECIAL.sub("<\u00a6\\1\u00a6>", value)
    if isinstance(value, list):
        return [escape_special(item) for item in value]
    if isinstance(value, dict):
        return {escape_special(key): escape_special(item) for key, item in value.items()}
    return value


def _layout(family: str) -> NotSupported:
    return NotSupported(f"the {family} model's systemone template does not give the prompt "
                        "layout its decision head reads (unexpected layout of the decision "
                        "prompt)")


def _options(question: SystemOneQuestion, true_first: bool, by_key: bool) -> list[dict[str, Any]]:
    options = [option.model_dump() for option in question.options]
    if question.type == "choice" and by_key:
        options.sort(key=lambda option: option["key"])
    if question.type == "noul" and true_first:
        options.reverse()
    return options


class HeadPrompter:
    """One worker's: a decision-head family's template and marker tokens (a missing mask or
    separator token stops the worker, as in llama.cpp)."""

    def __init__(self, caps: DecisionCaps, vocab: HeadVocab) -> None:
        assert caps.family is not None
        self.family = caps.family.name
        self.template = systemone_template(caps)
        self.head_tokens = caps.head_tokens or 0
        self.mask, self.sep = vocab.mask, vocab.sep
        if self.family == "laya" and (self.mask < 0 or self.sep < 0):
            raise DecisionMetaError("decision model has no mask or sep token")
        if self.family == "lfm2-d1-omni" and self.mask < 0:
            raise DecisionMetaError("decision model has no mask token")
        self.text_marker = vocab.text_of(self.mask) if self.family == "laya" else ""

    def prompt_lengths(self, systemone: SystemOneInput, vocab: Tokenizer) -> list[int]:
        """The tokens of each prompt the model would read: one per question, or one for the
        whole request (clef)."""
        if self.family == "clef":
            return [self._joint(systemone, vocab)]
        if self.family == "laya":
            return [self._laya(systemone.state, q, vocab) for q in systemone.questions]
        return [self._d1omni(systemone.state, q, vocab) for q in systemone.questions]

    def _inputs(self, state: Any, question: SystemOneQuestion) -> dict[str, Any]:
        return {"id": question.id, "type": question.type, "instructions": question.instructions,
                "state": state, "options": _options(question, False, False)}

    def _laya(self, state: Any, question: SystemOneQuestion, vocab: Tokenizer) -> int:
        inputs = replace_text(self._inputs(state, question), self.text_marker, " ")
        tokens = vocab.tokenize(render(self.template, **inputs, images=[]), False, True)
        n_options = len(question.options)
        markers = [i for i, token in enumerate(tokens) if token == self.mask]
        if len(markers) != n_options or markers[0] < 2 or tokens[markers[0] - 1] != self.sep \
                or tokens[-1] != self.sep:
            raise _layout(self.family)
        head_end = markers[0] - 1
        opts_end = next((i for i in range(markers[-1], len(tokens)) if tokens[i] == self.sep),
                        len(tokens))
        if opts_end + 1 >= len(tokens):
            raise _layout(self.family)
        bounds = [*markers[1:], opts_end]
        sizes = [end - start for start, end in zip(markers, bounds, strict=True)]
        sizes = [min(size, LAYA_MAX_OPTION_TOKENS + 1) for size in sizes]
        if sum(sizes) + 16 > self.head_tokens:  # too many or too long options: even shares
            share = max(4, (self.head_tokens - min(self.head_tokens, 16)) // n_options)
            sizes = [min(size, share) for size in sizes]
        n_question_max = max(8, self.head_tokens - min(self.head_tokens, sum(sizes)))
        n_question = min(head_end, 1 + n_question_max) - 1
        return 1 + max(n_question, 0) + 1 + sum(sizes) + (len(tokens) - opts_end)

    def _d1omni(self, state: Any, question: SystemOneQuestion, vocab: Tokenizer) -> int:
        inputs = replace_text(escape_special(self._inputs(state, question)), D1OMNI_MARKER,
                              "<<d1omni ")
        prompt = render(self.template, **inputs, images=[], audio=False, sep=D1OMNI_SEP,
                        mark_state=D1OMNI_MARK_STATE, mark_question=D1OMNI_MARK_QUESTION,
                        mark_option=D1OMNI_MARK_OPTION)
        pieces = prompt.split(D1OMNI_SEP)
        if not pieces or pieces[0] != "":  # no media: nothing before the first piece
            raise _layout(self.family)
        n_max, n_options = D1OMNI_MAX_TOKENS, len(question.options)
        n_budget = max(96, min(24 * n_options + 32, n_max // 2))
        n_option_max = max(2, (n_budget - 3 * n_options) // n_options)
        n_question_max = max(16, n_budget)
        head: list[int] = []
        body: list[int] | None = None
        tail: list[int] = []
        for piece in pieces[1:]:
            limit = None
            is_state = piece.startswith(D1OMNI_MARK_STATE)
            if is_state:
                piece = piece[len(D1OMNI_MARK_STATE):]
            elif piece.startswith(D1OMNI_MARK_QUESTION):
                piece, limit = piece[len(D1OMNI_MARK_QUESTION):], n_question_max
            elif piece.startswith(D1OMNI_MARK_OPTION):
                piece, limit = piece[len(D1OMNI_MARK_OPTION):], n_option_max
            tokens = vocab.tokenize(piece, False, True)
            if limit is not None:
                tokens = tokens[:limit]
            if is_state:
                if body is not None:
                    raise _layout(self.family)
                body = tokens
            else:
                (head if body is None else tail).extend(tokens)
        if body is None:
            raise _layout(self.family)
        body = body[:n_max - min(n_max, len(head) + len(tail))]
        tokens = (head + body + tail)[:n_max]
        if sum(1 for token in tokens if token == self.mask) != n_options:
            raise InvalidRequest("the options do not fit in the context")
        return len(tokens)

    def _joint(self, systemone: SystemOneInput, vocab: Tokenizer) -> int:
        questions = [{"id": q.id, "type": q.type, "instructions": q.instructions,
                      "options": _options(q, True, True)} for q in systemone.questions]
        inputs = replace_text(sort_keys({"state": systemone.state, "questions": questions}),
                              CLEF_MARKER, "<<clef ")
        prompt = render(self.template, **inputs, images=[], sep=CLEF_SEP,
                        mark_question=CLEF_MARK_QUESTION, mark_option=CLEF_MARK_OPTION)
        n_tokens = n_questions = n_scores = 0
        for piece in prompt.split(CLEF_SEP):
            marked = False
            if piece.startswith(CLEF_MARK_QUESTION):
                piece, marked = piece[len(CLEF_MARK_QUESTION):], True
                n_questions += 1
            elif piece.startswith(CLEF_MARK_OPTION):
                piece, marked = piece[len(CLEF_MARK_OPTION):], True
                n_scores += 1
            tokens = vocab.tokenize(piece, False, True)
            if marked and not tokens:
                raise InvalidRequest("the instructions and the options of a question must not "
                                     "be empty")
            n_tokens += len(tokens)
        if n_questions != len(questions) or \
                n_scores != sum(len(q.options) for q in systemone.questions):
            raise _layout(self.family)
        return n_tokens
