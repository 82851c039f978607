"""api/prompt_log.py: llama-server's file names and contents, no file replaced."""

from __future__ import annotations

from pathlib import Path

from api.prompt_log import PromptLog
from scheduler.contract.jobs import CompletionJob


def test_files_named_by_milliseconds_and_never_replaced(tmp_path: Path) -> None:
    log = PromptLog(tmp_path / "new" / "dir")
    first = log.write(CompletionJob(model="m", prompt="hello"))
    second = log.write(CompletionJob(model="m", prompt=[1, "é"]))
    assert first is not None and second is not None and first != second
    assert len(first.stem.split("-")[0]) == 12 and first.suffix == ".txt"
    assert first.read_text() == "hello"
    assert second.read_text(encoding="utf-8") == '[\n  1,\n  "é"\n]'
