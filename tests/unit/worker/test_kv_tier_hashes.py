"""The KV tier's keys (worker/kv/tier.py): each whole-block prefix has one hash that chains the
blocks before it and the model fingerprint, so equal hashes mean equal prefixes of one model."""

from __future__ import annotations

from worker.kv.tier import fingerprint, prefix_hashes, salted
from worker.runtime.model import ContextPlan

PLAN = ContextPlan(n_ctx=4096, n_slots=2, kv_unified=False, n_batch=512, n_ubatch=512,
                   n_threads=2, n_threads_batch=2, swa_full=False, flash_attn="auto",
                   cache_type_k="f16", cache_type_v="f16")


def test_every_whole_block_has_a_chained_hash() -> None:
    tokens = list(range(1000))
    hashes = prefix_hashes(tokens, 256, "fp")
    assert len(hashes) == 3 and len(set(hashes)) == 3
    assert prefix_hashes(tokens[:800], 256, "fp") == hashes
    changed = [7, *tokens[1:]]  # the first block differs: every later hash too
    assert not set(prefix_hashes(changed, 256, "fp")) & set(hashes)
    assert prefix_hashes(tokens, 256, "other model") != hashes


def test_the_fingerprint_follows_what_shapes_the_cache() -> None:
    base = fingerprint("sha", PLAN, 2048)
    assert fingerprint("sha", PLAN, 2048) == base
    assert fingerprint("sha2", PLAN, 2048) != base
    assert fingerprint("sha", PLAN, 1024) != base
    from dataclasses import replace

    for change in ({"cache_type_k": "q8_0"}, {"flash_attn": "off"}, {"swa_full": True},
                   {"kv_unified": True}):
        assert fingerprint("sha", replace(PLAN, **change), 2048) != base  # type: ignore[arg-type]


def test_a_cache_salt_starts_another_chain() -> None:
    """Under --tenants a state's hash chains its tenant group's salt (vLLM's cache_salt):
    another group's lookup of the same tokens finds nothing; no salt is the plain chain."""
    tokens = list(range(600))
    plain = prefix_hashes(tokens, 256, salted("fp", None))
    assert plain == prefix_hashes(tokens, 256, "fp")
    alice = prefix_hashes(tokens, 256, salted("fp", "alice"))
    bob = prefix_hashes(tokens, 256, salted("fp", "bob"))
    assert not set(alice) & set(bob) and not set(alice) & set(plain)
