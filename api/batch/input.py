"""Reading a batch's input file: JSONL lines `{"custom_id", "method", "url", "body"}`, checked
as OpenAI checks them before a batch runs. A file that breaks a rule fails the whole batch
with its errors listed (by line); a line whose request is bad fails on its own at run time and
goes to the error file. The file is read line by line and its valid lines are kept as offsets
into it (BatchLines), read again when their chunk runs: a 50,000-line batch holds 800 KB of
offsets for its day, not its requests."""

from __future__ import annotations

from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

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


class BatchLines:
    """The valid lines of an input file, as (offset, length) into it: `take` reads and parses
    the ones a chunk needs. The file must stay where it is while they are used."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._offsets = array("q")
        self._lengths = array("q")

    def add(self, offset: int, length: int) -> None:
        self._offsets.append(offset)
        self._lengths.append(length)

    def clear(self) -> None:
        self._offsets, self._lengths = array("q"), array("q")

    def __len__(self) -> int:
        return len(self._offsets)

    def take(self, indices: Iterable[int]) -> list[BatchLine]:
        assert self.path is not None, "lines read from a file"
        with self.path.open("rb") as file:
            return [self._line(file, i) for i in indices]

    def _line(self, file: IO[bytes], index: int) -> BatchLine:
        file.seek(self._offsets[index])
        item = load_json(file.read(self._lengths[index]))  # validated when it was read
        return BatchLine(custom_id=item["custom_id"], body=item["body"])


@dataclass
class BatchInput:
    lines: BatchLines = field(default_factory=BatchLines)
    model: str | None = None
    errors: list[BatchError] = field(default_factory=list)

    def fail(self, code: str, message: str, line: int | None = None,
             param: str | None = None) -> None:
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(BatchError(code=code, message=message, line=line, param=param))


def read_input_file(path: Path, endpoint: str) -> BatchInput:
    """The lines of a batch input file for `endpoint` (read line by line, never whole), or
    the errors that fail the batch."""
    if path.stat().st_size > MAX_INPUT_BYTES:
        return _too_large()
    with path.open("rb") as lines:
        return read_lines(lines, endpoint, BatchLines(path))


def _too_large() -> BatchInput:
    result = BatchInput()
    result.fail("file_too_large", f"The input file is larger than the {MAX_INPUT_BYTES} "
                "bytes a batch may read.")
    return result


def read_lines(raws: Iterable[bytes], endpoint: str, lines: BatchLines) -> BatchInput:
    """The lines, read as they come (kept in `lines` as offsets of `raws`): past MAX_LINES
    requests the reading stops (the file fails with too_many_requests), the rest not read."""
    result = BatchInput(lines=lines)
    seen: set[str] = set()
    requests = 0
    offset = 0
    for number, raw in enumerate(raws, start=1):
        start, offset = offset, offset + len(raw)
        if not raw.strip():
            continue
        requests += 1
        if requests > MAX_LINES:
            result.fail("too_many_requests", f"The input file has more than {MAX_LINES} "
                        f"requests; a batch may have at most {MAX_LINES}.")
            result.lines.clear()
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
        result.lines.add(start, len(raw))
    if not result.lines and not result.errors:
        result.fail("empty_file", "The input file has no requests.")
    if result.errors:
        result.lines.clear()
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
