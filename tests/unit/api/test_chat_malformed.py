"""Malformed model output, as the vendored llama.cpp reads it (tests/data/chat_cases_malformed.json,
written by bench/malformed_calls.py with llama.cpp's own common_chat_parse): for each template's
first tool-call case, the output cut short by `max_tokens` (a third, a half, all but the last
character) and with broken JSON arguments.

llama.cpp reads a call cut short leniently: the text before it stays content, the call is kept
where its name is written (its arguments as far as they go), a marker or call not yet named is
dropped. Where its parse fails (broken JSON: llama-server answers 500 "The model produced output
that does not match the expected … format"), llamaq answers without an error (ours,
docs/chat-formats.md): the text that is not a call stays content, and there is no call (there is
none in llama.cpp's reading mid-stream either). Whole and streamed a character at a time alike.
The answers that still differ from llama.cpp's are listed in
tests/data/chat_cases_malformed_differ.txt (`python -m tests.unit.api.test_chat_malformed`
rewrites it); one that starts to agree fails here until it leaves the list."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.chat_cases import cases, normal, prepare, run
from tests.paths import DATA

RECORDS: list[dict[str, Any]] = json.loads(
    (DATA / "chat_cases_malformed.json").read_text("utf-8"))
DIFFER_FILE = DATA / "chat_cases_malformed_differ.txt"
DIFFER = frozenset(DIFFER_FILE.read_text("utf-8").split())
BY_ID = {c["id"]: c for c in cases()}


def _id(record: dict[str, Any]) -> str:
    return f"{record['case']}:{record['variant']}"


def _differs(record: dict[str, Any]) -> str:
    """"" when llamaq reads the text as llama.cpp does (or, where llama.cpp fails, answers
    with no call and no error); else what differs. Raises where llamaq itself fails."""
    outcome = run({**BY_ID[record["case"]], "input": record["input"]})
    assert not outcome.error, outcome.error
    assert outcome.whole is not None and outcome.streamed is not None
    whole, streamed = normal(outcome.whole, []), normal(outcome.streamed, [])
    assert streamed == whole, "the stream adds up to another answer than the whole one"
    theirs = record["llama.cpp"]
    if "whole" not in theirs:  # llama-server: 500; ours: an answer, with no call
        return "" if not whole["tool_calls"] else f"a call where llama.cpp fails: {whole}"
    want = normal(theirs["whole"], [])
    return "" if whole == want else f"{whole} != llama.cpp's {want}"


@pytest.mark.parametrize("record", RECORDS, ids=[_id(r) for r in RECORDS])
def test_malformed_output_reads_as_llama_cpp_reads_it(record: dict[str, Any]) -> None:
    differs = _differs(record)
    if _id(record) in DIFFER:
        assert differs, "read as llama.cpp reads it now: take it off the differ list"
    else:
        assert not differs, differs


def test_every_family_has_a_cut_and_a_broken_call() -> None:
    templates = {BY_ID[r["case"]]["template"] for r in RECORDS}
    kinds = {(BY_ID[r["case"]]["template"], r["variant"]) for r in RECORDS}
    assert len(templates) >= 50
    assert kinds == {(t, v) for t in templates for v in ("third", "half", "minus1", "broken")}
    assert {_id(r) for r in RECORDS} >= DIFFER


if __name__ == "__main__":
    DIFFER_FILE.write_text("".join(f"{_id(r)}\n" for r in RECORDS if _differs(r)), "utf-8")


def test_the_parser_is_named_as_llama_cpp_names_it() -> None:
    """generation_settings' `chat_format` (`__verbose`, /slots): llama.cpp's format name."""
    names = {BY_ID[r["case"]]["template"]: r["llama.cpp"]["format"] for r in RECORDS}
    ours = {BY_ID[r["case"]]["template"]: prepare(BY_ID[r["case"]]).chat_format for r in RECORDS}
    assert ours == names
    assert set(names.values()) == {"peg-native", "peg-gemma4", "peg-minimax-m3"}
