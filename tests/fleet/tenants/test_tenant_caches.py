"""Caches keyed by tenant (--tenants, issue 43 item 8) on a real fleet: Gemma 3 270M on real
llama.cpp, real Redis, a real local store, real HTTP. `timings.cache_n` is the oracle a tenant
would read another's prompt through: tenant B sending tenant A's exact prompt gets 0 from a slot,
from the host prompt cache (--cache-ram) and from the fleet KV tier (--kv-store, on a fresh
worker); a tenant of A's cache group (`share_cache_with`) gets the hit; -lcd's lookup cache
learns only the tokens of a tenant whose `share_lookup_cache` allows it."""

from __future__ import annotations

import json
import random
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import make_fleet
from tests.fleet.speculative.test_lookup_share import flat_counts
from tests.processes import wait_until
from worker.speculative import ngram_cache as nc

pytestmark = pytest.mark.process

TENANTS: list[dict[str, Any]] = [
    {"name": "alice", "keys": ["k-alice"], "share_cache_with": ["carol"]},
    {"name": "bob", "keys": ["k-bob"]},
    {"name": "carol", "keys": ["k-carol"], "share_cache_with": ["alice"]},
    {"name": "dave", "keys": ["k-dave"], "share_lookup_cache": True},
    {"name": "ops", "keys": ["k-ops"], "admin": True},
]
ALIAS = "gemma-caches"


def tenants_file(folder: Path) -> Path:
    path = folder / "tenants.json"
    path.write_text(json.dumps({"tenants": TENANTS}))
    return path


@pytest.fixture(scope="module")
def one_slot(redis_url: str, workdir: Path, gemma_path: Path) -> Iterator[str]:
    """One worker of one slot (every request takes the slot the one before left) with the
    host prompt cache (--cache-ram's default)."""
    fleet = make_fleet(redis_url, workdir, gemma_path, ALIAS)
    fleet.add_worker("-c", "2048", "-np", "1", "-t", "2")
    url = fleet.add_api("--tenants", str(tenants_file(workdir)))
    fleet.wait_healthy(url)
    yield url
    fleet.stop()


def cache_n(url: str, key: str, prompt: str, **fields: Any) -> int:
    answer = httpx.post(f"{url}/completion", headers={"Authorization": f"Bearer {key}"},
                        timeout=120, json={"prompt": prompt, "n_predict": 2, **fields})
    assert answer.status_code == 200, answer.text
    return int(answer.json()["timings"]["cache_n"])


def secret(words: int = 40) -> str:
    """A prompt nobody sent before (the fleet's caches may hold earlier tests' prompts)."""
    nonce = uuid.uuid4().hex
    return f"{nonce} private note: " + " ".join(f"entry {nonce[i % 32]}{i}" for i in
                                                 range(words))


def test_a_slot_serves_only_its_tenant_group(one_slot: str) -> None:
    prompt = secret()
    assert cache_n(one_slot, "k-alice", prompt) < 5  # its BOS, maybe
    assert cache_n(one_slot, "k-bob", prompt) == 0  # the slot holds alice's prompt
    assert cache_n(one_slot, "k-bob", prompt) > 20  # its own prompt, from its slot
    assert cache_n(one_slot, "k-carol", prompt) > 20  # alice's group (from the host cache)
    assert cache_n(one_slot, "k-alice", prompt) > 20  # carol's slot: alice's group
    save = httpx.post(f"{one_slot}/slots/0?action=save", json={"filename": "x.bin"},
                      headers={"Authorization": "Bearer k-bob"}, timeout=30)
    assert save.status_code == 403  # a snapshot of the slot is the admin's (item 7)


def test_the_host_cache_serves_only_its_tenant_group(one_slot: str) -> None:
    prompt = secret()
    assert cache_n(one_slot, "k-alice", prompt) < 5  # its BOS, maybe
    assert cache_n(one_slot, "k-alice", secret()) < 5  # alice's prompt: to the host cache
    assert cache_n(one_slot, "k-bob", prompt) == 0
    assert cache_n(one_slot, "k-carol", prompt) > 20


BLOCK = 128
DOCUMENT = " ".join(f"Item {i} of the inventory is a {['red', 'blue', 'green'][i % 3]} box."
                    for i in range(40))


def stored_states(store: Path) -> int:
    return len(list((store / "kv").rglob("*.json")))


def test_the_kv_tier_serves_only_its_tenant_group(redis_url: str, tmp_path: Path,
                                                  gemma_path: Path) -> None:
    """Alice's prefix state, stored by worker A, restores on a fresh worker B for carol (her
    group) but not for bob: his lookup hashes another salt."""
    tier = ("-c", "2048", "-np", "1", "-t", "2", "--kv-store", "--kv-store-block", str(BLOCK),
            "--kv-store-min", "256", "--swa-full", "--cache-ram", "0")
    fleet = make_fleet(redis_url, tmp_path, gemma_path, "kv-tenants")
    try:
        worker_a = fleet.add_worker(*tier)
        url = fleet.add_api("--tenants", str(tenants_file(tmp_path)))
        fleet.wait_healthy(url, timeout=120)
        prompt = f"{uuid.uuid4().hex} {DOCUMENT}\nQuestion: how many boxes?\nAnswer:"
        assert cache_n(url, "k-alice", prompt) == 0
        wait_until(lambda: stored_states(tmp_path / "store") == 1, timeout=30,
                   what="alice's stored state")
        fleet.stop_process(worker_a)
        fleet.add_worker(*tier)
        wait_until(lambda: httpx.get(f"{url}/health").status_code == 200, timeout=120,
                   what="worker B")
        assert cache_n(url, "k-bob", prompt) == 0
        assert cache_n(url, "k-carol", prompt) >= 2 * BLOCK
    finally:
        fleet.stop()


def test_the_lookup_cache_learns_only_tenants_that_share_it(redis_url: str, tmp_path: Path,
                                                            gemma_path: Path) -> None:
    """-lcd learns dave's tokens (share_lookup_cache) into the store, not alice's."""
    fleet = make_fleet(redis_url, tmp_path, gemma_path, "lcd-tenants")
    try:
        url = fleet.add_api("--tenants", str(tenants_file(tmp_path)))
        worker = fleet.add_worker("-c", "2048", "-np", "1", "-t", "2", "--spec-type",
                                  "ngram-cache", "-lcd", str(tmp_path / "dyn.bin"))
        fleet.wait_healthy(url, timeout=120)
        rng = random.Random(uuid.uuid4().int)
        fruit = ["apple", "banana", "cherry", "grape", "lemon", "mango", "peach", "plum"]
        texts = {"k-alice": " ".join(rng.choice(fruit) for _ in range(60)),  # two vocabularies
                 "k-dave": " ".join(str(rng.randrange(10)) for _ in range(60))}
        tokens = {}
        for key, text in texts.items():
            cache_n(url, key, text)
            tokens[key] = httpx.post(f"{url}/tokenize", json={"content": text},
                                     headers={"Authorization": f"Bearer {key}"},
                                     timeout=30).json()["tokens"]
        fleet.stop_process(worker)  # drains, then saves what it learned
        saved = list((tmp_path / "store" / "lookup-cache").glob("*/dyn.bin"))
        assert len(saved) == 1, saved
        learned = {ngram for ngram, _ in flat_counts(nc.loads(saved[0].read_bytes()))}
    finally:
        fleet.stop()

    def ngrams(run: list[int]) -> set[nc.Ngram]:
        """Its whole 4-grams (a shorter one may be another text's too)."""
        cache: nc.Cache = {}
        nc.count_runs(cache, [run])
        return {ngram for ngram in cache if -1 not in ngram}

    alices, daves = ngrams(tokens["k-alice"]), ngrams(tokens["k-dave"])
    assert alices and not alices & daves
    assert daves <= learned
    assert not alices & learned


def prompt_tokens_total(url: str) -> float:
    text = httpx.get(f"{url}/metrics", headers={"Authorization": "Bearer k-ops"},
                     timeout=30).text
    match = re.search(r"^llamacpp:prompt_tokens_total (\S+)$", text, re.MULTILINE)
    assert match, text
    return float(match.group(1))


def test_a_decision_state_is_reused_only_by_its_tenant_group(redis_url: str, tmp_path: Path,
                                                             gemma_path: Path) -> None:
    """/v1/systemone prefills its state in a slot and leaves it there: bob's request for
    alice's state evaluates it again (the worker's prompt token count grows by it), carol's
    (alice's group) reuses it."""
    fleet = make_fleet(redis_url, tmp_path, gemma_path, "decisions-tenants")
    try:
        fleet.add_worker("-c", "4096", "-np", "1", "-t", "2", "--decisions")
        url = fleet.add_api("--tenants", str(tenants_file(tmp_path)), "--metrics")
        fleet.wait_healthy(url, timeout=120)
        state = f"{uuid.uuid4().hex} " + " ".join(
            f"Order {i} was shipped to warehouse {i % 7} on day {i % 28}." for i in range(25))
        body = {"state": state, "questions": {"late": {
            "type": "noul", "instructions": "Is an order late?"}}}

        def decoded(key: str) -> float:
            before = prompt_tokens_total(url)
            answer = httpx.post(f"{url}/v1/systemone", json=body, timeout=120,
                                headers={"Authorization": f"Bearer {key}"})
            assert answer.status_code == 200, answer.text
            return prompt_tokens_total(url) - before

        n_state = decoded("k-alice")
        assert n_state > 300
        assert decoded("k-bob") > 300  # the slot holds alice's state: evaluated again
        assert decoded("k-carol") > 300  # bob's now
        assert decoded("k-alice") < 100  # carol's: alice's group
    finally:
        fleet.stop()
