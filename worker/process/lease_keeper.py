"""Lease renewal that a busy worker cannot miss (issue 44, overload): a thread of the worker
process with its own Redis connection renews the leases of all the process's workers every
LEASE_RENEW_EVERY_S, whatever waits on the event loop. Renewed from the loop, as before, a
worker whose streams outgrew its core (its loop seconds behind) let its leases lapse while it
generated on: the api moved live jobs to other workers as starved, and the fleet thrashed
(docs/scale.md "Collapse past saturation").

The promise it keeps: a lease lapses when its worker's process stops (killed, frozen: SIGSTOP,
swapped out, a vanished machine) or when its event loop has not turned for LOOP_STUCK_S (a
loop stuck for good must not hold its jobs forever), not because the loop is behind. A lease
that lapsed is never renewed again (scheduler/lua_leases.py RENEW renews only the leases
whose owner is still this worker), and what was lost is told on the loop.

Owns: the renewal thread and its connection. Hands off: which leases a worker holds and what a
renewal's answer means (scheduler/leases.py Leases), the loop's tick (worker/process/
loop_health.py), what a lost lease stops (the `on_lost` of `keep`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

from redis.exceptions import RedisError

from scheduler.connections import open_sync_redis
from scheduler.contract import keys
from scheduler.leases import Leases
from scheduler.lua_leases import renew_script
from worker.process.loop_health import LoopHealth

log = logging.getLogger(__name__)

REDIS_RETRY_S = 1.0
LOOP_STUCK_S = 30.0
"""A worker whose event loop has not turned for this long stops renewing its leases (a loop
stuck for good must not hold its jobs forever); one that is only behind keeps them."""

Lost = Callable[[list[str]], None]
"""Told on the event loop of the jobs whose leases a worker lost."""


class LeaseKeeper:
    """The renewal thread of one worker process: `start` on its event loop, `keep` each
    worker's leases, `stop` at the end."""

    def __init__(self, redis_url: str, health: LoopHealth,
                 every_s: float = keys.LEASE_RENEW_EVERY_S,
                 stuck_s: float = LOOP_STUCK_S) -> None:
        self._url = redis_url
        self.health = health
        self._every_s = every_s
        self._stuck_s = stuck_s
        self._kept: dict[int, tuple[Leases, Lost]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._ticking: asyncio.Task[None] | None = None
        self.renewals = 0
        """Renewal rounds the thread completed (for tests and logs)."""

    def start(self) -> None:
        """On the event loop: its tick, and the thread."""
        self._loop = asyncio.get_running_loop()
        self._ticking = asyncio.create_task(self.health.run())
        self._thread = threading.Thread(target=self._renew_forever, name="lease-keeper",
                                        daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stopping.set()
        if self._ticking is not None:
            self._ticking.cancel()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, REDIS_RETRY_S + 6)

    async def __aenter__(self) -> LeaseKeeper:
        self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()

    def keep(self, leases: Leases, on_lost: Lost) -> None:
        """Renew `leases` from now on; `on_lost` hears of those lost (on the loop)."""
        self._kept[id(leases)] = (leases, on_lost)

    def forget(self, leases: Leases) -> None:
        self._kept.pop(id(leases), None)

    def _renew_forever(self) -> None:
        redis = open_sync_redis(self._url)
        script = redis.register_script(renew_script())
        try:
            while not self._stopping.wait(self._every_s):
                stuck_s = time.monotonic() - self.health.tick
                if stuck_s > self._stuck_s:
                    log.error("the event loop has not turned for %.0f s: leases not renewed "
                              "(they lapse, and their jobs go on elsewhere)", stuck_s)
                    continue
                began = time.monotonic()
                try:
                    self._renew_all(script)
                    took_s = time.monotonic() - began
                    if took_s > self._every_s:
                        log.warning("a lease renewal took %.1f s", took_s)
                except RedisError as error:  # Redis away: keep trying, the worker lives on
                    log.warning("cannot renew leases (%s); retrying", error)
                    self._stopping.wait(REDIS_RETRY_S)
        finally:
            redis.close()

    def _renew_all(self, script: Callable[..., list[bytes]]) -> None:
        for leases, on_lost in list(self._kept.values()):
            args = leases.to_renew()
            if not args:
                continue
            lost = script(args=args)
            if lost and self._loop is not None:
                try:
                    self._loop.call_soon_threadsafe(_tell, leases, on_lost, lost)
                except RuntimeError:  # the loop closed: the process ends
                    return
        self.renewals += 1


def _tell(leases: Leases, on_lost: Lost, lost: list[bytes]) -> None:
    if jobs := leases.renewed(lost):
        on_lost(jobs)
