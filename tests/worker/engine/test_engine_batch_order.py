"""A round of repeated prompts is as fast as the first: the engine in-process on a tiny GGUF
wide enough that a graph computation costs more than the step's Python (about 3 ms a step)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from scheduler.contract.jobs import CompletionJob, SamplingParams, SamplingSettings
from tests.tiny_gguf import write_tiny_llama
from tests.worker.engine.test_engine_tiny import Events
from worker.engine.loop import Engine
from worker.engine.requests import EngineDefaults
from worker.runtime.model import ContextPlan, LoadedModel

pytestmark = pytest.mark.serial  # a speed comparison: alone (tests/lanes.py)

N_SLOTS = 8


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Engine, Events]]:
    path = write_tiny_llama(tmp_path_factory.mktemp("wide") / "wide-llama.gguf", n_embd=384,
                            n_layer=6, n_head=6, n_ff=1024)
    plan = ContextPlan(n_ctx=2048, n_slots=N_SLOTS, kv_unified=False, n_batch=512,
                       n_ubatch=512, n_threads=1, n_threads_batch=1, swa_full=True,
                       flash_attn="auto", cache_type_k="f16", cache_type_v="f16")
    model = LoadedModel(path, plan)
    events = Events()
    defaults = EngineDefaults(sampling=SamplingSettings(seed=1), n_predict=-1, n_keep=0,
                              cache_prompt=True, special=False, model_alias="wide",
                              worker_id="w-test")
    eng = Engine(model, defaults, events.sink)
    eng.start()
    yield eng, events
    eng.stop()
    model.close()


def test_a_round_of_repeated_prompts_is_as_fast_as_the_first(
        engine: tuple[Engine, Events]) -> None:
    """The same prompts again, arriving in the reverse order, find their slots' caches: the
    slots start in the order 7, 6, ..., 0. Without a unified KV cache llama.cpp puts only
    consecutive sequence ids in one ubatch, so a batch built in arrival order took one graph
    computation per slot and every step of the round got that much slower."""
    eng, events = engine
    prompts = [f"{word} once upon a time" for word in
               ("sky", "cat", "dog", "code", "json", "name", "value", "world")]

    def run(order: list[str]) -> float:
        jobs = [CompletionJob(model="wide", prompt=p, n_predict=32, stream=True,
                              sampling=SamplingParams(temperature=0.0, ignore_eos=True))
                for p in order]
        started = time.perf_counter()
        for j in jobs:
            eng.submit(eng.prepare(j))
        events.until_done([j.job_id for j in jobs])
        return time.perf_counter() - started

    run(prompts)  # the first round fills the slots (and their caches) in slot order
    in_order, reversed_order = [], []
    for _ in range(5):
        in_order.append(run(prompts))
        reversed_order.append(run(prompts[::-1]))
    # The fastest of each: other work on the machine only ever slows a round down.
    assert min(reversed_order) <= 1.15 * min(in_order), (in_order, reversed_order)
