"""What the api's events reader needs of a job held for a model with no live worker
(api/cold_start.py holds it; scheduler/job_events.py waits on it)."""

from __future__ import annotations

from typing import Protocol

from scheduler.contract.errors import LlamaqError


class Hold(Protocol):
    """A job held for a model that has no live worker (api/cold_start.py): it ends with
    `expired()` when no worker came by `deadline` (monotonic)."""

    deadline: float

    async def cold(self) -> bool:
        """Does the model still have no live worker (False ends the hold: the job waits in
        the queue as any other)?"""
        ...

    async def release(self) -> None:
        """The hold ended (an event came, a worker came, the request left)."""
        ...

    async def expired(self) -> LlamaqError:
        """No worker by the deadline: counted, and the request's error."""
        ...
