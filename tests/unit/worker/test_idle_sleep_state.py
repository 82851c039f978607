"""Idle sleep as plain state: the idle clock (worker/process/sleep.py) and the fleet's sleeping
state that /props `is_sleeping` and the /models status read (scheduler/registry.py)."""

from __future__ import annotations

from scheduler.registry import WorkerInfo, fleet_sleeping
from worker.process.sleep import IdleClock


class FakeTime:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_the_clock_is_due_after_the_idle_time_with_no_job_running() -> None:
    now = FakeTime()
    clock = IdleClock(5, now)
    assert not clock.due() and clock.left() == 5
    now.t += 5
    assert clock.due()
    clock.begin()
    now.t += 60
    assert not clock.due()  # a long job is not idleness
    clock.end()
    assert not clock.due() and clock.left() == 5  # the idle time counts from its end
    now.t += 4.9
    assert not clock.due()
    now.t += 0.1
    assert clock.due()


def test_overlapping_jobs_keep_the_worker_awake_until_the_last_ends() -> None:
    now = FakeTime()
    clock = IdleClock(1, now)
    clock.begin()
    clock.begin()
    clock.end()
    now.t += 10
    assert not clock.due()
    clock.end()
    now.t += 1
    assert clock.due()


def test_disabled_never_sleeps() -> None:
    now = FakeTime()
    clock = IdleClock(-1, now)
    now.t += 1e9
    assert not clock.due()


def test_the_model_sleeps_only_when_every_worker_sleeps() -> None:
    """`fleet_sleeping`, which /props `is_sleeping` and the /models status read."""

    def worker(worker_id: str, sleeping: bool) -> WorkerInfo:
        return WorkerInfo.model_validate({
            "worker_id": worker_id, "model_id": "m", "model_path": "m.gguf", "n_slots": 1,
            "n_ctx_slot": 512, "started_at": 0.0, "sleeping": sleeping,
            "meta": {"vocab_type": 1, "n_vocab": 10, "n_ctx_train": 512, "n_embd": 8,
                     "n_params": 1, "size": 1},
            "default_settings": {"n_predict": -1, "stop": [], "stream": False,
                                 "timings_per_token": False, "n_keep": 0, "n_ctx": 512,
                                 "model": "m", "max_tokens": -1}})

    assert not fleet_sleeping([])
    assert fleet_sleeping([worker("a", True), worker("b", True)])
    assert not fleet_sleeping([worker("a", True), worker("b", False)])
