"""What other threads hand the engine thread: requests, cancellations (with their errors),
reasoning ends, slot actions, the stop. One condition guards it all; the engine thread holds
it only to take what was handed over, never across a llama.cpp call.

Decision jobs (worker/decisions/run.py) share the condition: their arrivals wake the engine too.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from scheduler.contract.errors import LlamaqError
from worker.engine.requests import Request
from worker.kv.slots import SlotCache

SlotResult = TypeVar("SlotResult")
SlotTask = tuple[int, Callable[[SlotCache], Any], Future[Any]]


class Inbox:
    def __init__(self) -> None:
        self.wake = threading.Condition()
        self.arrivals: deque[Request] = deque()
        """Submitted, not yet seen by the engine thread (guarded by `wake`)."""
        self.slot_tasks: deque[SlotTask] = deque()
        self.stopping = False
        self._cancelled: set[str] = set()
        self._cancel_errors: dict[str, LlamaqError] = {}
        self._end_reasoning: set[str] = set()

    # -- other threads --------------------------------------------------------------------

    def submit(self, request: Request) -> None:
        with self.wake:
            self.arrivals.append(request)
            self.wake.notify()

    def cancel(self, job_id: str, error: LlamaqError | None = None) -> None:
        with self.wake:
            self._cancelled.add(job_id)
            if error is not None:
                self._cancel_errors[job_id] = error
            self.wake.notify()

    def end_reasoning(self, job_id: str) -> None:
        with self.wake:
            self._end_reasoning.add(job_id)
            self.wake.notify()

    def run_on_slot(self, slot_id: int,
                    action: Callable[[SlotCache], SlotResult]) -> Future[SlotResult]:
        future: Future[SlotResult] = Future()
        with self.wake:
            self.slot_tasks.append((slot_id, action, future))
            self.wake.notify()
        return future

    def stop(self) -> bool:
        """Ask the engine thread to end; False when it was asked already."""
        with self.wake:
            if self.stopping:
                return False
            self.stopping = True
            self.wake.notify()
        return True

    def take_arrivals(self) -> list[Request]:
        with self.wake:
            arrivals, self.arrivals = self.arrivals, deque()
        return list(arrivals)

    # -- the engine thread ----------------------------------------------------------------

    def wait(self, idle: Callable[[], bool]) -> tuple[set[str], set[str]] | None:
        """Wait while `idle()` and nothing was handed over; then take the cancellations and
        reasoning ends (None: stop)."""
        with self.wake:
            while not self.stopping and idle() and not self.arrivals and not self.slot_tasks:
                self.wake.wait()
            if self.stopping:
                return None
            cancelled, self._cancelled = self._cancelled, set()
            end_reasoning, self._end_reasoning = self._end_reasoning, set()
        return cancelled, end_reasoning

    def take_marks(self) -> tuple[set[str], set[str]]:
        """The cancellations and reasoning ends, taken without waiting (the simulated engine,
        worker/simulate/engine.py, waits on its event loop instead)."""
        with self.wake:
            cancelled, self._cancelled = self._cancelled, set()
            end_reasoning, self._end_reasoning = self._end_reasoning, set()
        return cancelled, end_reasoning

    def take_slot_tasks(self, ready: Callable[[int], bool]) -> list[SlotTask]:
        """The slot actions whose slot is `ready` (idle) now; the others stay."""
        with self.wake:
            taken = [t for t in self.slot_tasks if ready(t[0])]
            for task in taken:
                self.slot_tasks.remove(task)
        return taken

    def cancel_error(self, job_id: str) -> LlamaqError | None:
        """The error a cancellation asked for, taken (None: the plain "cancelled")."""
        with self.wake:
            return self._cancel_errors.pop(job_id, None)
