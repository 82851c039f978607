"""How long a batch whose driver run failed waits before the next run."""

from __future__ import annotations

from scheduler.batches import MAX_FAILED_RUNS, RETRY_MAX_S, retry_delay_s


def test_a_failed_batch_run_waits_longer_each_time_up_to_a_cap() -> None:
    delays = [retry_delay_s(n) for n in range(1, MAX_FAILED_RUNS)]
    assert delays[:3] == [5.0, 10.0, 20.0]
    assert delays == sorted(delays) and max(delays) == RETRY_MAX_S
    assert 10 * 60 <= sum(delays) <= 60 * 60  # minutes of outage, not seconds, then failed
