"""The host-memory prompt cache on Gemma 3 270M (issue 24 part 3): prompts A, B, C rotated
on one slot. With --cache-ram, A's second run finds its state in host memory (cache_n is its
prefix), without it A is prefilled again; the size bound holds; the restored state gives the
next token that decoding the prompt again gives."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.worker.kv_engine import complete, document, plan, running, same_next_token
from worker.kv.prompt_cache import MIB
from worker.runtime.model import LoadedModel


@pytest.fixture(scope="module")
def gemma(gemma_path: Path) -> Iterator[LoadedModel]:
    model = LoadedModel(gemma_path, plan(4096, 1))
    yield model
    model.close()


PROMPTS = [document(seed, 120) for seed in (11, 12, 13)]
HEAD = 8
"""The documents share their first few tokens ("<bos>Document 1")."""


def test_a_rotated_prompt_comes_back_from_host_memory(gemma: LoadedModel) -> None:
    a, b, c = PROMPTS
    with running(gemma, cache_ram_mib=64, cache_idle_slots=True) as (engine, sink):
        first = complete(engine, sink, a, 4)
        for prompt in (b, c):
            complete(engine, sink, prompt, 4)
        cache = engine.prompt_cache
        assert cache is not None and len(cache.states) == 2  # A and B; C is in the slot
        again = complete(engine, sink, a, 4)
        assert cache.hits == 1 and len(cache.states) == 2  # A out, C in
        slot_tokens = engine.slots[0].tokens
        assert not any(slot_tokens[: len(s.tokens)] == s.tokens for s in cache.states)
    assert again.timings.cache_n == first.tokens_evaluated - 1
    assert same_next_token(first, again)
    with running(gemma, cache_ram_mib=0) as (engine, sink):
        assert engine.prompt_cache is None
        for prompt in (a, b, c):
            complete(engine, sink, prompt, 4)
        cold = complete(engine, sink, a, 4)
    assert cold.timings.cache_n <= HEAD  # prefilled again
    assert same_next_token(cold, again)


def test_the_cache_stays_within_its_size(gemma: LoadedModel) -> None:
    with running(gemma, cache_ram_mib=-1) as (engine, sink):
        complete(engine, sink, PROMPTS[0], 4)
        complete(engine, sink, PROMPTS[1], 4)
        cache = engine.prompt_cache
        assert cache is not None and len(cache.states) == 1
        one = cache.size()
    limit_mib = max(1, int(1.5 * one / MIB))  # room for one state, not two
    with running(gemma, cache_ram_mib=limit_mib) as (engine, sink):
        cache = engine.prompt_cache
        assert cache is not None
        for prompt in (*PROMPTS, PROMPTS[0]):
            result = complete(engine, sink, prompt, 4)
            assert cache.size() <= limit_mib * MIB
        assert len(cache.states) == 1
    assert result.timings.cache_n <= HEAD  # A went out (the oldest) when C came in


def test_idle_slots_go_to_the_cache_when_a_task_starts(gemma_path: Path) -> None:
    model = LoadedModel(gemma_path, plan(4096, 2))
    try:
        for idle_slots in (True, False):
            with running(model, cache_ram_mib=64, cache_idle_slots=idle_slots) as (engine, sink):
                first = complete(engine, sink, PROMPTS[0], 4)  # slot 0, then idle
                complete(engine, sink, PROMPTS[1], 4)  # an empty slot: nothing is evicted
                cache = engine.prompt_cache
                assert cache is not None
                held = [s.tokens for s in cache.states]
                kept = [s.tokens[: len(t)] == t for s in engine.slots for t in held]
            if idle_slots:  # A was saved when B started, and is still in its slot too
                assert len(held) == 1 and len(held[0]) == first.tokens_evaluated + 3
                assert any(kept)
            else:
                assert held == []
    finally:
        model.close()
