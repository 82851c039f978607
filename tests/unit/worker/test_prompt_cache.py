"""The host-memory prompt cache (worker/kv/prompt_cache.py) on a simulated KV cache: llama-server's
rules (insertion-order eviction, a hit moves the state out, contained prompts not kept twice,
the token limit, the adapter set) and that a restored slot holds what its tokens say."""

from __future__ import annotations

from worker.kv.checkpoints import Checkpoint
from worker.kv.prompt_cache import MIB, PromptCache, wants_update
from worker.kv.slots import SlotCache


class StateKv:
    """Each sequence holds a token list; its state is those tokens, padded to `per_token`
    bytes each (a state's size grows with its tokens, as llama.cpp's does)."""

    def __init__(self, per_token: int = 1) -> None:
        self.seqs: dict[int, list[int]] = {}
        self.per_token = per_token

    def remove(self, seq: int, p0: int, p1: int) -> bool:
        if p0 <= 0 and p1 < 0:
            self.seqs[seq] = []
        else:
            del self.seqs.setdefault(seq, [])[p0:]
        return True

    def copy(self, src: int, dst: int) -> None:
        self.seqs[dst] = list(self.seqs[src])

    def shift(self, seq: int, p0: int, p1: int, delta: int) -> None:
        raise AssertionError("not used")

    def can_shift(self) -> bool:
        return False

    def pos_min(self, seq: int) -> int:
        return 0 if self.seqs.get(seq) else -1

    def pos_max(self, seq: int) -> int:
        return len(self.seqs.get(seq, [])) - 1

    def save(self, seq: int, partial: bool) -> bytes:
        tokens = self.seqs.get(seq, [])
        return b",".join(str(t).encode().rjust(self.per_token - 1) for t in tokens)

    def load(self, seq: int, data: bytes, partial: bool) -> bool:
        self.seqs[seq] = [int(t) for t in data.split(b",") if t.strip()]
        return True


def filled(kv: StateKv, slot_id: int, tokens: list[int]) -> SlotCache:
    kv.seqs[slot_id] = list(tokens)
    return SlotCache(slot_id, list(tokens))


A, B, C = list(range(100, 200)), list(range(200, 300)), list(range(300, 400))


def test_a_slot_goes_through_the_cache_when_empty_or_losing_most_of_it() -> None:
    assert wants_update([], A)
    assert wants_update(A, B)
    assert not wants_update(A, [*A[:80], 1])


def test_an_evicted_prompt_comes_back_and_leaves_the_cache() -> None:
    kv, cache = StateKv(), PromptCache(-1, 10_000)
    slot = filled(kv, 0, A)
    slot.checkpoints.append(Checkpoint(96, 80, 95, b"cp"))
    assert cache.save(kv, slot)
    assert not cache.save(kv, slot)  # held already
    kv.remove(0, -1, -1)
    slot.forget_tokens()
    assert cache.load(kv, kv, slot, [*A, 7])
    assert slot.tokens == A and kv.seqs[0] == A
    assert [c.n_tokens for c in slot.checkpoints] == [96]
    assert cache.states == [] and cache.hits == 1  # moved out, not copied


def test_a_cached_prompt_loads_only_when_it_beats_the_slots_own() -> None:
    kv, cache = StateKv(), PromptCache(-1, 10_000)
    assert cache.save(kv, filled(kv, 1, A))
    slot = filled(kv, 0, [*A[:90], 5, 6])
    assert not cache.load(kv, kv, slot, [*A[:90], 1])  # the slot shares as much
    assert slot.tokens[:90] == A[:90] and len(cache.states) == 1
    other = filled(kv, 2, B)
    assert not cache.load(kv, kv, other, [*A[:20], *C])  # keeps < 25 % of the cached one
    assert other.tokens == B


def test_prompts_contained_in_a_new_one_are_replaced_by_it() -> None:
    kv, cache = StateKv(), PromptCache(-1, 10_000)
    cache.save(kv, filled(kv, 0, A[:50]))
    cache.save(kv, filled(kv, 0, A))
    assert [len(s.tokens) for s in cache.states] == [100]


def test_the_oldest_go_first_whatever_was_used_since() -> None:
    kv, cache = StateKv(per_token=1024), PromptCache(1, 0)  # 1 MiB: about 1000 tokens
    tokens = [list(range(i * 1000, i * 1000 + 400)) for i in range(3)]
    for i, t in enumerate(tokens):
        cache.save(kv, filled(kv, i, t))
        cache.update()
        assert cache.size() <= MIB
    assert [s.tokens[0] for s in cache.states] == [1000, 2000]
    assert cache.load(kv, kv, SlotCache(5), [*tokens[1], 1])  # a hit takes it out
    assert [s.tokens[0] for s in cache.states] == [2000]


def test_a_state_larger_than_the_whole_cache_is_not_kept() -> None:
    kv, cache = StateKv(per_token=1024), PromptCache(1, 0)
    assert not cache.save(kv, filled(kv, 0, list(range(2000))))
    assert cache.states == []


def test_without_a_size_limit_at_most_n_ctx_tokens_are_kept() -> None:
    kv, cache = StateKv(), PromptCache(-1, 250)
    for i, t in enumerate((A, B, C)):
        cache.save(kv, filled(kv, i, t))
        cache.update()
    assert cache.n_tokens() <= 250 and [s.tokens[0] for s in cache.states] == [200, 300]


def test_a_state_serves_only_prompts_under_its_adapter_set() -> None:
    kv, cache = StateKv(), PromptCache(-1, 10_000)
    cache.save(kv, filled(kv, 0, A), tag=(1.0,))
    slot = SlotCache(1)
    assert not cache.load(kv, kv, slot, [*A, 1], tag=(0.5,))
    assert cache.load(kv, kv, slot, [*A, 1], tag=(1.0,))
