"""Reading a batch's input file: JSONL lines `{"custom_id", "method", "url", "body"}`, checked
as OpenAI checks them before a batch runs. A file that breaks a rule fails the whole batch
with its errors listed (by line); a line whose request is bad fails on its own at run time and
goes to the error file."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from api.body import load_json
from scheduler.batches import MAX_INPUT_BYTES, MAX_LINES, BatchError
from scheduler.contract.errors import InvalidRequest

MAX_ERRORS = 100
"""Validation errors reported for one file (the first ones)."""
MAX_CUSTOM_ID = 512


@dataclass(frozen=True)
class BatchLine:
    custom_id: str
    body: dict[str, Any]


@dataclass
class BatchInput:
    lines: list[BatchLine] = field(default_factory=list)
    model: str | None = None
    errors: list[BatchError] = field(default_factory=list)

    def fail(self, code: str, message: str, line: int | None = None,
             param: str | None = None) -> None:
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(BatchError(code=code, message=message, line=line, param=param))


def read_input(data: bytes, endpoint: str) -> BatchInput:
    """The lines of a batch input file for `endpoint`, or the errors that fail the batch."""
    if len(data) > MAX_INPUT_BYTES:
        return _too_large()
    return read_lines(data.split(b"\n"), endpoint)


def read_input_file(path: Path, endpoint: str) -> BatchInput:
    """As read_input, from a file read line by line (never whole)."""
    if path.stat().st_size > MAX_INPUT_BYTES:
        return _too_large()
    with path.open("rb") as lines:
        return read_lines(lines, endpoint)


def _too_large() -> BatchInput:
    result = BatchInput()
    result.fail("file_too_large", f"The input file is larger than the {MAX_INPUT_BYTES} "
                "bytes a batch may read.")
    return result


def read_lines(raws: Iterable[bytes], endpoint: str) -> BatchInput:
    """The lines, read as they come: past MAX_LINES requests the reading stops (the file
    fails with too_many_requests), the rest not read."""
    result = BatchInput()
    seen: set[str] = set()
    requests = 0
    for number, raw in enumerate(raws, start=1):
        if not raw.strip():
            continue
        requests += 1
        if requests > MAX_LINES:
            result.fail("too_many_requests", f"The input file has more than {MAX_LINES} "
                        f"requests; a batch may have at most {MAX_LINES}.")
            result.lines = []
            return result
        line = _read_line(raw, number, endpoint, result)
        if line is None:
            continue
        if line.custom_id in seen:
            result.fail("duplicate_custom_id", "The custom_id for this request is a duplicate "
                        "of another request. The custom_id parameter must be unique for each "
                        "request in a batch.", number, "custom_id")
            continue
        seen.add(line.custom_id)
        model = line.body.get("model")
        if model is not None and not isinstance(model, str):
            result.fail("invalid_request", "The model must be a string.", number, "body.model")
            continue
        if model is not None:
            if result.model is None:
                result.model = model
            elif model != result.model:
                result.fail("mismatched_model", f"The provided model '{model}' does not match "
                            f"the model '{result.model}' of the other requests in this batch. "
                            "All requests in a batch must use the same model.", number,
                            "body.model")
                continue
        result.lines.append(line)
    if not result.lines and not result.errors:
        result.fail("empty_file", "The input file has no requests.")
    if result.errors:
        result.lines = []
    return result


def _read_line(raw: bytes, number: int, endpoint: str, result: BatchInput) -> BatchLine | None:
    try:
        item = load_json(raw)
    except InvalidRequest:
        result.fail("invalid_json_line", "This line is not parseable as valid JSON.", number)
        return None
    if not isinstance(item, dict):
        result.fail("invalid_json_line", "This line is not a JSON object.", number)
        return None
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        result.fail("missing_required_parameter", "Missing required parameter: 'custom_id' "
                    "(a non-empty string).", number, "custom_id")
        return None
    if len(custom_id) > MAX_CUSTOM_ID:
        result.fail("invalid_request", f"custom_id is longer than {MAX_CUSTOM_ID} "
                    "characters.", number, "custom_id")
        return None
    method = item.get("method")
    if method != "POST":
        result.fail("invalid_method" if method is not None else "missing_required_parameter",
                    "Only the POST method is supported in a batch." if method is not None
                    else "Missing required parameter: 'method'.", number, "method")
        return None
    url = item.get("url")
    if url != endpoint:
        result.fail("invalid_url" if url is not None else "missing_required_parameter",
                    f"The URL provided for this request does not match the batch endpoint "
                    f"'{endpoint}'." if url is not None else "Missing required parameter: 'url'.",
                    number, "url")
        return None
    body = item.get("body")
    if not isinstance(body, dict):
        result.fail("missing_required_parameter", "Missing required parameter: 'body' (a JSON "
                    "object).", number, "body")
        return None
    unknown = sorted(set(item) - {"custom_id", "method", "url", "body"})
    if unknown:
        result.fail("invalid_request", f"Unknown parameter: '{unknown[0]}'.", number,
                    unknown[0])
        return None
    return BatchLine(custom_id=custom_id, body=body)
