"""The compute thread count as plain state: fewer threads while other processes want the
cores, the configured ones again once they leave room."""

from __future__ import annotations

from worker.runtime.compute_threads import (
    INTERVAL_S,
    ComputeThreads,
    CpuSample,
    wait_policy_by_hand,
)


def feed(threads: ComputeThreads, others_cores: float, own_cores: float = 2.0,
         seconds: float = 1.0) -> bool:
    """One interval in which other processes used `others_cores` and we `own_cores`."""
    last = threads.last or CpuSample(0.0, 0.0, 0.0)
    busy = last.machine_busy_s + (others_cores + own_cores) * seconds
    return threads.observe(CpuSample(busy, last.own_s + own_cores * seconds,
                                     last.at_s + seconds))


def started(configured: int = 2, batch: int = 2, cores: int = 2) -> ComputeThreads:
    threads = ComputeThreads(configured, batch, cores)
    threads.observe(CpuSample(0.0, 0.0, 0.0))
    return threads


def test_a_quiet_machine_keeps_the_configured_threads() -> None:
    threads = started()
    assert not feed(threads, others_cores=0.1)
    assert not feed(threads, others_cores=0.5)  # the api, Redis and clients, in bursts
    assert threads.threads() == (2, 2)


def test_a_busy_loop_beside_drops_to_one_thread_and_its_end_brings_two_back() -> None:
    threads = started()
    assert feed(threads, others_cores=1.0)
    assert threads.threads() == (1, 1)
    assert not feed(threads, others_cores=1.0, own_cores=1.0)  # still busy: stays at one
    assert feed(threads, others_cores=0.05, own_cores=1.0)
    assert threads.threads() == (2, 2)


def test_a_big_box_gives_up_only_the_cores_others_take() -> None:
    threads = started(configured=16, batch=8, cores=16)
    assert feed(threads, others_cores=3.0, own_cores=16.0)
    assert threads.threads() == (13, 8)
    assert feed(threads, others_cores=15.5, own_cores=13.0)
    assert threads.threads() == (1, 1)


def test_the_first_sample_and_samples_in_between_change_nothing() -> None:
    threads = ComputeThreads(2, 2, 2)
    assert threads.due(0.0)
    assert not threads.observe(CpuSample(100.0, 0.0, 0.0))  # nothing to compare with yet
    assert not threads.due(INTERVAL_S / 2)
    assert threads.due(INTERVAL_S)
    assert not threads.observe(None)  # no /proc
    assert threads.threads() == (2, 2)


def test_a_hand_set_wait_policy_turns_it_off() -> None:
    assert wait_policy_by_hand({"OMP_WAIT_POLICY": "PASSIVE"})
    assert wait_policy_by_hand({"GOMP_SPINCOUNT": "10000"})
    assert not wait_policy_by_hand({"PATH": "/bin"})


def test_a_real_sample_reads_this_machine() -> None:
    sample = CpuSample.read(1.0)
    assert sample is not None and sample.machine_busy_s > 0 and sample.own_s >= 0
