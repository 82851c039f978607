"""A job's event log is capped in bytes and in events (worker/wires/event_log_budget.py, issue
43 item 9); a request's jobs together in bytes (limits.check_request_bytes)."""

from __future__ import annotations

import pytest

from scheduler.contract import keys, limits
from scheduler.contract.errors import InvalidRequest
from scheduler.contract.jobs import CompletionJob
from worker.wires.event_log_budget import EventLogBudget


def test_the_log_keeps_the_newest_events_within_the_bytes() -> None:
    budget = EventLogBudget(max_bytes=10_000, max_events=1000)
    keep = [budget.add("j", seq, 3000) for seq in range(6)]
    assert keep == [None, None, None, 1, 2, 3]  # 3 events of 3000 fit in 10,000
    assert budget.add("j", 6, 50_000) == 6  # bigger than the cap: only itself


def test_the_log_keeps_at_most_max_events() -> None:
    budget = EventLogBudget(max_bytes=1 << 30, max_events=3)
    assert [budget.add("j", seq, 10) for seq in range(5)] == [None, None, None, 1, 2]


def test_jobs_count_apart_and_a_gap_or_a_forgotten_job_starts_over() -> None:
    budget = EventLogBudget(max_bytes=100, max_events=1000)
    assert budget.add("a", 0, 60) is None
    assert budget.add("b", 0, 60) is None
    assert budget.add("a", 1, 60) == 1
    assert budget.add("a", 7, 60) is None  # a run elsewhere wrote 2..6
    budget.forget("b")
    assert budget.add("b", 1, 60) is None


def test_a_requests_jobs_are_bounded_in_bytes() -> None:
    prompt = "a" * (limits.MAX_REQUEST_JOB_BYTES // 3)
    jobs = [CompletionJob(model="m", prompt=prompt) for _ in range(2)]
    limits.check_request_bytes(jobs)
    with pytest.raises(InvalidRequest) as caught:
        limits.check_request_bytes([*jobs, CompletionJob(model="m", prompt=prompt)])
    assert caught.value.status == 413


def test_a_job_keeps_its_share_of_its_requests_budget() -> None:
    budget = EventLogBudget(max_bytes=10_000, max_events=1000)
    budget.limit("small", 4000)
    budget.limit("big", 10**9)  # never past the budget's own cap
    assert [budget.add("small", seq, 3000) for seq in range(3)] == [None, 1, 2]
    assert [budget.add("big", seq, 3000) for seq in range(5)] == [None, None, None, 1, 2]


def test_a_requests_logs_share_one_budget() -> None:
    few = [CompletionJob(model="m", prompt="x") for _ in range(4)]
    limits.budget_request(few)
    assert {j.event_log_max_bytes for j in few} == {
        min(keys.EVENT_LOG_MAX_BYTES, limits.REQUEST_EVENT_LOG_MAX_BYTES // 4)}
    many = [CompletionJob(model="m", prompt="x") for _ in range(limits.MAX_PROMPTS)]
    limits.budget_request(many)
    assert {j.event_log_max_bytes for j in many} == {limits.JOB_EVENT_LOG_MIN_BYTES}
    assert len(many) * limits.JOB_EVENT_LOG_MIN_BYTES <= 2 * limits.REQUEST_EVENT_LOG_MAX_BYTES


def test_one_job_is_bounded_by_the_body_limit_alone() -> None:
    limits.check_request_bytes([CompletionJob(model="m",
                                              prompt="a" * (limits.MAX_REQUEST_JOB_BYTES + 1))])
