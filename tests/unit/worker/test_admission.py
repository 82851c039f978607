"""Admission and the batch budget (worker/engine/admission.py) as plain state, as TGI tests its
queue."""

from __future__ import annotations

from dataclasses import dataclass, field

from worker.engine.admission import (
    BACKGROUND_MIN_TOKENS,
    BACKGROUND_STEP_S,
    Admission,
    DecodeSpeed,
    prompt_chunks,
    whole_prompts,
)
from worker.kv.slots import SlotCache


@dataclass(frozen=True)
class FakeJob:
    job_id: str
    id_slot: int = -1
    priority: int | None = None
    cache_salt: str | None = None


@dataclass
class Req:
    job: FakeJob
    prompt_tokens: list[int] = field(default_factory=lambda: [1, 2, 3])
    cache_prompt: bool = True


def req(job_id: str, prompt: list[int] | None = None, id_slot: int = -1,
        cache_prompt: bool = True, priority: int | None = None) -> Req:
    return Req(FakeJob(job_id, id_slot, priority),
               prompt or [1, int.from_bytes(job_id.encode())], cache_prompt)


def test_admits_in_order_while_slots_are_idle() -> None:
    slots = [SlotCache(0), SlotCache(1)]
    queue: Admission[Req] = Admission()
    queue.arrive([req("a"), req("b"), req("c")])
    decision = queue.admit(slots, set(), running=0, prefilling=[])
    assert [(r.job.job_id, s.slot_id) for r, s in decision.admitted] in (
        [("a", 0), ("b", 1)], [("a", 1), ("b", 0)])
    assert all(s.busy for s in slots)
    assert [r.job.job_id for r in queue.waiting] == ["c"]
    assert queue.admit(slots, set(), running=2, prefilling=[]).admitted == []
    slots[0].busy = False
    assert [r.job.job_id for r, _ in queue.admit(slots, set(), 1, []).admitted] == ["c"]
    assert not queue.waiting


def test_admits_by_priority_then_arrival() -> None:
    """A request of a lower priority value waits less, whenever it arrived; equal ones keep
    their arrival order (None is 0)."""
    slots = [SlotCache(0, busy=True)]
    queue: Admission[Req] = Admission()
    queue.arrive([req("a", priority=10), req("b", priority=10), req("c")])
    queue.arrive([req("d", priority=10), req("e", priority=-1), req("f", priority=0)])
    assert queue.admit(slots, set(), 1, []).admitted == []
    assert [r.job.job_id for r in queue.waiting] == ["e", "c", "f", "a", "b", "d"]
    slots[0].busy = False
    assert [r.job.job_id for r, _ in queue.admit(slots, set(), 0, []).admitted] == ["e"]


def test_prefers_the_slot_that_holds_the_prompt() -> None:
    slots = [SlotCache(0, tokens=[9, 9]), SlotCache(1, tokens=[5, 6, 7])]
    queue: Admission[Req] = Admission()
    queue.arrive([req("a", [5, 6, 8])])
    (_, slot), = queue.admit(slots, set(), 0, []).admitted
    assert slot.slot_id == 1


def test_a_requested_slot_waits_until_it_is_idle() -> None:
    slots = [SlotCache(0, busy=True), SlotCache(1)]
    queue: Admission[Req] = Admission()
    queue.arrive([req("a", id_slot=0), req("b")])
    decision = queue.admit(slots, set(), 1, [])
    assert [(r.job.job_id, s.slot_id) for r, s in decision.admitted] == [("b", 1)]
    assert [r.job.job_id for r in queue.waiting] == ["a"]  # b went ahead: a waits its slot


def test_cancelled_requests_leave_the_queue() -> None:
    queue: Admission[Req] = Admission()
    queue.arrive([req("a"), req("b")])
    decision = queue.admit([SlotCache(0)], {"a"}, 0, [])
    assert [r.job.job_id for r in decision.cancelled] == ["a"]
    assert [r.job.job_id for r, _ in decision.admitted] == ["b"]


def test_a_twin_waits_for_the_prompt_being_evaluated() -> None:
    slots = [SlotCache(0), SlotCache(1), SlotCache(2)]
    queue: Admission[Req] = Admission()
    queue.arrive([req("a", [1, 2, 3]), req("b", [1, 2, 3]),
                  req("c", [1, 2, 3], cache_prompt=False)])
    decision = queue.admit(slots, set(), 0, [])
    assert [r.job.job_id for r, _ in decision.admitted] == ["a", "c"]
    assert [r.job.job_id for r in queue.waiting] == ["b"]
    assert queue.admit(slots, set(), 2, [(None, [1, 2, 3])]).admitted == []  # a evaluating
    assert [r.job.job_id for r, _ in queue.admit(slots, set(), 2, []).admitted] == ["b"]


def test_another_tenants_prompt_is_no_twin() -> None:
    """Under --tenants a request does not wait for another tenant group's same prompt (it
    could not copy that cache, and its wait would tell it the prompt is being evaluated)."""
    slots = [SlotCache(0), SlotCache(1)]
    queue: Admission[Req] = Admission()
    queue.arrive([Req(FakeJob("b", cache_salt="bob"), [1, 2, 3])])
    admitted = queue.admit(slots, set(), 1, [("alice", [1, 2, 3])]).admitted
    assert [r.job.job_id for r, _ in admitted] == ["b"]
    queue.arrive([Req(FakeJob("c", cache_salt="alice"), [1, 2, 3])])
    assert queue.admit(slots, set(), 2, [("alice", [1, 2, 3])]).admitted == []


def test_without_continuous_batching_nothing_joins_a_running_batch() -> None:
    queue: Admission[Req] = Admission()
    queue.arrive([req("a"), req("b")])
    slots = [SlotCache(0), SlotCache(1), SlotCache(2)]
    assert queue.admit(slots, set(), 1, [], cont_batching=False).admitted == []
    assert len(queue.waiting) == 2
    assert len(queue.admit(slots, set(), 0, [], cont_batching=False).admitted) == 2


def test_prompt_chunks_share_the_batch_in_order() -> None:
    assert prompt_chunks(0, [(0, 10)], 16) == [10]
    assert prompt_chunks(2, [(0, 10), (0, 10)], 16) == [10, 4]
    assert prompt_chunks(4, [(3, 10), (0, 10)], 8) == [7, 0]
    assert prompt_chunks(8, [(0, 10)], 8) == [0]
    assert prompt_chunks(0, [], 8) == []


def test_whole_prompts_go_in_order_while_sequences_and_tokens_fit() -> None:
    assert whole_prompts([3, 4, 2, 1], n_seqs=8, n_batch=8) == 2  # 3 + 4, then 2 is over
    assert whole_prompts([1, 1, 1], n_seqs=2, n_batch=512) == 2
    assert whole_prompts([8], 4, 8) == 1 and whole_prompts([9, 1], 4, 8) == 0
    assert whole_prompts([], 4, 8) == 0
    assert whole_prompts(iter([2, 9, 1]), 4, 8) == 1  # a later small one does not jump ahead


def test_decode_speed_sizes_a_batch_lines_prompt_part() -> None:
    speed = DecodeSpeed()
    assert speed.background_prompt_tokens(512) == 512  # nothing measured: no cap
    speed.add(0.5, 4)  # too few tokens to measure
    assert speed.background_prompt_tokens(512) == 512
    speed.add(BACKGROUND_STEP_S, 20)  # 20 tokens per BACKGROUND_STEP_S
    assert speed.background_prompt_tokens(512) == 20
    speed.add(1.0, 10)  # slower: the average moves, never below the minimum
    assert speed.background_prompt_tokens(512) == BACKGROUND_MIN_TOKENS
