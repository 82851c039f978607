"""Cache-aware routing: a request whose prompt begins like what a worker's slots already hold
goes to that worker (when it has a free slot), so the worker reuses its KV cache instead of
evaluating the prefix again. No llama-server has this; SGLang's router and Ray Serve's prefix
affinity do.

How it works:
- Each worker publishes a `PrefixSummary` in the registry (`keys.worker_prefixes`): the hashes
  of the blocks of the prompts its slots hold, and how many slots are free. It is written with
  the slot states, and ahead of every batch of events that starts or ends a job, so an api that
  sees a job start or end reads a summary that already shows it.
- The api hashes the new prompt the same way and asks `PrefixRouter.choose`: the worker whose
  summary holds the longest run of the prompt's leading blocks — at least `min_chars` — wins
  if it has a free slot (its published free slots minus the jobs this pod sent it that have not
  started yet); if the workers holding it are all busy, the job goes to the model's shared
  queue as before. A long prompt that no worker holds goes to the worker with a free slot whose
  slots hold the fewest blocks (the shared queue when none is free), and the pod remembers for
  RECENT_S where it sent it: the questions that follow a new system prompt go where its first
  one went, even before that worker's summary shows it (SGLang's router does the same: its
  tree is updated when it routes, and the smallest tree takes a new prefix). Short prompts
  (under `min_chars`) always take the shared queue.
- A routed job goes to the chosen worker's own queue, but stays movable (it is not pinned like
  an `id_slot` job): if no worker took it within `TAKE_WITHIN_S` (the worker stalled, died, is
  busy after all, or handed it back while draining) or its run died with the worker before it
  sent anything, the api waiting for it moves it to the shared queue (`MOVE_TO_SHARED` of
  scheduler/queue_index.py, atomic: only a job still queued and held by nobody moves). The
  re-run rule of scheduler/leases.py is unchanged: a moved job is an unpinned completion.

What is hashed: the prompt's *text*, in blocks of BLOCK_CHARS characters, each hash chained to
the one before (a block's hash stands for everything up to its end, so "the first k blocks
match" is "the k-th hash matches"). Not tokens, because the api has no vocabulary (the api image
has no llama.cpp; a tokenize job per request would add a round trip to a worker before every
request, which is what this feature saves). Both sides hash the very same thing: the job's
`prompt` field (rendered chat template included), which the worker keeps for the job whose
tokens a slot holds. Text blocks are as good a proxy as token blocks for "the slot's KV holds
this prefix": equal text gives equal tokens up to the last few tokens before the point where
the texts differ. Prompts given as token ids hash their ids the same way (`prompt_text`). The
chain starts from the job's LoRA set and, under --tenants, its cache salt (its tenant group):
a worker holding another group's prompt does not draw the request (that worker would not
reuse it, and where a request goes must say nothing of another tenant's prompts).
Hashes are 8 bytes of BLAKE2b: a summary of 4 slots x 64 blocks is ~2 KB.
"""

from __future__ import annotations

import base64
import hashlib
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from pydantic import Field, ValidationError
from redis.asyncio import Redis

from scheduler.contract import keys
from scheduler.contract.deferred import DeferredModel
from scheduler.contract.jobs import CompletionJob, PromptPiece
from scheduler.queue_index import move_to_shared
from scheduler.redis_clock import recent

BLOCK_CHARS = 256
"""Characters per hashed block (~64 tokens of English text)."""
DIGEST_BYTES = 8
MAX_BLOCKS_PER_SLOT = 512
"""A slot's prompt is summarized up to this many blocks (128k characters)."""
DEFAULT_MIN_CHARS = 1024
"""The shortest shared beginning (characters) worth a routing decision (--prefix-affinity)."""
TAKE_WITHIN_S = 1.0
"""A routed job that no worker took within this long moves to the shared queue."""
RECENT_S = 10.0
"""How long a pod remembers where it sent a prompt (until the worker's summary shows it)."""


def prompt_text(prompt: list[PromptPiece] | str) -> str:
    """The prompt as one string for hashing: text pieces as they are, token ids as
    `\\x00<id>\\x00` (a character no text prompt sends before tokenization)."""
    if isinstance(prompt, str):
        return prompt
    return "".join(p if isinstance(p, str) else f"\x00{p}\x00" for p in prompt)


def block_hashes(text: str, block_chars: int = BLOCK_CHARS,
                 max_blocks: int = MAX_BLOCKS_PER_SLOT, seed: bytes = b"") -> list[bytes]:
    """Chained hashes of the text's whole blocks: hash k covers characters 0 .. k*block_chars.
    A last partial block is not hashed (what follows it is unknown). `seed` starts the chain
    (the job's LoRA set: a prompt cached under one set does not draw a request under another,
    as the worker's cache is keyed by set)."""
    hashes: list[bytes] = []
    previous = seed
    for start in range(0, min(len(text) // block_chars, max_blocks) * block_chars, block_chars):
        block = text[start : start + block_chars].encode("utf-8", "surrogatepass")
        previous = hashlib.blake2b(previous + block, digest_size=DIGEST_BYTES).digest()
        hashes.append(previous)
    return hashes


def job_hashes(job: CompletionJob, block_chars: int = BLOCK_CHARS) -> list[bytes]:
    """The block hashes of a completion's prompt; none for infill (its prompt is assembled
    from parts by the worker) and for multimodal or other non-plain prompts."""
    if job.infill is not None:
        return []
    key = lora_key(job)
    if job.cache_salt is not None:  # its tenant group's: another group's prompts draw it not
        key = f"{key}|salt:{job.cache_salt}"
    return block_hashes(prompt_text(job.prompt), block_chars,
                        seed=key.encode() if key else b"")


def lora_key(job: CompletionJob) -> str:
    """The job's own LoRA set as text ("": none, the worker's global scales)."""
    if job.lora is None:
        return ""
    return ",".join(f"{e.id}:{e.scale!r}" for e in sorted(job.lora, key=lambda e: e.id))


class PrefixSummary(DeferredModel):
    """What a worker publishes for routing (`keys.worker_prefixes`)."""

    block_chars: int = BLOCK_CHARS
    n_free: int
    """Slots free for a new request: slots minus running and waiting requests."""
    blocks: str = ""
    """Base64 of the concatenated DIGEST_BYTES hashes of every block its slots hold."""
    lora_sets: list[str] = Field(default=[])
    """The LoRA sets (lora_key) of the requests it runs now: its step groups."""

    @classmethod
    def of(cls, hash_lists: list[list[bytes]], n_free: int,
           block_chars: int = BLOCK_CHARS, lora_sets: list[str] | None = None
           ) -> PrefixSummary:
        unique = dict.fromkeys(h for hashes in hash_lists for h in hashes)
        return cls(block_chars=block_chars, n_free=max(n_free, 0),
                   blocks=base64.b64encode(b"".join(unique)).decode(),
                   lora_sets=sorted(set(lora_sets or [])))

    def digests(self) -> frozenset[bytes]:
        raw = base64.b64decode(self.blocks)
        return frozenset(raw[i : i + DIGEST_BYTES] for i in range(0, len(raw), DIGEST_BYTES))


class PrefixIndex:
    """A worker's side: the summary of the prompts its slots hold, each prompt hashed once."""

    def __init__(self, block_chars: int = BLOCK_CHARS) -> None:
        self._block_chars = block_chars
        self._hashes: dict[str, list[bytes]] = {}

    def summary(self, held: list[CompletionJob | None], n_free: int,
                running: list[CompletionJob] | None = None) -> PrefixSummary:
        """`held`: per slot, the job whose prompt the slot's cache begins with (None: empty);
        `running`: the jobs running now (their LoRA sets are the worker's step groups)."""
        current = {}
        for job in held:
            if job is not None:
                hashes = self._hashes.get(job.job_id)
                current[job.job_id] = hashes if hashes is not None else \
                    job_hashes(job, self._block_chars)
        self._hashes = current
        return PrefixSummary.of(list(current.values()), n_free, self._block_chars,
                                [lora_key(job) for job in running or []])


@dataclass(frozen=True)
class WorkerView:
    """One worker as the router sees it: its free slots and the blocks it holds."""

    worker_id: str
    n_free: int
    blocks: frozenset[bytes]
    block_chars: int = BLOCK_CHARS
    lora_sets: frozenset[str] = frozenset()
    """The LoRA sets its running requests use."""


def shared_blocks(hashes: list[bytes], held: frozenset[bytes]) -> int:
    """How many of the prompt's leading blocks the worker holds (chained hashes: the run
    stops at the first block it does not hold)."""
    n = 0
    for digest in hashes:
        if digest not in held:
            break
        n += 1
    return n


@dataclass
class PrefixRouter:
    """The routing state of one api pod: the decision; the jobs it routed that have not
    started yet (the workers' published free slots do not count them); and the prompts it
    sent to each worker in the last RECENT_S (the worker's summary shows them only once the
    job starts, and the requests that follow a new system prompt must not scatter meanwhile)."""

    min_chars: int = DEFAULT_MIN_CHARS
    block_chars: int = BLOCK_CHARS
    now: Callable[[], float] = time.monotonic
    pending: Counter[str] = field(default_factory=Counter)
    recent: dict[bytes, tuple[str, float]] = field(default_factory=dict)
    """Block hash -> (worker it was routed to, when); oldest first."""
    recent_blocks: Counter[str] = field(default_factory=Counter)
    """Per worker: how many of `recent` point to it."""

    @property
    def enabled(self) -> bool:
        return self.min_chars > 0

    def choose(self, hashes: list[bytes], workers: list[WorkerView],
               lora: str = "") -> str | None:
        """Where a prompt with these block hashes goes; None: the shared queue.

        - Workers holding at least min_chars of its beginning (published, or routed there by
          this pod lately): the one holding the longest, among those with a free slot (then
          the one with more free slots, then the first listed); none free: the shared queue,
          where the first of them to free a slot (or another worker) takes it.
        - No worker holds it: among the workers with a free slot, the one whose slots hold the
          fewest blocks (published, plus those this pod sent it lately), then the one with the
          most free slots (SGLang's rule: the smallest cache takes a new prefix, so that the
          workers split the prefixes instead of one evicting what the other lacks); the
          requests that follow with the same beginning find it there. None free: the shared
          queue.
        - A request with its own LoRA set (`lora`, lora_key) that no worker holds prefers,
          before the rest, a worker with a free slot that already runs that set (its step
          groups need no new one); a short prompt of such a request goes there too, or to
          the shared queue when none runs it."""
        if not self.enabled:
            return None
        if len(hashes) * self.block_chars < self.min_chars:
            return self._same_set(workers, lora) if lora else None
        self._forget_old()
        min_blocks = max(1, -(-self.min_chars // self.block_chars))
        usable = [w for w in workers if w.block_chars == self.block_chars]
        holders, coldest = [], None
        for worker in usable:
            free = worker.n_free - self.pending[worker.worker_id]
            n = max(shared_blocks(hashes, worker.blocks), self._recent_run(hashes, worker))
            if n >= min_blocks:
                holders.append((n, free, worker.worker_id))
                continue
            room = (bool(lora) and lora in worker.lora_sets,
                    -(len(worker.blocks) + self.recent_blocks[worker.worker_id]), free)
            if free > 0 and (coldest is None or room > coldest[0]):
                coldest = (room, worker.worker_id)
        if holders:
            free_holders = [h for h in holders if h[1] > 0]
            if not free_holders:
                return None
            n, free, chosen = max(free_holders, key=lambda h: (h[0], h[1]))
        elif coldest is not None:
            chosen = coldest[1]
        else:
            return None
        self._remember(hashes, chosen)
        return chosen

    def _same_set(self, workers: list[WorkerView], lora: str) -> str | None:
        """The worker with the most free slots among those running `lora` (None: none)."""
        running = [(w.n_free - self.pending[w.worker_id], w.worker_id) for w in workers
                   if lora in w.lora_sets]
        free = [r for r in running if r[0] > 0]
        return max(free)[1] if free else None

    def _recent_run(self, hashes: list[bytes], worker: WorkerView) -> int:
        n = 0
        for digest in hashes:
            entry = self.recent.get(digest)
            if entry is None or entry[0] != worker.worker_id:
                break
            n += 1
        return n

    def _remember(self, hashes: list[bytes], worker_id: str) -> None:
        now = self.now()
        for digest in hashes:
            old = self.recent.pop(digest, None)  # re-inserted last: the dict stays oldest first
            if old is not None:
                self._uncount(old[0])
            self.recent[digest] = (worker_id, now)
            self.recent_blocks[worker_id] += 1

    def _forget_old(self) -> None:
        cutoff = self.now() - RECENT_S
        while self.recent:
            digest, (worker_id, when) = next(iter(self.recent.items()))
            if when >= cutoff:
                break
            del self.recent[digest]
            self._uncount(worker_id)

    def _uncount(self, worker_id: str) -> None:
        self.recent_blocks[worker_id] -= 1
        if self.recent_blocks[worker_id] <= 0:
            del self.recent_blocks[worker_id]

    def routed(self, worker_id: str) -> None:
        self.pending[worker_id] += 1

    def settled(self, worker_id: str) -> None:
        """A routed job started, ended, or moved to the shared queue."""
        self.pending[worker_id] -= 1
        if self.pending[worker_id] <= 0:
            del self.pending[worker_id]


class Affinity:
    """The api's side on Redis: read the workers' summaries, route, move a stuck job."""

    def __init__(self, redis: Redis, router: PrefixRouter) -> None:
        self._redis = redis
        self.router = router

    async def views(self, model_id: str) -> list[WorkerView]:
        """The summaries of the model's workers that heartbeat (a summary expires with its
        worker's heartbeats)."""
        ids = await recent(self._redis, keys.model_workers(model_id), keys.HEARTBEAT_TTL_S)
        if not ids:
            return []
        documents = await self._redis.mget([keys.worker_prefixes(w) for w in ids])
        views = []
        for worker_id, document in zip(ids, documents, strict=True):
            if document is None:
                continue
            try:
                summary = PrefixSummary.model_validate_json(document)
            except ValidationError:  # a worker of another version: not routed to
                continue
            views.append(WorkerView(worker_id, summary.n_free, summary.digests(),
                                    summary.block_chars, frozenset(summary.lora_sets)))
        return views

    async def route(self, job: CompletionJob) -> str | None:
        """The worker this completion should go to, or None for the shared queue."""
        if not self.router.enabled or job.worker_id or job.id_slot >= 0:
            return None
        hashes = job_hashes(job, self.router.block_chars)
        lora = lora_key(job)
        if len(hashes) * self.router.block_chars < self.router.min_chars and not lora:
            return None  # not worth a read of the summaries
        chosen = self.router.choose(hashes, await self.views(job.model), lora)
        if chosen is not None:
            self.router.routed(chosen)
        return chosen

    async def move_to_shared(self, model_id: str, worker_id: str, job_id: str) -> bool:
        """Move a routed job that its worker did not take to the shared queue (and wake the
        workers polling it); False when it is held or no longer queued there."""
        return await move_to_shared(self._redis, model_id, worker_id, job_id)


class RoutedJob:
    """A job the router sent to a worker's own queue, as the api waiting for it tracks it:
    its reservation of a free slot ends once (started, ended, or moved), and it moves to the
    shared queue when no worker took it in time."""

    def __init__(self, affinity: Affinity, model_id: str, worker_id: str, job_id: str) -> None:
        self._affinity = affinity
        self.model_id = model_id
        self.worker_id = worker_id
        self.job_id = job_id
        self.since = time.monotonic()
        self.settled = False
        self.moved = False

    def settle(self) -> None:
        if not self.settled:
            self.settled = True
            self._affinity.router.settled(self.worker_id)

    async def unstick(self) -> bool:
        """Move the job to the shared queue when nobody took it within TAKE_WITHIN_S, or when
        it went back to (or stayed in) the worker's queue after its run died. True if moved."""
        if self.moved or time.monotonic() - self.since < TAKE_WITHIN_S:
            return False
        if not await self._affinity.move_to_shared(self.model_id, self.worker_id, self.job_id):
            return False
        self.moved = True
        self.settle()
        return True
