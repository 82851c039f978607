"""Wire model of POST /v1/systemone (the spec's "TypeSafe-compatible API Endpoints" section):
checked so that an invalid request is a 400 even where the feature itself is not served."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Instructions = str | dict[str, Any] | list[Any]
MIN_SCORE_LEVELS = 2
MAX_SCORE_LEVELS = 10


class Question(BaseModel):
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


class SystemOneRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    state: str | dict[str, Any] | list[Any] | None
    files: list[str] = Field(default_factory=list)
    images: list[str] = Field(default_factory=list)
    questions: dict[str, Question] = Field(min_length=1)

    @model_validator(mode="after")
    def _files_are_data_urls(self) -> SystemOneRequest:
        for url in (*self.files, *self.images):
            if not url.startswith("data:"):
                raise ValueError("files and images must be data URLs (data:...;base64,...)")
        return self
