"""Admission and the batch budget as plain state (as TGI's backends/v3 queue.rs `State`).

Owns: the queue of requests waiting for a slot, the choice of slot for each (worker/slots.py
`pick_slot`), the rules that hold a request back (no idle slot; continuous batching off while
anything runs; a twin of its prompt still being evaluated, whose cache it will copy), and how a
step's token budget (-b) is shared among prompts in prefill.
Does not own: llama.cpp (no KV-cache calls here: the engine starts a run on the slot it is
given), threads (the engine thread alone calls it; requests arrive through the engine's lock,
which is held only to hand them over).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from worker.slots import SlotCache, pick_slot


class Job(Protocol):
    @property
    def job_id(self) -> str: ...

    @property
    def id_slot(self) -> int: ...


class Waiting(Protocol):
    """What admission reads of a request."""

    @property
    def job(self) -> Job: ...

    @property
    def prompt_tokens(self) -> list[int]: ...

    @property
    def cache_prompt(self) -> bool: ...


W = TypeVar("W", bound=Waiting)


@dataclass
class Decision(Generic[W]):
    admitted: list[tuple[W, SlotCache]] = field(default_factory=list)
    """Requests to start now, each on its slot (marked busy)."""
    cancelled: list[W] = field(default_factory=list)
    """Requests cancelled while they waited: to be answered and dropped."""


@dataclass
class Admission(Generic[W]):
    waiting: deque[W] = field(default_factory=deque)

    def arrive(self, requests: Iterable[W]) -> None:
        self.waiting.extend(requests)

    def admit(self, slots: list[SlotCache], cancelled: set[str], running: int,
              prefilling: list[list[int]], cont_batching: bool = True) -> Decision[W]:
        """Which waiting requests start now, in arrival order. `running`: requests holding a
        slot; `prefilling`: the prompts of those still being evaluated (and, as requests are
        admitted, theirs)."""
        decision: Decision[W] = Decision()
        held: deque[W] = deque()
        twins = list(prefilling)
        while self.waiting and (cont_batching or not running):
            request = self.waiting.popleft()
            if request.job.job_id in cancelled:
                decision.cancelled.append(request)
                continue
            slot = pick_slot(slots, request.prompt_tokens, request.job.id_slot)
            if slot is None or (request.cache_prompt and request.prompt_tokens in twins):
                held.append(request)
                continue
            slot.busy = True
            twins.append(request.prompt_tokens)
            decision.admitted.append((request, slot))
        held.extend(self.waiting)  # left when continuous batching is off
        self.waiting = held
        return decision


def prompt_chunks(n_generating: int, prefilling: list[tuple[int, int]],
                  n_batch: int) -> list[int]:
    """A step's batch holds one token per generating run, then prompt tokens in admission
    order until `n_batch`. For each prefilling run, given as (tokens done, prompt length):
    where its prompt evaluation gets to in this step (== done: none of it this step)."""
    budget = n_batch - n_generating
    ends = []
    for done, total in prefilling:
        end = min(total, done + max(0, budget))
        budget -= end - done
        ends.append(end)
    return ends
