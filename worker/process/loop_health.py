"""How far a worker process's event loop lags, and what that allows (issue 44, overload): a
loop that falls behind its own work (more streams than its core carries, or a box starved of
CPU) delays every token of every job it runs, so it takes no more jobs until it catches up
(admission per worker), and a loop that stopped turning for good lets its leases go (the
lease keeper renews only while the loop turns, worker/process/lease_keeper.py).

Owns: the loop's tick (a timer every TICK_S on the loop: how late it fires is the lag) and
the admission rule. Hands off: where the rule is applied (worker/process/arq_worker.py
`WakeableWorker.admission`), the renewal (worker/process/lease_keeper.py).
"""

from __future__ import annotations

import asyncio
import logging
import time

log = logging.getLogger(__name__)

TICK_S = 0.05
"""The tick's period; the lag is how much later than this each tick comes."""
ADMIT_LAG_S = 0.1
"""A loop whose lag (smoothed) is past this takes no more jobs while it runs some. Chosen by
measurement (docs/scale.md "Overload, second pass"): an idle loop on the 2-core box at load
~6 lags 1–5 ms; one whose streams outgrow its core lags seconds."""
REFUSAL_LOG_EVERY_S = 10.0
DECAY = 0.7
"""The smoothed lag follows a later tick at once and an earlier one by 1 − DECAY a tick: a
loop lets work in again only after it kept up for a few ticks (~0.5 s from 1 s of lag)."""


class LoopHealth:
    """The lag of the loop `run` runs on (one per worker process: --sim-workers share it)."""

    def __init__(self) -> None:
        self.tick = time.monotonic()
        """When the loop last ticked (read from the lease keeper's thread: one float)."""
        self.lag_s = 0.0
        """The smoothed lateness of the ticks (s)."""
        self.refused = 0
        """Polls that took fewer jobs than they had room for because of the lag."""
        self._logged = (-REFUSAL_LOG_EVERY_S, 0)

    async def run(self) -> None:
        """Tick for the process's life."""
        while True:
            before = time.monotonic()
            self.tick = before
            await asyncio.sleep(TICK_S)
            self.observe(time.monotonic() - before - TICK_S)

    def observe(self, late_s: float) -> None:
        late_s = max(0.0, late_s)
        self.lag_s = late_s if late_s >= self.lag_s else \
            self.lag_s * DECAY + late_s * (1 - DECAY)

    def room(self, running: int) -> int | None:
        """How many more jobs a queue of this process that runs `running` may start now (None:
        no bound from the loop): none while the loop lags, except a first one (a worker that
        runs nothing always makes progress, however loaded its box)."""
        if self.lag_s <= ADMIT_LAG_S:
            return None
        self.refused += 1
        now = time.monotonic()
        if now - self._logged[0] >= REFUSAL_LOG_EVERY_S:
            log.warning("the event loop lags %.0f ms: taking no more jobs while it does (%d "
                        "polls held back in %.0f s)", self.lag_s * 1000,
                        self.refused - self._logged[1], now - self._logged[0])
            self._logged = (now, self.refused)
        return 0 if running else 1
