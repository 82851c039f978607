"""Preemption's pure rules (worker/process/preempt.py): whom a worker preempts (by priority;
`fair`: for a tenant below its share of the slots), and the flag."""

from __future__ import annotations

import pytest

from scheduler.contract.jobs import CompletionJob, JobKind
from worker.process.jobrun import Running
from worker.process.preempt import Waiting, fair_victim, victim_order
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


def test_the_flag_takes_off_priority_and_fair(capsys: pytest.CaptureFixture[str]) -> None:
    assert WorkerSettings.from_args([], environ={}).preempt == "priority"
    assert WorkerSettings.from_args(["--preempt", "off"], environ={}).preempt == "off"
    assert WorkerSettings.from_args(["--preempt", "fair"], environ={}).preempt == "fair"
    with pytest.raises(SystemExit):
        WorkerSettings.from_args(["--preempt", "always"], environ={})
    assert "--preempt" in capsys.readouterr().err


def held_by(tenant: str, started: float, priority: int = 0, weight: float = 1.0
            ) -> tuple[CompletionJob, Running]:
    job = CompletionJob(model="m", prompt="p", priority=priority, tenant=tenant, weight=weight)
    return job, Running(priority, 0, JobKind.COMPLETION, started)


def test_a_tenant_without_a_slot_takes_one_from_the_tenant_over_its_share() -> None:
    runs = [held_by("a", 1.0), held_by("a", 2.0), held_by("a", 3.0), held_by("b", 0.5)]
    victim = fair_victim(runs, 4, Waiting("c", 1.0, 0))
    assert victim is runs[2][0]  # a's latest: a holds 3 of 4 where its share is 4/3


def test_shares_settle_one_slot_each_and_then_nobody_is_preempted() -> None:
    runs = [held_by("a", float(started)) for started in range(4)]
    # a holds all 4 slots: b, c, d each take one in turn
    for tenant in "bcd":
        victim = fair_victim(runs, 4, Waiting(tenant, 1.0, 0))
        assert victim is not None and victim.tenant == "a"
        runs = [r for r in runs if r[0] is not victim] + [held_by(tenant, 10.0)]
    assert sorted(job.tenant or "" for job, _ in runs) == ["a", "b", "c", "d"]
    for tenant in "abcd":
        assert fair_victim(runs, 4, Waiting(tenant, 1.0, 0)) is None
    # a fifth tenant may take a slot (its share, 4/5, is not a whole one) only if a slot
    # holder stays within its share with one less: nobody holds more than 4/5 + 1
    assert fair_victim(runs, 4, Waiting("e", 1.0, 0)) is None


def test_two_tenants_do_not_take_a_slot_from_each_other_back_and_forth() -> None:
    runs = [held_by("a", 1.0), held_by("b", 2.0)]
    assert fair_victim(runs, 2, Waiting("a", 1.0, 0)) is None
    assert fair_victim(runs, 2, Waiting("b", 1.0, 0)) is None
    runs = [held_by("a", 1.0), held_by("a", 2.0), held_by("b", 3.0)]
    assert fair_victim(runs, 3, Waiting("b", 1.0, 0)) is None  # b at 1 of its 1.5


def test_weights_set_the_shares() -> None:
    runs = [held_by("a", 1.0, weight=3.0), held_by("a", 2.0, weight=3.0),
            held_by("a", 3.0, weight=3.0), held_by("b", 4.0)]
    assert fair_victim(runs, 4, Waiting("b", 1.0, 0)) is None  # b's share is 1 of 4
    assert fair_victim([*runs[:3], held_by("a", 5.0, weight=3.0)], 4,
                       Waiting("b", 1.0, 0)) is not None


def test_a_more_urgent_generation_is_never_taken_for_fairness() -> None:
    runs = [held_by("a", 1.0, priority=0), held_by("a", 2.0, priority=0)]
    assert fair_victim(runs, 2, Waiting("b", 1.0, 5)) is None
    runs = [held_by("a", 1.0, priority=5), held_by("a", 2.0, priority=0)]
    victim = fair_victim(runs, 2, Waiting("b", 1.0, 3))
    assert victim is runs[0][0]  # the priority 5 one, though it started first
