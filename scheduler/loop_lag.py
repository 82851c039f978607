"""How far an event loop lags (issue 44, overload): a timer every TICK_S on the loop, and how
late it fires. A worker's loop that lags takes no more jobs (worker/process/loop_health.py),
and the lease keeper renews only while it ticks (worker/process/lease_keeper.py).

Owns: the tick and the smoothed lag. Does not own: what each side does with it."""

from __future__ import annotations

import asyncio
import time

TICK_S = 0.05
"""The tick's period; the lag is how much later than this each tick comes."""
DECAY = 0.7
"""The smoothed lag follows a later tick at once and an earlier one by 1 − DECAY a tick: a
loop lets work in again only after it kept up for a few ticks (~0.5 s from 1 s of lag)."""


class LoopLag:
    """The lag of the loop `run` runs on."""

    def __init__(self) -> None:
        self.tick = time.monotonic()
        """When the loop last ticked (may be read from another thread: one float)."""
        self.lag_s = 0.0
        """The smoothed lateness of the ticks (s)."""

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
