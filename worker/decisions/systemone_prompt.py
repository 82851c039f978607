"""A label-logit decision family's prompts and labels, built as llama.cpp's server builds them
(tools/server/server-decision.cpp): each question rendered with the model's own
`tokenizer.chat_template.systemone`, its options given the family's label codes, and the
answer read from the logits of those label tokens at the prompt's last token.

- openjev: option i is the letter `A`…`Z`, `a`…`z` (52, each a single token); noul's options are
  (true, false);
- pplx-decider: the codes `A`…`Z`, `AA`…`ZZ` that are single tokens (at most 255), given to the
  template as each option's `label`; noul's options are (false, true);
- lfm2-d1: labels by question type: yes / no (each any single-token form of `yes`, `Yes`,
  `YES`), the level digits, or option codes (the keys when they are single letters, `A`… up to
  26 options, `00`… beyond, then the first free single-token code of a pool), each read with
  its ` code` form too (an option's score is the best of its forms); noul's options are
  (true, false).

The template gets the question's `id`, `type`, `instructions`, the `state` (raw JSON values: the
template serializes the ones that are not strings), `options` (`key`, `description`, and `label`
where the family has one) and `images` (empty: image input comes with multimodal).
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from scheduler.contract.errors import InvalidRequest
from scheduler.contract.jobs import SystemOneInput, SystemOneQuestion
from scheduler.decision_meta import DecisionCaps, DecisionMetaError

if TYPE_CHECKING:  # jinja2 is imported where used: only a decision family's worker needs it
    from jinja2 import Template

LETTERS = string.ascii_uppercase + string.ascii_lowercase
PAIRS = [a + b for a in string.ascii_uppercase for b in string.ascii_uppercase]
D1_POOL = [*string.ascii_uppercase, *(f"{i:02d}" for i in range(100)), *string.ascii_lowercase,
           *(f"#{i}" for i in range(200)), *PAIRS]
"""lfm2-d1's codes to fall back on when an option's own code is not a free single token."""
NOUL_FORMS = {"true": ("yes", "Yes", "YES"), "false": ("no", "No", "NO")}
TRUE_FIRST = ("openjev", "lfm2-d1")
"""The families whose model reads noul's options as (true, false)."""


class Tokenizer(Protocol):
    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]: ...


@dataclass
class FamilyQuestion:
    tokens: list[int]
    """The question's whole prompt."""
    groups: list[list[int]]
    """The label tokens of each option, in the answer's order (choice: the criteria; score: the
    levels; noul: true, then false)."""


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    """What chat templates call to refuse an input (transformers' and llama.cpp's)."""
    from jinja2 import TemplateError

    raise TemplateError(message)


def systemone_template(caps: DecisionCaps) -> Template:
    """The family's `tokenizer.chat_template.systemone`, compiled (DecisionMetaError when it
    does not parse)."""
    from jinja2 import TemplateError
    from jinja2.sandbox import SandboxedEnvironment

    assert caps.systemone_template is not None
    env = SandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                               extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    try:
        return env.from_string(caps.systemone_template)
    except TemplateError as error:
        raise DecisionMetaError(f'the "systemone" template does not parse: {error}') from None


def render(template: Template, **variables: Any) -> str:
    """The template rendered; a failure is the request's 400, named."""
    from jinja2 import TemplateError

    try:
        return template.render(**variables)
    except TemplateError as error:
        raise InvalidRequest(f'the model\'s "systemone" template failed: {error}') from None


class FamilyPrompter:
    """One worker's: the family, its template and the vocabulary's label tables, checked once
    when the worker starts (a label that is not a single token stops it, as llama.cpp does).
    The vocabulary is handed in with each call: an engine that slept and woke has a new one
    (of the same file)."""

    def __init__(self, caps: DecisionCaps, vocab: Tokenizer) -> None:
        assert caps.family is not None and caps.systemone_template is not None
        self.family = caps.family.name
        self.template = systemone_template(caps)
        self.codes: list[str] = []
        self.code_tokens: list[int] = []
        if self.family == "openjev":
            for letter in LETTERS:
                token = _single(vocab, letter)
                if token is None:
                    raise DecisionMetaError(f"decision label {letter!r} is not a single token")
                self.code_tokens.append(token)
            self.codes = list(LETTERS)
        elif self.family == "lfm2-d1":  # its yes / no and level labels exist
            for key, texts in (*NOUL_FORMS.items(), *((d, (d,)) for d in string.digits)):
                if all(_single(vocab, text) is None for text in texts):
                    raise DecisionMetaError(f"decision label is not a single token: {key}")
        elif self.family == "pplx-decider":
            for code in [*string.ascii_uppercase, *PAIRS]:
                token = _single(vocab, code)
                if token is not None and len(self.codes) < 255:
                    self.codes.append(code)
                    self.code_tokens.append(token)

    def questions(self, systemone: SystemOneInput, vocab: Tokenizer) -> list[FamilyQuestion]:
        return [self.question(systemone.state, q, vocab) for q in systemone.questions]

    def question(self, state: Any, question: SystemOneQuestion,
                 vocab: Tokenizer) -> FamilyQuestion:
        options = [option.model_dump() for option in question.options]
        noul_flip = question.type == "noul" and self.family in TRUE_FIRST
        if noul_flip:  # the model's order: (true, false)
            options.reverse()
        if self.family == "lfm2-d1":
            labels, groups = _d1_labels(vocab, question.type, [o["key"] for o in options])
        else:
            n = len(options)
            if n > len(self.code_tokens):
                raise InvalidRequest(f"question {question.id!r}: too many options ({n}), this "
                                     f"model supports at most {len(self.code_tokens)}")
            labels, groups = self.codes[:n], [[t] for t in self.code_tokens[:n]]
        if self.family != "openjev":  # the template is given each option's label
            for option, label in zip(options, labels, strict=True):
                option["label"] = label
        prompt = render(self.template, id=question.id, type=question.type,
                        instructions=question.instructions, state=state, options=options,
                        images=[])
        tokens = vocab.tokenize(prompt, False, True)
        if question.type == "noul" and not noul_flip:  # the answer's order: (true, false)
            groups.reverse()
        return FamilyQuestion(tokens=tokens, groups=groups)



def _single(vocab: Tokenizer, text: str) -> int | None:
    """The token `text` is, when it is one."""
    tokens = vocab.tokenize(text, False, False)
    return tokens[0] if len(tokens) == 1 else None


def _d1_labels(vocab: Tokenizer, question_type: str,
               keys: list[str]) -> tuple[list[str], list[list[int]]]:
    """lfm2-d1's label texts and token groups of each option, in the model's order."""

    def forms(texts: tuple[str, ...] | list[str]) -> list[int]:
        found: list[int] = []
        for text in texts:
            token = _single(vocab, text)
            if token is not None and token not in found:
                found.append(token)
        return found

    if question_type != "choice":
        groups = [forms([key]) if question_type == "score" else forms(NOUL_FORMS[key])
                  for key in keys]
        for key, group in zip(keys, groups, strict=True):
            if not group:
                raise InvalidRequest(f"decision label is not a single token: {key}")
        return keys, groups
    letters = all(len(key) == 1 and key.isalpha() for key in keys)
    wanted = [key if letters else LETTERS[i] if len(keys) <= 26 else f"{i:02d}"
              for i, key in enumerate(keys)]
    used: set[int] = set()
    texts: list[str] = []
    groups = []
    for code in wanted:
        for candidate in (code, *D1_POOL):
            token = _single(vocab, candidate)
            if token is None or token in used:
                continue
            used.add(token)
            group = [token] + [t for t in forms([" " + candidate]) if t != token]
            texts.append(candidate)
            groups.append(group)
            break
        else:
            raise InvalidRequest(f"no single-token label left for {len(keys)} options")
    return texts, groups
