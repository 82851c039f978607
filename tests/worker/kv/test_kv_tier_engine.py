"""The fleet-wide KV tier's engine part (worker/kv/tier.py, worker/engine/loop.py), in-process on
Gemma 3 270M with its sliding-window cache kept small (no --swa-full): worker A's engine stops a
long prompt's prefill at the tier boundary and hands over the slot's state; worker B (its own
context, "another machine") restores it for a prompt with the same prefix and another question,
and answers exactly as a cold prefill does. A state that does not restore is a miss."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler.contract.jobs import CompletionJob, SamplingParams, SamplingSettings
from scheduler.contract.results import CompletionResult, ErrorEvent, FinalEvent
from worker.engine.loop import Engine, JobEvent
from worker.engine.requests import EngineDefaults
from worker.kv.snapshots import erase_slot
from worker.kv.tier import TierHit, TierPlan
from worker.runtime.model import ContextPlan, LoadedModel

TIMEOUT_S = 120
BOUNDARY = 512
DOCUMENT = " ".join(f"Item {i} of the inventory is a {['red', 'blue', 'green'][i % 3]} box."
                    for i in range(80))
GREEDY = SamplingParams(temperature=0.0)


class Worker:
    """One model context and its engine: one machine of the fleet."""

    def __init__(self, gemma: Path) -> None:
        plan = ContextPlan(n_ctx=4096, n_slots=2, kv_unified=False, n_batch=512, n_ubatch=512,
                           n_threads=2, n_threads_batch=2, swa_full=False, flash_attn="auto",
                           cache_type_k="f16", cache_type_v="f16")
        self.model = LoadedModel(gemma, plan)
        # no context checkpoints: they split a prefill's last chunks, and greedy text on this
        # model is compared across prefills split alike (the tier boundary's)
        defaults = EngineDefaults(sampling=SamplingSettings(seed=1), n_predict=-1, n_keep=0,
                                  cache_prompt=True, special=False, model_alias="gemma",
                                  worker_id="w", ctx_checkpoints=0)
        self.events: queue.Queue[JobEvent] = queue.Queue()
        self.engine = Engine(self.model, defaults, self._sink)
        self.states: list[tuple[list[int], bytes]] = []
        self.engine.on_tier_state = lambda tokens, data, salt: self.states.append((tokens, data))
        self.engine.start()

    def _sink(self, events: list[JobEvent]) -> None:
        for event in events:
            self.events.put(event)

    def run(self, question: str, tier: TierPlan | None = None) -> CompletionResult:
        job = CompletionJob(model="gemma", prompt=f"{DOCUMENT}\nQuestion: {question}\nAnswer:",
                            n_predict=16, sampling=GREEDY)
        request = self.engine.prepare(job)
        assert len(request.prompt_tokens) > BOUNDARY + 16
        request.tier = tier
        self.engine.submit(request)
        while True:
            _, event = self.events.get(timeout=TIMEOUT_S)
            if isinstance(event, FinalEvent):
                assert isinstance(event.result, CompletionResult)
                return event.result
            assert not isinstance(event, ErrorEvent), event

    def forget(self) -> None:
        """Every slot emptied: nothing of an earlier prompt is left in this context."""
        for slot in self.engine.slots:
            self.engine.run_on_slot(slot.slot_id, lambda s: erase_slot(self.model, s)).result(
                timeout=TIMEOUT_S)

    def close(self) -> None:
        self.engine.stop()
        self.model.close()


@pytest.fixture(scope="module")
def workers(gemma_path: Path) -> Iterator[tuple[Worker, Worker]]:
    a, b = Worker(gemma_path), Worker(gemma_path)
    yield a, b
    a.close()
    b.close()


def test_a_state_taken_on_one_worker_answers_on_another(workers: tuple[Worker, Worker]) -> None:
    a, b = workers
    first = a.run("How many boxes are red?", TierPlan(hit=None, save_at=BOUNDARY))
    assert len(a.states) == 1
    tokens, data = a.states[0]
    assert len(tokens) == BOUNDARY and data
    assert first.timings.prompt_n > BOUNDARY  # the prefill went on past the boundary

    cold = b.run("Which item is the last one?")
    b.forget()
    warm = b.run("Which item is the last one?", TierPlan(hit=TierHit(tokens, data), save_at=None))
    assert warm.timings.cache_n == BOUNDARY
    assert warm.content == cold.content
    assert warm.tokens == cold.tokens


def test_a_state_that_does_not_restore_is_a_miss(workers: tuple[Worker, Worker]) -> None:
    _, b = workers
    cold = b.run("Is item 7 blue?")
    b.forget()
    tokens = b.engine.prepare(CompletionJob(model="gemma", prompt=DOCUMENT)).prompt_tokens
    broken = TierHit(tokens[:BOUNDARY], b"not a llama.cpp state")
    missed = b.run("Is item 7 blue?", TierPlan(hit=broken, save_at=None))
    assert missed.timings.cache_n == 0
    assert missed.content == cold.content
