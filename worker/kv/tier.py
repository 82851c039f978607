"""The fleet-wide KV tier (ours, `--kv-store`): the KV state of a long prompt's prefix, stored in
the object store, so that any worker of the same model skips that prefill, on whatever machine.

A prompt of at least `--kv-store-min` tokens is cut in blocks of `--kv-store-block` tokens; each
block boundary has a hash that chains the blocks before it and the model fingerprint (the model
file's SHA-256 and what shapes the KV cache: per-slot context, cache types, flash attention,
SWA, unified or per-slot streams). Before a prompt is prefilled, the worker looks the longest
stored boundary up (scheduler/kv_tier_index.py, one Redis round trip), fetches its state when
that is faster than prefilling those tokens (measured prefill speed against measured store
reads) and longer than what a slot of this worker already holds, and checks it (fingerprint and
tokens: a mismatch is a miss, never wrong output); the engine restores it into the slot. When
the prompt's last boundary is not stored yet, the engine stops the prefill there once, takes the
slot's state (exactly that prefix, whatever the cache's layout: a sliding-window cache included)
and this module stores it, evicting the least recently used states over `--kv-store-max`.

States are taken at a block boundary, not at arbitrary positions: a state restores whole, so a
prompt reuses a stored one only when it shares the whole prefix up to that boundary. Only runs
with no LoRA adapter loaded and no media use the tier.

Owns: hashing, the fingerprint, the fetch decision, reading and writing states (storage/
kv_states.py). The engine owns restoring and taking them (worker/engine/loop.py).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from redis.asyncio import Redis
from redis.exceptions import RedisError

from scheduler.kv_tier_index import KvTierIndex
from storage import open_store
from storage.checksum import sha256_file
from storage.errors import StorageError
from storage.kv_states import KvStateStore
from worker.runtime.model import ContextPlan

log = logging.getLogger(__name__)

MiB = 1024 * 1024
FIRST_READ_BYTES_PER_S = 200 * MiB
"""The store's read speed assumed until one read was measured."""


@dataclass(frozen=True)
class TierHit:
    tokens: list[int]
    data: bytes


@dataclass
class TierPlan:
    """What the tier does for one request (worker/engine/requests.py Request.tier)."""

    hit: TierHit | None
    save_at: int | None
    """The prompt position whose state the engine takes once the prefill reaches it."""
    saved: bool = False
    restored: bool = False
    """The engine restored `hit` into the slot (worker/engine/slot_start.py): a tier hit."""
    salt: str | None = None
    """The request's cache salt (its tenant group): in the hashes of what it reads and
    stores, so that another group never finds its states."""


def prefix_hashes(tokens: list[int], block: int, fingerprint: str) -> list[str]:
    """The hash of every whole-block prefix of `tokens`, each chaining the ones before."""
    hashes: list[str] = []
    previous = fingerprint.encode()
    for start in range(0, len(tokens) - block + 1, block):
        digest = hashlib.sha256(previous)
        digest.update(struct.pack(f"<{block}i", *tokens[start:start + block]))
        previous = digest.digest()
        hashes.append(digest.hexdigest()[:32])
    return hashes


def salted(fingerprint: str, salt: str | None) -> str:
    """The hash chain's start for a cache salt (vLLM's `cache_salt`): the fingerprint alone
    without one (no --tenants)."""
    if salt is None:
        return fingerprint
    return f"{fingerprint}|salt:{salt}"


def fingerprint(model_sha256: str, plan: ContextPlan, n_ctx_slot: int) -> str:
    """What a state must have been made under to restore here."""
    shape = (f"{model_sha256}|slot{n_ctx_slot}|k{plan.cache_type_k}|v{plan.cache_type_v}|"
             f"fa{plan.flash_attn}|swa{plan.swa_full}|unified{plan.kv_unified}|"
             f"slots{plan.n_slots if not plan.kv_unified else 1}")
    return hashlib.sha256(shape.encode()).hexdigest()[:24]


def file_sha256(path: Path, cache_dir: Path) -> str:
    """The model file's SHA-256, computed once per file version (kept in the cache)."""
    stat = path.stat()
    record = cache_dir / "fingerprints" / f"{path.name}-{stat.st_size}-{stat.st_mtime_ns}.sha256"
    if record.is_file():
        return record.read_text().strip()
    digest = sha256_file(path)
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(digest)
    return digest


class KvTier:
    def __init__(self, redis: Redis, store_url: str, s3_endpoint_url: str | None, model_id: str,
                 fingerprint: str, block: int, min_tokens: int, max_bytes: int,
                 prefill_s_per_token: Callable[[], float]) -> None:
        self.fingerprint = fingerprint
        self.block = block
        self.min_tokens = max(min_tokens, block)
        self.max_bytes = max_bytes
        self._index = KvTierIndex(redis, model_id, fingerprint)
        self._states = KvStateStore(open_store(store_url, s3_endpoint_url))
        self._prefill_s_per_token = prefill_s_per_token
        self._read_bytes_per_s = float(FIRST_READ_BYTES_PER_S)
        self._saving: set[str] = set()

    async def plan(self, prompt: list[int], cached: int,
                   salt: str | None = None) -> TierPlan | None:
        """What the tier does for a prompt (`cached`: the longest prefix a slot of this worker
        holds for its salt): a state to restore, a boundary whose state to store, both or
        neither. `salt`: the request's cache salt, in every hash (its group's states only)."""
        if not self.looks_up(prompt):
            return None
        usable = prompt[:len(prompt) - 1]  # the last token is always evaluated (its logits)
        hashes = prefix_hashes(usable, self.block, salted(self.fingerprint, salt))
        stored = await self._index.longest(hashes)
        hit = None
        if stored is not None and stored.n_tokens > cached and self._worth(stored.n_tokens
                                                                           - cached,
                                                                           stored.n_bytes):
            hit = await self._fetch(hashes[stored.index], prompt[:stored.n_tokens], salt)
        last = len(hashes) * self.block
        known = stored is not None and stored.index == len(hashes) - 1
        save_at = None if known or hashes[-1] in self._saving or last <= cached else last
        return TierPlan(hit, save_at, salt=salt) if hit is not None or save_at is not None \
            else None

    def looks_up(self, prompt: list[int]) -> bool:
        """The prompt is long enough to look the tier up (the last token is always evaluated,
        for its logits)."""
        return len(prompt) - 1 >= self.min_tokens

    def _worth(self, n_tokens: int, n_bytes: int) -> bool:
        """Reading the state is faster than prefilling its tokens (no measure yet: read)."""
        per_token = self._prefill_s_per_token()
        return not per_token or n_bytes / self._read_bytes_per_s < n_tokens * per_token

    async def _fetch(self, prefix_hash: str, tokens: list[int],
                     salt: str | None) -> TierHit | None:
        started = time.perf_counter()
        try:
            data, meta = await asyncio.to_thread(self._states.load, self.fingerprint,
                                                 prefix_hash)
        except StorageError as error:
            log.warning("kv tier: state %s unreadable (%s): prefilled instead", prefix_hash,
                        error)
            return None
        seconds = time.perf_counter() - started
        if seconds > 0 and len(data) > MiB:
            self._read_bytes_per_s = 0.7 * self._read_bytes_per_s + 0.3 * len(data) / seconds
        if meta.get("fingerprint") != self.fingerprint or meta.get("tokens") != tokens \
                or meta.get("salt") != salt:
            log.warning("kv tier: state %s does not match its prompt: prefilled instead",
                        prefix_hash)
            return None
        log.info("kv tier: %d-token prefix state read (%.1f MiB in %.0f ms)", len(tokens),
                 len(data) / MiB, seconds * 1000)
        return TierHit(tokens, data)

    def save_from_thread(self, loop: asyncio.AbstractEventLoop, tokens: list[int],
                         data: bytes, salt: str | None = None) -> None:
        """The engine thread's hand-off (Engine.on_tier_state): stored from the loop."""
        asyncio.run_coroutine_threadsafe(self.save(tokens, data, salt), loop)

    async def save(self, tokens: list[int], data: bytes, salt: str | None = None) -> None:
        """Store the state of `tokens` (a whole-block prefix, made under `salt`) and evict
        over the cap."""
        prefix_hash = prefix_hashes(tokens, self.block, salted(self.fingerprint, salt))[-1]
        if prefix_hash in self._saving:
            return
        self._saving.add(prefix_hash)
        try:
            meta: dict[str, object] = {"fingerprint": self.fingerprint, "tokens": tokens}
            if salt is not None:
                meta["salt"] = salt
            await asyncio.to_thread(self._states.save, self.fingerprint, prefix_hash, data, meta)
            evicted = await self._index.add(prefix_hash, len(tokens), len(data), self.max_bytes)
            for old in evicted:
                await asyncio.to_thread(self._states.delete, self.fingerprint, old)
            log.info("kv tier: %d-token prefix state stored (%.1f MiB; %d evicted)",
                     len(tokens), len(data) / MiB, len(evicted))
        except (StorageError, OSError, RedisError) as error:
            log.warning("kv tier: state not stored (%s)", error)
        finally:
            self._saving.discard(prefix_hash)
