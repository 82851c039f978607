"""Reading a request body into a wire model: malformed JSON and wrong shapes are 400s."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from sanic import Request

from api.errors import validation_message
from scheduler.errors import InvalidRequest

Model = TypeVar("Model", bound=BaseModel)


def json_body(request: Request) -> dict[str, Any]:
    raw = request.body or b""
    try:
        body = json.loads(raw) if raw.strip() else None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"Invalid JSON in the request body: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object")
    return body


def parse_body(request: Request, model: type[Model]) -> Model:
    try:
        return model.model_validate(json_body(request))
    except ValidationError as exc:
        raise InvalidRequest(validation_message(exc)) from None


def drop_nulls(data: Any) -> Any:
    """A field sent as null counts as absent (llama-server reads it that way)."""
    if isinstance(data, dict):
        return {key: value for key, value in data.items() if value is not None}
    return data
