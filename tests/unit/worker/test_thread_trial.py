"""The embedder's thread count chosen by trying (worker/runtime/thread_trial.py), on a simulated
machine: seconds per token for each thread count, a clock that advances by each decode."""

from __future__ import annotations

from collections.abc import Callable

from worker.runtime.thread_trial import LONGEST_WAIT_S, ThreadTrial

TOKENS = 40
"""Tokens a decode (about 4 short texts)."""


def run(trial: ThreadTrial, per_token: Callable[[int], float], seconds: float,
        start_s: float = 0.0, others_cores: float = 0.3) -> tuple[float, dict[int, float]]:
    """Decode for `seconds` of simulated time while other processes use `others_cores` (read
    every half second); (the end time, decode time spent per count)."""
    now, spent, sampled = start_s, {1: 0.0, 2: 0.0}, start_s
    while now < start_s + seconds:
        if now - sampled >= 0.5:
            trial.observe_load(others_cores)
            sampled = now
        threads = trial.current
        took = TOKENS * per_token(threads)
        now += took
        spent[threads] += took
        trial.record(TOKENS, took, now)
    return now, spent


def quiet(threads: int) -> float:
    return {1: 1.6e-3, 2: 1e-3}[threads]


def beside_a_hog(threads: int) -> float:
    return {1: 1.7e-3, 2: 30e-3}[threads]


def test_a_quiet_machine_keeps_every_thread_and_tries_one_less_rarely() -> None:
    trial = ThreadTrial(2)
    _, spent = run(trial, quiet, 120.0)
    assert trial.kept == 2
    assert spent[1] / (spent[1] + spent[2]) < 0.02
    assert trial.trials <= 120 / LONGEST_WAIT_S + 5


def test_a_hog_drops_a_thread_after_one_slow_decode_and_its_end_gives_it_back() -> None:
    trial = ThreadTrial(2)
    now, _ = run(trial, quiet, 10.0)
    assert trial.kept == 2
    now, _ = run(trial, beside_a_hog, 1.5, now, others_cores=1.3)  # one collapsed decode: 1.2 s
    assert trial.kept == 1
    now, spent = run(trial, beside_a_hog, 120.0, now, others_cores=1.3)
    assert trial.kept == 1
    assert spent[2] / 120.0 < 0.05, "the collapsed count was tried too long"
    now, _ = run(trial, quiet, 3.0, now, others_cores=0.3)  # the hog ended
    assert trial.kept == 2


def test_one_thread_configured_never_changes() -> None:
    trial = ThreadTrial(1)
    assert all(trial.record(TOKENS, 1.0, float(t)) is None for t in range(100))
    assert trial.current == 1


def test_a_count_that_is_not_clearly_faster_is_not_taken() -> None:
    trial = ThreadTrial(2)
    run(trial, lambda threads: {1: 1.02e-3, 2: 1e-3}[threads], 60.0)
    assert trial.kept == 2


def test_a_noisy_single_thread_beside_a_hog_does_not_keep_trying_the_collapsed_count() -> None:
    decodes = iter(range(10**9))

    def noisy_beside_a_hog(threads: int) -> float:
        return 30e-3 if threads == 2 else (1.7e-3 if next(decodes) % 7 else 5e-3)

    trial = ThreadTrial(2)
    now, _ = run(trial, beside_a_hog, 6.0, others_cores=1.3)  # started beside it: 3 decodes
    assert trial.kept == 1
    _, spent = run(trial, noisy_beside_a_hog, 120.0, now, others_cores=1.3)
    assert trial.kept == 1
    assert spent[2] / 120.0 < 0.05
