"""Admission and the batch budget as plain state (as TGI's backends/v3 queue.rs `State`).

Owns: the queue of requests waiting for a slot, the choice of slot for each (worker/kv/slots.py
`pick_slot`), the rules that hold a request back (no idle slot; continuous batching off while
anything runs; a twin of its prompt still being evaluated, whose cache it will copy), and how a
step's token budget (-b) is shared among prompts in prefill (split, `prompt_chunks`) or taken
by prompts that go whole (`whole_prompts`: the embedder's).
Does not own: llama.cpp (no KV-cache calls here: the engine starts a run on the slot it is
given), threads (the engine thread alone calls it; requests arrive through the engine's lock,
which is held only to hand them over).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from typing import Generic, Protocol, TypeVar

from worker.kv.slots import SIMILARITY, SlotCache, pick_slot


class Job(Protocol):
    @property
    def job_id(self) -> str: ...

    @property
    def id_slot(self) -> int: ...

    @property
    def priority(self) -> int | None: ...

    @property
    def cache_salt(self) -> str | None: ...


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
        """Waiting requests are kept by priority (lower first), then in arrival order."""
        arrived = list(requests)
        if not arrived:
            return
        self.waiting.extend(arrived)
        if any(r.job.priority for r in self.waiting):
            self.waiting = deque(sorted(self.waiting, key=lambda r: r.job.priority or 0))

    def admit(self, slots: list[SlotCache], cancelled: set[str], running: int,
              prefilling: list[tuple[str | None, list[int]]], cont_batching: bool = True,
              beside_busy: bool = False, similarity: float = SIMILARITY,
              usable: Callable[[W, SlotCache], bool] = lambda _, __: True) -> Decision[W]:
        """Which waiting requests start now, by priority, then in arrival order. `running`:
        requests holding a slot; `prefilling`: the cache salts and prompts of those still being
        evaluated (and, as requests are admitted, theirs: a twin is one of the same salt, whose
        cache it may copy); `beside_busy`, `similarity`, `usable` (per request): see pick_slot."""
        decision: Decision[W] = Decision()
        held: deque[W] = deque()
        twins = list(prefilling)
        while self.waiting and (cont_batching or not running):
            request = self.waiting.popleft()
            if request.job.job_id in cancelled:
                decision.cancelled.append(request)
                continue
            slot = pick_slot(slots, request.prompt_tokens, request.job.id_slot, beside_busy,
                             similarity, partial(usable, request))
            twin = (request.job.cache_salt, request.prompt_tokens)
            if slot is None or (request.cache_prompt and twin in twins):
                held.append(request)
                continue
            slot.busy = True
            twins.append(twin)
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


def whole_prompts(sizes: Iterable[int], n_seqs: int, n_batch: int) -> int:
    """Prompts that cannot be split (embeddings: each is decoded whole in one batch, as
    llama-server's non-causal prompts): how many of `sizes`, taken from the front in order,
    go into one step of at most `n_seqs` sequences and `n_batch` tokens."""
    taken = n_tokens = 0
    for size in sizes:
        if taken == n_seqs or n_tokens + size > n_batch:
            break
        taken += 1
        n_tokens += size
    return taken


BACKGROUND_STEP_S = 0.05
"""A step takes about this long at most of batch lines' prompt tokens (at the measured decode
speed), so that an online request arriving meanwhile waits that little for its turn."""
BACKGROUND_MIN_TOKENS = 8
SPEED_SAMPLE_TOKENS = 8
"""Decodes of at least this many tokens measure the decode speed (seconds per token)."""


class DecodeSpeed:
    """Decode seconds per token, a moving average over decodes of SPEED_SAMPLE_TOKENS or more,
    and what it allows batch lines' prompts in one step."""

    def __init__(self) -> None:
        self.s_per_token = 0.0
        """0 until the first measure."""

    def add(self, seconds: float, n_tokens: int) -> None:
        if n_tokens >= SPEED_SAMPLE_TOKENS:
            per_token = seconds / n_tokens
            self.s_per_token = (0.8 * self.s_per_token + 0.2 * per_token if self.s_per_token
                                else per_token)

    def background_prompt_tokens(self, n_batch: int) -> int:
        """Batch lines' prompt tokens in one step: about BACKGROUND_STEP_S of decoding (all of
        n_batch until the speed is measured)."""
        if not self.s_per_token:
            return n_batch
        return max(BACKGROUND_MIN_TOKENS, int(BACKGROUND_STEP_S / self.s_per_token))
