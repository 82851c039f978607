"""The server-wide defaults a worker's flags give its requests."""

from __future__ import annotations

from worker.process.startup import engine_defaults
from worker.settings import WorkerSettings


def breakers(*argv: str) -> list[str]:
    settings = WorkerSettings.from_args(list(argv), environ={})
    return engine_defaults(settings, "m", "w").sampling.dry_sequence_breakers


def test_dry_sequence_breaker_none_clears_the_list() -> None:
    assert breakers() == ["\n", ":", "\"", "*"]
    assert breakers("--dry-sequence-breaker", "none") == []
    assert breakers("--dry-sequence-breaker", "a", "--dry-sequence-breaker", "none",
                    "--dry-sequence-breaker", "b") == ["b"]  # as llama.cpp: none clears, then b
    assert breakers("--dry-sequence-breaker", "\\n") == ["\n"]
