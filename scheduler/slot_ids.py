"""Fleet-wide slot ids: integers over the model's live workers, in registry order.

Worker k (ordered by start time) owns ids offset_k .. offset_k + n_slots_k - 1, where offset_k
is the sum of the slots of the workers before it. Ids shift when workers come and go, as slot
ids do when llama-server restarts with another -np."""

from __future__ import annotations

from scheduler.contract.errors import InvalidRequest
from scheduler.registry import WorkerInfo


def locate_slot(workers: list[WorkerInfo], slot_id: int) -> tuple[WorkerInfo, int]:
    """The worker holding fleet slot `slot_id`, and the slot's id on that worker."""
    offset = 0
    for worker in workers:
        if slot_id < offset + worker.n_slots:
            return worker, slot_id - offset
        offset += worker.n_slots
    raise InvalidRequest(f"Invalid id_slot {slot_id}: the fleet has {offset} slots")


def slot_offset(workers: list[WorkerInfo], worker_id: str) -> int:
    offset = 0
    for worker in workers:
        if worker.worker_id == worker_id:
            return offset
        offset += worker.n_slots
    return 0
