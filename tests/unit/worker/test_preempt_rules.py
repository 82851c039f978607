"""Preemption's pure rules (worker/process/preempt.py): whom a worker preempts, and the flag."""

from __future__ import annotations

import pytest

from scheduler.contract.jobs import CompletionJob, JobKind
from worker.process.jobrun import Running
from worker.process.preempt import victim_order
from worker.runtime.settings import WorkerSettings


def run(priority: int | None, started: float, background: bool = False
        ) -> tuple[CompletionJob, Running]:
    job = CompletionJob(model="m", prompt="p", priority=priority, background=background)
    return job, Running(priority or 0, 0, JobKind.COMPLETION, started)


def test_batch_lines_first_then_the_largest_priority_then_the_latest() -> None:
    runs = [run(5, 1.0), run(10, 2.0), run(10, 3.0), run(None, 9.0), run(-2, 8.0)]
    ordered = sorted(runs, key=lambda r: victim_order(*r), reverse=True)
    assert [(j.priority, r.started) for j, r in ordered] == [
        (10, 3.0), (10, 2.0), (5, 1.0), (None, 9.0), (-2, 8.0)]
    line = run(-100, 0.0, background=True)
    assert max([*runs, line], key=lambda r: victim_order(*r)) == line


def test_the_flag_takes_off_and_priority(capsys: pytest.CaptureFixture[str]) -> None:
    assert WorkerSettings.from_args([], environ={}).preempt == "priority"
    assert WorkerSettings.from_args(["--preempt", "off"], environ={}).preempt == "off"
    with pytest.raises(SystemExit):
        WorkerSettings.from_args(["--preempt", "fair"], environ={})
    assert "--preempt" in capsys.readouterr().err
