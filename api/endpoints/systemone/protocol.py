"""Wire model of POST /v1/systemone (the spec's "TypeSafe-compatible API Endpoints" section):
checked so that an invalid request is a 400 before the model check can give a 501.

Limits (scheduler/contract/limits.py): at most MAX_DECISION_QUESTIONS questions,
MAX_DECISION_OPTIONS options per choice question, 2 to 10 score levels;
the rendered prompt is bounded too (check_decision). Files, images and image parts of a state
made of chat messages must be data URLs with base64 data.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from scheduler.contract.deferred import DeferredModel
from scheduler.contract.limits import (
    MAX_DECISION_OPTIONS,
    MAX_DECISION_QUESTIONS,
    MAX_DECISION_TEXT,
)

Instructions = str | dict[str, Any] | list[Any]
MIN_SCORE_LEVELS = 2
MAX_SCORE_LEVELS = 10
DATA_URL = re.compile(r"data:[A-Za-z0-9.+-]+/[A-Za-z0-9.+-]+(?:;[^;,]+)*;base64,")
MEDIA_PARTS = ("image_url", "input_audio")


class Question(DeferredModel):
    """A typed question: `choice` (criteria: option → description or null), `score` (criteria:
    2 to 10 level descriptions, lowest first) or `noul` (criteria: optional descriptions of
    true and false)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    type: Literal["choice", "score", "noul"]
    instructions: Instructions
    criteria: dict[str, str | None] | list[str] | None = None

    @model_validator(mode="after")
    def _criteria_fit_the_type(self) -> Question:
        criteria = self.criteria
        if self.type == "choice":
            if not isinstance(criteria, dict) or not criteria:
                raise ValueError("a choice question needs criteria: an object that maps each "
                                 "option to its description")
            if len(criteria) > MAX_DECISION_OPTIONS:
                raise ValueError(f"a choice question has at most {MAX_DECISION_OPTIONS} options, "
                                 f"got {len(criteria)}")
            if not all(option.strip() for option in criteria):
                raise ValueError("an option of a choice question is an empty name")
        elif self.type == "score":
            if not (isinstance(criteria, list)
                    and MIN_SCORE_LEVELS <= len(criteria) <= MAX_SCORE_LEVELS):
                raise ValueError("a score question needs criteria: an array of 2 to 10 level "
                                 "descriptions")
        elif criteria is not None and not (
                isinstance(criteria, dict) and set(criteria) <= {"true", "false"}):
            raise ValueError("the criteria of a noul question are an object with the "
                             "descriptions of true and false")
        return self


class SystemOneRequest(DeferredModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    state: str | dict[str, Any] | list[Any] | None
    files: list[str] = Field(default_factory=list)
    images: list[str] = Field(default_factory=list)
    questions: dict[str, Question] = Field(min_length=1, max_length=MAX_DECISION_QUESTIONS)

    @model_validator(mode="after")
    def _inputs_are_valid(self) -> SystemOneRequest:
        for url in (*self.files, *self.images):
            check_data_url(url)
        split_state(self.state)  # raises for a bad image part
        size = len(state_text(self.state)) + sum(
            len(json.dumps(q.model_dump(), ensure_ascii=False)) for q in self.questions.values())
        if size > MAX_DECISION_TEXT:
            raise ValueError(f"the state and questions are too long: {size} characters (at most "
                             f"{MAX_DECISION_TEXT})")
        return self

    def media(self) -> list[str]:
        """Every image or audio input: files and images first, then the state's parts."""
        return [*self.files, *self.images, *split_state(self.state)[1]]

    def media_fields(self) -> list[tuple[str, str]]:
        """Where each media input is (`files[i]`, `images[i]`, or the state's part as
        `state.messages[i].content[j]`) and its kind (image, or audio for a `data:audio/` file
        and an input_audio part), in the order of `media()`."""
        found = [(f"{name}[{i}]", "audio" if url.startswith("data:audio/") else "image")
                 for name, urls in (("files", self.files), ("images", self.images))
                 for i, url in enumerate(urls)]
        for i, message in enumerate(_messages(self.state) or []):
            content = message.get("content")
            for j, part in enumerate(content if isinstance(content, list) else []):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind in ("image_url", "input_audio"):
                    where = "state.messages" if isinstance(self.state, dict) else "state"
                    found.append((f"{where}[{i}].content[{j}] ({kind})",
                                  "image" if kind == "image_url" else "audio"))
        return found


def check_data_url(url: str) -> None:
    """`data:<type>/<subtype>[;…];base64,<data>` with valid base64, else ValueError."""
    match = DATA_URL.match(url)
    if match is None:
        raise ValueError("files, images and image parts must be data URLs "
                         "(data:<type>;base64,<data>)")
    try:
        base64.b64decode(url[match.end():], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("a data URL holds invalid base64 data") from None


def _messages(state: Any) -> list[Any] | None:
    """The chat messages a state is made of (an array of messages, or an object with a
    `messages` array), or None when it is not made of messages."""
    messages = state.get("messages") if isinstance(state, dict) else state
    if isinstance(messages, list) and messages and all(
            isinstance(m, dict) and "role" in m for m in messages):
        return messages
    return None


def split_state(state: Any) -> tuple[Any, list[str]]:
    """The state without its media parts, and those parts (as data URLs or base64 audio).
    Raises ValueError for a media part that is not a data URL."""
    messages = _messages(state)
    if messages is None:
        return state, []
    media: list[str] = []
    kept_messages = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            kept_messages.append(message)
            continue
        kept = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "image_url":
                url = part.get("image_url")
                url = url.get("url") if isinstance(url, dict) else url
                if not isinstance(url, str):
                    raise ValueError("an image_url part needs a url")
                check_data_url(url)
                media.append(url)
            elif kind == "input_audio":
                audio = part.get("input_audio")
                data = audio.get("data") if isinstance(audio, dict) else None
                if not isinstance(data, str):
                    raise ValueError("an input_audio part needs base64 data")
                media.append(data)
            else:
                kept.append(part)
        kept_messages.append({**message, "content": kept})
    if isinstance(state, dict):
        return {**state, "messages": kept_messages}, media
    return kept_messages, media


def state_text(state: Any) -> str:
    """The state as the model reads it: a string as is, anything else as JSON text (null:
    nothing)."""
    if state is None:
        return ""
    if isinstance(state, str):
        return state
    return json.dumps(split_state(state)[0], ensure_ascii=False)
