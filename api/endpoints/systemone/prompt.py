"""The prompt of a decision request.

A model with a chat template (its own, or --chat-template / --chat-template-file) gets each
question as one conversation: a system message that says how to answer, and a user message with
the state, then the question and its allowed answers; the generation prompt follows, so the
answer is read where the model would start its reply. A model without one (a base model) gets
the same text as a plain document that ends with "Answer:", and the labels are read with a
leading space, as the text would go on. The part every question shares (everything up to the
end of the state) is the job's `prefix`, prefilled once by the worker; the rest is the
question's `suffix`. The labels read as answers are the option names (choice), the level
numbers 0 … K-1 (score) and yes / no (noul: P(yes) is the answer).
"""

from __future__ import annotations

import json
from typing import Any

from api.chat.templates import ChatTemplate
from api.endpoints.systemone.protocol import Question, SystemOneRequest, split_state, state_text
from scheduler.contract.jobs import (
    DecisionJob,
    DecisionQuestion,
    SystemOneInput,
    SystemOneOption,
    SystemOneQuestion,
)

FRAMING = ("Read the text and answer the question with one of the options given, written "
           "exactly as it is given, and nothing else.")
PLAIN_FRAMING = "Read the text and answer the question."
MARK = "\u2063QUESTION\u2063"
"""Stands for a question in a render that finds where the shared prefix ends."""
NOUL_LABELS = ("yes", "no")


def labels(question: Question) -> list[str]:
    if question.type == "choice":
        assert isinstance(question.criteria, dict)
        return list(question.criteria)
    if question.type == "score":
        assert isinstance(question.criteria, list)
        return [str(level) for level in range(len(question.criteria))]
    return list(NOUL_LABELS)


def instructions_text(instructions: Any) -> str:
    if isinstance(instructions, str):
        return instructions
    return json.dumps(instructions, ensure_ascii=False)


def question_text(question: Question) -> str:
    """The question with its options: `Question: … (a, b, c)` and the options' descriptions;
    levels listed with their numbers; `(yes or no)`. (The short form read best on the small
    base model the tests use: bench/decisions.py measures it.)"""
    text = f"Question: {instructions_text(question.instructions)}"
    criteria = question.criteria
    if question.type == "choice":
        assert isinstance(criteria, dict)
        lines = [f"{text} ({', '.join(criteria)})"]
        lines += [f"- {name}: {about}" for name, about in criteria.items() if about]
    elif question.type == "score":
        assert isinstance(criteria, list)
        lines = [text, *(f"{level}: {about}" for level, about in enumerate(criteria))]
    else:
        described = criteria if isinstance(criteria, dict) else {}
        lines = [f"{text} (yes or no)"]
        lines += [f"{word} means: {described[key]}" for word, key in
                  zip(NOUL_LABELS, ("true", "false"), strict=True) if described.get(key)]
    return "\n".join(lines)


def user_message(state: str, question: str, media: str = "") -> str:
    """The user's turn: the media (their markers) first, then the state, then the question."""
    media = f"{media}\n" if media else ""
    return f"{media}Text: {state}\n{question}" if state else f"{media}{question}"


def common_prefix(texts: list[str]) -> str:
    first = min(texts, key=len)
    n = 0
    while n < len(first) and all(t[n] == first[n] for t in texts):
        n += 1
    return first[:n]


def decision_job(body: SystemOneRequest, template: ChatTemplate | None, model: str,
                 extra_context: dict[str, Any], media_marker: str = "") -> DecisionJob:
    """The job: the shared prefix and one suffix and label list per question; with
    `media_marker`, one marker per media input before the state (the spec: "All the images are
    placed before the state in the prompt, the ones from files and images first")."""
    state = state_text(body.state)
    lead = "" if template is not None else " "
    media = media_marker * len(body.media()) if media_marker else ""

    def render(question: str) -> str:
        if template is None:
            return f"{PLAIN_FRAMING}\n\n{user_message(state, question, media)}\nAnswer:"
        return template.render([{"role": "system", "content": FRAMING},
                                {"role": "user",
                                 "content": user_message(state, question, media)}],
                               add_generation_prompt=True, extra_context=extra_context)

    ids = list(body.questions)
    renders = [render(question_text(body.questions[i])) for i in ids]
    marked = render(MARK)
    cut = marked.find(MARK)
    prefix = marked[:cut] if cut > 0 else ""
    if not prefix or not all(r.startswith(prefix) for r in renders):
        prefix = common_prefix([*renders, marked])  # a template that changes the text
    return DecisionJob(model=model, prefix=prefix, questions=[
        DecisionQuestion(id=i, type=body.questions[i].type, suffix=r[len(prefix):],
                         labels=[lead + label for label in labels(body.questions[i])])
        for i, r in zip(ids, renders, strict=True)])


def systemone_options(question: Question) -> list[SystemOneOption]:
    """A question's options as llama.cpp gives them to a family's template: the criteria in
    their order (choice), the levels "0" … "K-1" (score), "false" then "true" (noul)."""
    criteria = question.criteria
    if question.type == "choice":
        assert isinstance(criteria, dict)
        return [SystemOneOption(key=key, description=about) for key, about in criteria.items()]
    if question.type == "score":
        assert isinstance(criteria, list)
        return [SystemOneOption(key=str(level), description=about)
                for level, about in enumerate(criteria)]
    described = criteria if isinstance(criteria, dict) else {}
    return [SystemOneOption(key=key, description=described.get(key))
            for key in ("false", "true")]


def systemone_input(body: SystemOneRequest) -> SystemOneInput:
    """The request as a decision family reads it: the state without its media parts (raw JSON,
    the template serializes what is not a string) and each question with its options."""
    return SystemOneInput(state=split_state(body.state)[0], questions=[
        SystemOneQuestion(id=qid, type=question.type, instructions=question.instructions,
                          options=systemone_options(question))
        for qid, question in body.questions.items()])
