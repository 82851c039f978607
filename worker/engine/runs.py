"""The runs on the engine's slots: which run holds which slot, the run each slot held last, and
how a run ends (finished, cancelled, failed), its slot released.

Owns: `active` and `previous` (by slot id) and a run's last event. The engine thread's alone
(worker/engine/loop.py); the slots' report reads them (worker/engine/slots_report.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from scheduler.contract.errors import LlamaqError, ServerError, Unavailable
from scheduler.contract.results import ErrorEvent, FinalEvent, StartedEvent, TokenEvent
from scheduler.registry import WorkerMetrics
from worker.adapters.adapter_sets import AdapterSets
from worker.engine import slots_report
from worker.engine.slot_run import SlotRun
from worker.engine.stopping import StopType
from worker.engine.verify import Speculation
from worker.kv import moves as kv_moves

log = logging.getLogger(__name__)

JobEvent = tuple[str, TokenEvent | FinalEvent | ErrorEvent | StartedEvent]
CancelError = Callable[[str], LlamaqError | None]
"""The error a cancelled job ends with, when its canceller gave one (worker/engine/inbox.py)."""


class SlotRuns:
    def __init__(self, kv: kv_moves.LlamaKv, sets: AdapterSets, spec: Speculation | None,
                 reports: slots_report.RunReports, metrics: WorkerMetrics,
                 cancel_error: CancelError, slots_changed: Callable[[], None]) -> None:
        self.active: dict[int, SlotRun] = {}
        self.previous: dict[int, SlotRun] = {}
        self._kv = kv
        self._sets = sets
        self._spec = spec
        self._reports = reports
        self._metrics = metrics
        self._cancel_error = cancel_error
        self._slots_changed = slots_changed

    def prefilling(self) -> list[tuple[str | None, list[int]]]:
        """The cache salts and prompts of the runs still evaluating their prompt (admission's
        twins)."""
        return [(a.request.job.cache_salt, a.request.prompt_tokens)
                for a in self.active.values() if a.prefilling]

    def finish(self, active: SlotRun, stop_type: StopType, now: float,
               events: list[JobEvent]) -> None:
        result = self._reports.result(active, stop_type, now)
        slots_report.count(self._metrics, result.timings, len(active.slot.tokens))
        events.append((active.request.job.job_id, FinalEvent(result=result)))
        self.release(active)

    def cancel_event(self, job_id: str) -> ErrorEvent:
        error = self._cancel_error(job_id)
        return cancelled_event() if error is None else ErrorEvent(error=error.to_info())

    def release(self, active: SlotRun) -> None:
        if active.request.alora is not None:
            self._sets.end_alora(self._kv, active.slot, active.request.alora)
        self.previous[active.slot.slot_id] = active
        active.request.sampler.free()
        if self._spec is not None:
            self._spec.end(active, self._metrics)
        active.slot.busy = False
        active.slot.last_used = time.monotonic()
        del self.active[active.slot.slot_id]
        self._slots_changed()  # once freed: what it tells reads the engine's state

    def fail_one(self, active: SlotRun, error: Exception, events: list[JobEvent]) -> None:
        job_id = active.request.job.job_id
        log.exception("job %s: failed on slot %d", job_id, active.slot.slot_id, exc_info=error)
        info = (error if isinstance(error, LlamaqError)
                else ServerError(f"internal error: {type(error).__name__}")).to_info()
        events.append((job_id, ErrorEvent(error=info)))
        if active.slot.slot_id in self.active:
            self.release(active)

    def fail_all(self, error: LlamaqError, events: list[JobEvent]) -> None:
        """Every run ends with `error`, its slot's cache cleared (a decode that failed)."""
        for active in list(self.active.values()):
            events.append((active.request.job.job_id, ErrorEvent(error=error.to_info())))
            kv_moves.clear(self._kv, active.slot)
            self.release(active)


def cancelled_event() -> ErrorEvent:
    return ErrorEvent(error=Unavailable("the request was cancelled").to_info())
