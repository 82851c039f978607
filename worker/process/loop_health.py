"""How far a worker process's event loop lags, and what that allows (issue 44, overload): a
loop that falls behind its own work (more streams than its core carries, or a box starved of
CPU) delays every token of every job it runs, so it takes no more jobs until it catches up
(admission per worker), and a loop that stopped turning for good lets its leases go (the
lease keeper renews only while the loop turns, worker/process/lease_keeper.py).

Owns: the admission rule (the lag: scheduler/loop_lag.py). Hands off: where the rule is
applied (worker/process/arq_worker.py `WakeableWorker.admission`), the renewal
(worker/process/lease_keeper.py).
"""

from __future__ import annotations

import logging
import time

from scheduler.loop_lag import LoopLag

log = logging.getLogger(__name__)

ADMIT_LAG_S = 0.1
"""The lag (smoothed) past which a loop took no more jobs while it ran some in the overload
measurements: two inter-token gaps of a 50 ms stream (docs/scale.md "Overload, second pass").
Workers use --admit-lag-ms (0, off, by default: on a box short of CPU a real engine's loop
lags too, and the rule then started a worker's jobs one by one, not batched together)."""
REFUSAL_LOG_EVERY_S = 10.0


class LoopHealth(LoopLag):
    """The lag of the worker process's loop (one per process: --sim-workers share it) and
    the admission rule."""

    def __init__(self, admit_lag_s: float = ADMIT_LAG_S) -> None:
        """`admit_lag_s`: the lag past which no more jobs start (0: no bound)."""
        super().__init__()
        self.admit_lag_s = admit_lag_s
        self.refused = 0
        """Polls that took fewer jobs than they had room for because of the lag."""
        self._logged = (-REFUSAL_LOG_EVERY_S, 0)

    def room(self, running: int) -> int | None:
        """How many more jobs a queue of this process that runs `running` may start now (None:
        no bound from the loop): none while the loop lags, except a first one (a worker that
        runs nothing always makes progress, however loaded its box)."""
        if self.admit_lag_s <= 0 or self.lag_s <= self.admit_lag_s:
            return None
        self.refused += 1
        now = time.monotonic()
        if now - self._logged[0] >= REFUSAL_LOG_EVERY_S:
            log.warning("the event loop lags %.0f ms: taking no more jobs while it does (%d "
                        "polls held back in %.0f s)", self.lag_s * 1000,
                        self.refused - self._logged[1], now - self._logged[0])
            self._logged = (now, self.refused)
        return 0 if running else 1
