"""A decision job made ready for the engine, and the readout math (no llama.cpp calls here).

How an answer is read (README "Decisions"): each question's prompt is the shared prefix plus
its own suffix; its candidate labels are scored as whole token sequences continuing it:
log P(label) = sum of the log-probabilities (full-vocabulary softmax) of its tokens, each given
the ones before. Labels form a trie of tokens; a label that is itself a prefix of a longer one
("red" / "reddish") gets only the mass of not continuing towards the longer labels, so labels
that share first tokens are told apart and the candidates are disjoint events. The
probabilities are the softmax of those log-scores divided by the type's temperature, restricted
to the candidates (sum 1). Nothing is sampled.

What must be decoded: the suffix (the logits of its last token give the first label tokens),
then one branch per deepest inner node of the trie (a label's tokens but its last), with logits
on every token of the branch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path as FilePath
from typing import TYPE_CHECKING, Protocol

from scheduler.contract.errors import ExceedContextSize, InvalidRequest, NotSupported
from scheduler.contract.jobs import DecisionJob, SystemOneInput
from scheduler.decision_meta import DecisionCaps, native_caps
from scheduler.gguf_meta import read_metadata
from worker.decisions.systemone_heads import HeadPrompter
from worker.decisions.systemone_prompt import FamilyPrompter

if TYPE_CHECKING:
    import numpy as np  # for annotations: imported where used, ~19 MiB a worker may never need

    from worker.runtime.media import MediaPrompt

Path = tuple[int, ...]
"""A node of a question's label trie: the label tokens read so far."""


@dataclass
class QuestionPlan:
    id: str
    type: str
    suffix: list[int]
    labels: list[list[int]]
    branches: list[list[int]]
    """Token paths to decode after the suffix (each in turn, from the suffix's end)."""
    temperature: float
    children: dict[Path, set[int]] = field(default_factory=dict)
    """The trie: for each inner node, the tokens that lead on to a label."""
    groups: list[list[int]] | None = None
    """The labels (indices) of each option, when an option has several (a family's label
    forms): an option's score is the best of its labels'."""


@dataclass
class DecisionRequest:
    """A decision job, tokenized and checked: what the engine runs (worker/decisions/run.py)."""

    job: DecisionJob
    prefix: list[int]
    questions: list[QuestionPlan]
    media: MediaPrompt | None = None
    """The prefix's media chunks (encoded) over its placeholder positions
    (worker/runtime/media.py)."""

    @property
    def n_tokens_max(self) -> int:
        """The most tokens one question's sequence holds (prefix, suffix, longest branch)."""
        return len(self.prefix) + max(len(q.suffix) + max((len(b) for b in q.branches),
                                                          default=0) for q in self.questions)


class Tokenizer(Protocol):
    """What planning needs of the vocabulary (worker/runtime/vocab.py Vocab has it)."""

    def tokenize(self, text: str, add_special: bool, parse_special: bool) -> list[int]: ...


def decision_caps(model_path: FilePath, prompted: bool) -> DecisionCaps | None:
    """How this worker serves decisions: natively when the model file carries llamaq's
    decision keys or names a family of the spec (scheduler/decision_meta.py), by prompting
    under --decisions, else not. Raises DecisionMetaError for a refused or unusable family
    (the worker does not start, as llama-server does not)."""
    caps = native_caps(read_metadata(model_path))
    if caps is None and prompted:
        caps = DecisionCaps(mode="prompted")
    return caps


def label_trie(labels: list[list[int]]) -> dict[Path, set[int]]:
    children: dict[Path, set[int]] = {}
    for label in labels:
        for depth in range(len(label)):
            children.setdefault(tuple(label[:depth]), set()).add(label[depth])
    return children


def branches_of(labels: list[list[int]]) -> list[list[int]]:
    """The fewest paths whose decoding gives the logits at every inner node of the trie but
    the root: the deepest inner nodes, longest first."""
    inner = {tuple(label[:depth]) for label in labels for depth in range(1, len(label))}
    deepest = [node for node in inner
               if not any(len(other) > len(node) and other[:len(node)] == node
                          for other in inner)]
    return [list(node) for node in sorted(deepest, key=lambda n: (-len(n), n))]


def plan_decision(job: DecisionJob, vocab: Tokenizer, caps: DecisionCaps,
                  n_ctx_slot: int, n_ubatch: int = 1 << 30,
                  prompter: FamilyPrompter | HeadPrompter | None = None,
                  media: Callable[[str], MediaPrompt] | None = None) -> DecisionRequest:
    """Tokenize and check a decision job, with its family's rules (cuts to the token budgets,
    one-batch prompts); raises its 400 before it takes a slot, and the 501 of a family whose
    decision head this llama.cpp lacks once the request is known to be valid. A label-logit
    family's job (with `prompter`) is the family's own prompts and labels."""
    if isinstance(prompter, HeadPrompter) and job.systemone is not None:
        check_head_prompts(job.systemone, prompter, vocab, caps, n_ubatch)  # a 400 or the 501
    if isinstance(prompter, FamilyPrompter) and job.systemone is not None:
        return plan_family(job, prompter, vocab, caps, n_ctx_slot)
    media_prompt = None
    if job.media:  # the prefix with its media through the projector (decoded, encoded)
        if media is None or prompter is not None:
            raise NotSupported("image input is not supported by /v1/systemone here: this "
                               "worker has no multimodal projector for its decisions")
        media_prompt = media(job.prefix)
        if media_prompt.mrope:  # its lanes' positions go by token index
            raise NotSupported("decisions with media are not supported on this model "
                                 "(M-RoPE media positions)")
        prefix = media_prompt.tokens
    else:
        prefix = vocab.tokenize(job.prefix, True, True)
    if not prefix:
        raise InvalidRequest("the decision prompt is empty")
    questions = []
    for question in job.questions:
        if question.type not in caps.types:
            raise InvalidRequest(f"question {question.id!r}: this model does not answer "
                                 f"{question.type} questions")
        if question.type == "choice" and len(question.labels) > caps.max_options:
            raise InvalidRequest(f"question {question.id!r} has {len(question.labels)} options; "
                                 f"this model takes at most {caps.max_options}")
        labels = [vocab.tokenize(label, False, False) for label in question.labels]
        seen: dict[Path, str] = {}
        for text, tokens in zip(question.labels, labels, strict=True):
            if not tokens:
                raise InvalidRequest(f"question {question.id!r}: option {text!r} has no tokens")
            if tuple(tokens) in seen:
                raise InvalidRequest(f"question {question.id!r}: options {seen[tuple(tokens)]!r} "
                                     f"and {text!r} are the same tokens")
            seen[tuple(tokens)] = text
        suffix = vocab.tokenize(question.suffix, False, True)
        questions.append(QuestionPlan(
            id=question.id, type=question.type, suffix=suffix, labels=labels,
            branches=branches_of(labels),
            temperature=caps.temperature(question.type, len(labels)),
            children=label_trie(labels)))
    request = DecisionRequest(job, prefix, questions, media_prompt)
    if request.n_tokens_max >= n_ctx_slot:
        raise ExceedContextSize(
            f"the request exceeds the available context size ({request.n_tokens_max} tokens, "
            f"context {n_ctx_slot})", n_prompt_tokens=request.n_tokens_max, n_ctx=n_ctx_slot)
    for plan in questions:
        if not plan.suffix:
            raise InvalidRequest(f"question {plan.id!r}: its prompt is empty")
    if caps.family is not None and caps.family.readout == "head":
        raise head_missing(caps.family.name)
    return request


def plan_family(job: DecisionJob, prompter: FamilyPrompter, vocab: Tokenizer,
                caps: DecisionCaps, n_ctx_slot: int) -> DecisionRequest:
    """A label-logit family's job: each question's prompt is the model's systemone template
    rendered for it; what the prompts share (every question keeping a token of its own) is
    the prefix, prefilled once; each option is read from its label tokens' logits at the end
    of its question's prompt."""
    assert job.systemone is not None
    for question in job.systemone.questions:
        if question.type == "choice" and len(question.options) > caps.max_options:
            raise InvalidRequest(f"question {question.id!r} has {len(question.options)} "
                                 f"options; this model takes at most {caps.max_options}")
    family = prompter.questions(job.systemone, vocab)
    if any(not built.tokens for built in family):
        raise InvalidRequest("the decision prompt is empty")
    n_shared = min(len(q.tokens) for q in family) - 1
    for other in family[1:]:
        n_shared = min(n_shared, _common(family[0].tokens, other.tokens))
    prefix = family[0].tokens[:n_shared]  # empty when the prompts share nothing
    questions = []
    for question, built in zip(job.systemone.questions, family, strict=True):
        labels = [[token] for group in built.groups for token in group]
        groups, at = [], 0
        for group in built.groups:
            groups.append(list(range(at, at + len(group))))
            at += len(group)
        questions.append(QuestionPlan(
            id=question.id, type=question.type, suffix=built.tokens[n_shared:], labels=labels,
            branches=[], temperature=caps.temperature(question.type, len(question.options)),
            children=label_trie(labels), groups=groups))
    request = DecisionRequest(job, prefix, questions)
    if request.n_tokens_max >= n_ctx_slot:
        raise ExceedContextSize(
            f"the request exceeds the available context size ({request.n_tokens_max} tokens, "
            f"context {n_ctx_slot})", n_prompt_tokens=request.n_tokens_max, n_ctx=n_ctx_slot)
    return request


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < len(a) and n < len(b) and a[n] == b[n]:
        n += 1
    return n


def check_head_prompts(systemone: SystemOneInput, prompter: HeadPrompter, vocab: Tokenizer,
                       caps: DecisionCaps, n_ubatch: int) -> None:
    """A decision-head family's request: its prompts built as llama.cpp builds them (cut to
    the family's budgets, worker/decisions/systemone_heads.py), each (clef: the one of the whole
    request) checked against --ubatch-size, the batch it is evaluated in; then the 501 of the
    head this llama.cpp lacks."""
    assert caps.family is not None
    for question in systemone.questions:
        if question.type == "choice" and len(question.options) > caps.max_options:
            raise InvalidRequest(f"question {question.id!r} has {len(question.options)} "
                                 f"options; this model takes at most {caps.max_options}")
    what = "all the questions of a request in one prompt" if caps.family.joint else "a prompt"
    for n_prompt in prompter.prompt_lengths(systemone, vocab):
        if caps.family.one_batch and n_prompt > n_ubatch:
            raise InvalidRequest(
                f"the decision prompt has {n_prompt} tokens: {caps.family.name} evaluates "
                f"{what} in one batch, which must fit in --ubatch-size ({n_ubatch})")
    raise head_missing(caps.family.name)


def head_missing(family: str) -> NotSupported:
    return NotSupported(f"{family} answers from a decision head that the llama.cpp of this "
                        "worker (llama-cpp-python's) does not have: the request is valid, but "
                        "it cannot be answered here")


def child_logprobs(logits: np.ndarray, tokens: set[int]) -> dict[int, float]:
    """log P(token) under the full-vocabulary softmax of one row of logits."""
    import numpy as np

    row = logits.astype(np.float64, copy=False)
    peak = float(row.max())
    scale = peak + math.log(float(np.exp(row - peak).sum()))
    return {t: float(row[t]) - scale for t in tokens}


def label_scores(question: QuestionPlan,
                 logprobs: dict[Path, dict[int, float]]) -> list[float]:
    """log P(label, and not a longer label) for each label, from each inner node's
    log-probabilities of its children."""
    scores = []
    for label in question.labels:
        total = sum(logprobs[tuple(label[:depth])][label[depth]] for depth in range(len(label)))
        longer = question.children.get(tuple(label))
        if longer:  # a prefix of other labels: only the mass that does not go on to them
            onward = sum(math.exp(logprobs[tuple(label)][t]) for t in longer)
            total += math.log(max(1.0 - onward, 1e-300))
        scores.append(total)
    if question.groups is not None:  # an option is the best of its labels
        return [max(scores[i] for i in group) for group in question.groups]
    return scores


def restricted_softmax(scores: list[float], temperature: float = 1.0) -> list[float]:
    """Softmax over the candidates only, of the log-scores divided by the temperature."""
    import numpy as np

    values = np.asarray(scores, dtype=np.float64) / temperature
    if not np.isfinite(values).any():
        return [1.0 / len(scores)] * len(scores)
    values = np.exp(values - values[np.isfinite(values)].max())
    values[~np.isfinite(values)] = 0.0
    return [float(v) for v in values / values.sum()]
