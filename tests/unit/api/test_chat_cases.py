"""llama.cpp's own chat parser cases (the vendored tests/test-chat.cpp, ported by
bench/port_chat_cases.py): every case llamaq answers as llama.cpp does stays so, whole and
streamed a character at a time (tests/chat_cases.py). The cases it does not yet answer alike are
listed in tests/data/chat_cases_differ.txt; one of them that starts to pass fails here until it
leaves the list (`python -m tests.chat_cases_differ` rewrites it), so the count only goes up."""

from __future__ import annotations

import pytest

from tests.chat_cases import cases, verdict
from tests.paths import DATA

DIFFER = frozenset((DATA / "chat_cases_differ.txt").read_text("utf-8").split())
CASES = cases()


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_llama_cpp_chat_case(case) -> None:
    differs = verdict(case)
    if case["id"] in DIFFER:
        assert differs, "answered as llama.cpp does now: take it off chat_cases_differ.txt"
    else:
        assert not differs, differs


def test_the_differ_list_names_only_ported_cases() -> None:
    assert {c["id"] for c in CASES} >= DIFFER
