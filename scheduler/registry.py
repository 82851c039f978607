"""The worker registry: which workers serve which model, with heartbeats and model metadata."""

from __future__ import annotations

from pydantic import ConfigDict, Field, TypeAdapter
from redis.asyncio import Redis
from redis.asyncio.client import Pipeline

from scheduler.contract import keys
from scheduler.contract.deferred import DeferredModel
from scheduler.contract.results import GenerationSettings
from scheduler.decision_meta import DecisionCaps
from scheduler.redis_clock import stamp


class ModelMeta(DeferredModel):
    """What the api needs to know of a model without its weights (published by its workers)."""

    vocab_type: int
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_params: int
    size: int
    chat_template: str | None = None
    bos_token: str = ""
    eos_token: str = ""
    model_ftype: str = ""
    """The weights' type as llama.cpp names it (`Q4_K - Medium`), `/props` `model_ftype`."""
    output_modalities: list[str] = Field(default=["text"])
    decisions: DecisionCaps | None = None
    """How this worker serves /v1/systemone (None: it does not; scheduler/decision_meta.py)."""
    modalities: dict[str, bool] = Field(default={"vision": False, "audio": False, "video": False})
    """What its multimodal projector takes (-mm/--mmproj; none: all False)."""
    media_marker: str = ""
    """The marker a prompt holds where each media item goes (/props media_marker)."""

    def takes_media(self) -> bool:
        return bool(self.modalities.get("vision") or self.modalities.get("audio"))


class LoraAdapterInfo(DeferredModel):
    """One LoRA adapter a worker loaded (--lora, --lora-scaled), as `GET /lora-adapters` lists
    it: its id is its place in the list; `scale` the global one (POST /lora-adapters)."""

    id: int
    path: str
    scale: float
    task_name: str = ""
    prompt_prefix: str = ""
    alora_invocation_string: str | None = None
    alora_invocation_tokens: list[int] | None = None
    """An aLoRA's invocation tokens (None: a plain LoRA)."""

    def wire(self) -> dict[str, object]:
        """llama-server's entry: the aLoRA fields only for an aLoRA."""
        return self.model_dump(exclude_none=True)


class NextToken(DeferredModel):
    has_next_token: bool
    has_new_line: bool
    n_remain: int
    n_decoded: int


class SlotState(DeferredModel):
    """One slot as `/slots` shows it; `id` is the worker-local slot id."""

    id: int
    n_ctx: int
    speculative: bool = False
    is_processing: bool
    id_task: int | None = None
    n_prompt_tokens: int | None = None
    n_prompt_tokens_processed: int | None = None
    n_prompt_tokens_cache: int | None = None
    params: GenerationSettings | None = None
    next_token: list[NextToken] | None = None
    tenant: str | None = None
    """The tenant of the slot's request (its job's `tenant`; not in /slots' answer)."""
    simulated: bool | None = None
    """True on a simulated worker's slots (ours; absent on a real worker's)."""


class WorkerMetrics(DeferredModel):
    """A worker's counters since it started (summed over the fleet by /metrics)."""

    prompt_tokens_total: int = 0
    prompt_tokens_cached_total: int = 0
    """Prompt tokens reused from the cache (they need no decode, so only a count)."""
    prompt_seconds_total: float = 0.0
    tokens_predicted_total: int = 0
    tokens_predicted_seconds_total: float = 0.0
    n_decode_total: int = 0
    n_busy_slots_total: int = 0
    """Sum over decodes of the slots in each: divided by n_decode_total it is the average."""
    n_tokens_max: int = 0
    spec_draft_tokens_total: int = 0
    spec_accepted_tokens_total: int = 0
    spec_drafts_total: int = 0
    """Speculative decoding: tokens drafted, drafted tokens accepted, verification steps."""
    spec_accepted_per_pos: list[int] = Field(default_factory=list)
    """Accepted tokens per draft position (empty: no speculative request finished yet)."""
    kv_tier_hits_total: int = 0
    kv_tier_misses_total: int = 0
    """Prompts that looked the fleet-wide KV tier up (--kv-store): restored from it, or not."""
    requests_processing: int = 0
    requests_deferred: int = 0
    simulated: bool = False
    """The worker's engine is the simulator (`llamaq worker --simulate`)."""


class FitMemory(DeferredModel):
    """What the fitted model and context take on one device (or the host), in MiB."""

    device: str
    """The device's name ("host": host memory)."""
    free_mib: int
    total_mib: int
    model_mib: int
    context_mib: int
    """The KV cache (and other context state)."""
    compute_mib: int


class FitReport(DeferredModel):
    """What `--fit` decided for a worker (worker/runtime/fit.py), as its registry entry, /props and
    the fleet page show it."""

    enabled: bool
    fits: bool
    """Projected to leave --fit-target free on every device."""
    n_ctx: int
    n_gpu_layers: int | None = None
    """The layers it offloads when the fit chose them (None: as configured)."""
    note: str
    memory: list[FitMemory] = Field(default=[])


class WorkerInfo(DeferredModel):
    worker_id: str
    model_id: str
    model_path: str
    n_slots: int
    n_ctx_slot: int
    meta: ModelMeta
    default_settings: GenerationSettings
    started_at: float
    embedding: bool = False
    """Started with --embedding or --rerank: it serves embedding (and, with rank pooling,
    rerank) jobs from the model's embed queues, and no completions."""
    pooling: str | None = None
    """Its pooling (none, mean, cls, last, rank) when `embedding`."""
    sleeping: bool = False
    """Idle sleep (--sleep-idle-seconds): the model is unloaded until the next job."""
    lora: list[LoraAdapterInfo] = Field(default=[])
    """Its LoRA adapters with their global scales (the same list on every worker of a model)."""
    build_info: str = "unknown"
    """The llama.cpp it runs, as llama-server's `build_info` (scheduler/llama_build.py)."""
    fit: FitReport | None = None
    """What --fit decided (None: off, or no memory probe)."""
    draft_model: str | None = None
    """The draft model's file when it drafts (-md with --spec-type draft-simple)."""
    simulated: bool = False
    """`llamaq worker --simulate` (worker/simulate/): a timing model, no model loaded."""

    def capabilities(self) -> list[str]:
        """What the worker serves: "completion", or "embedding" (plus "rerank" with rank
        pooling); a decision model that serves only /v1/systemone (clef): "decisions"."""
        if not self.embedding:
            caps = self.meta.decisions
            return ["completion"] if caps is None or caps.serves_text else ["decisions"]
        return ["embedding", "rerank"] if self.pooling == "rank" else ["embedding"]


LIVE_WORKERS = """
-- KEYS[1]: a model's workers (a sorted set scored by last heartbeat, Redis's clock); ARGV: the
-- longest age of a live heartbeat (s), the prefix and suffix of a worker's registry key. Drops
-- the entries whose heartbeat is older; returns the registry entries of the others (nil: it
-- expired meanwhile). Redis's own clock: a reader whose clock is off sees the same workers.
local t = redis.call('TIME')
local cutoff = tonumber(t[1]) + tonumber(t[2]) / 1000000 - tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', cutoff)
local ids = redis.call('ZRANGE', KEYS[1], 0, -1)
if #ids == 0 then return {} end
local names = {}
for i, id in ipairs(ids) do
  names[i] = ARGV[2] .. id .. ARGV[3]
end
return redis.call('MGET', unpack(names))
"""


class Registry:
    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._live_workers = redis.register_script(LIVE_WORKERS)

    async def heartbeat(self, info: WorkerInfo) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            write_heartbeat(pipe, info)
            await pipe.execute()

    async def remove(self, info: WorkerInfo) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.delete(keys.worker_info(info.worker_id))
            pipe.zrem(keys.model_workers(info.model_id), info.worker_id)
            await pipe.execute()

    async def publish_slots(self, worker_id: str, slots: list[SlotState]) -> None:
        async with self._redis.pipeline(transaction=False) as pipe:
            write_slots(pipe, worker_id, slots)
            await pipe.execute()

    async def metrics(self, worker_ids: list[str]) -> list[WorkerMetrics]:
        return list((await self.metrics_by_worker(worker_ids)).values())

    async def metrics_by_worker(self, worker_ids: list[str]) -> dict[str, WorkerMetrics]:
        if not worker_ids:
            return {}
        documents = await self._redis.mget([keys.worker_metrics(w) for w in worker_ids])
        return {w: WorkerMetrics.model_validate_json(d)
                for w, d in zip(worker_ids, documents, strict=True) if d is not None}

    async def slots(self, worker_id: str) -> list[SlotState]:
        body = await self._redis.get(keys.worker_slots(worker_id))
        return [] if body is None else _SLOTS.validate_json(body)

    async def loads(self, workers: list[WorkerInfo]) -> dict[str, float]:
        """Each worker's load: busy slots plus the jobs waiting in its own queue, per slot."""
        if not workers:
            return {}
        async with self._redis.pipeline(transaction=False) as pipe:
            for worker in workers:
                pipe.get(keys.worker_slots(worker.worker_id))
                pipe.zcard(keys.worker_queue(worker.model_id, worker.worker_id))
            answers = await pipe.execute()
        loads = {}
        for i, worker in enumerate(workers):
            body, queued = answers[2 * i], answers[2 * i + 1]
            busy = 0 if body is None else sum(s.is_processing for s in _SLOTS.validate_json(body))
            loads[worker.worker_id] = (busy + queued) / max(worker.n_slots, 1)
        return loads

    async def live_workers(self, model_id: str) -> list[WorkerInfo]:
        """Workers of the model whose last heartbeat is recent; stale entries are dropped."""
        prefix, suffix = keys.worker_info("\0").split("\0")
        documents = await self._live_workers(  # one round trip (EVALSHA)
            keys=[keys.model_workers(model_id)],
            args=[keys.HEARTBEAT_TTL_S, prefix, suffix])
        workers = [WorkerInfo.model_validate_json(doc) for doc in documents if doc is not None]
        return sorted(workers, key=lambda w: (w.started_at, w.worker_id))


    async def every_live_worker(self) -> list[WorkerInfo]:
        """The live workers of every model (a scan of the models' registries: for rare
        operations, e.g. DELETE /models checking which files are in use)."""
        prefix, suffix = keys.model_workers("\0").split("\0")
        found: list[WorkerInfo] = []
        async for raw in self._redis.scan_iter(match=f"{prefix}*{suffix}", count=500):
            name = raw.decode() if isinstance(raw, bytes) else str(raw)
            found += await self.live_workers(name[len(prefix):len(name) - len(suffix)])
        return found


def fleet_sleeping(workers: list[WorkerInfo]) -> bool:
    """Is the model asleep: it has live workers and every one of them sleeps (/props
    `is_sleeping`; `/models` status `sleeping`). A model with one awake worker is loaded."""
    return bool(workers) and all(w.sleeping for w in workers)


def write_heartbeat(pipe: Pipeline, info: WorkerInfo) -> None:
    """Queue a worker's heartbeat on `pipe`: its registry entry, alive for HEARTBEAT_TTL_S."""
    pipe.set(keys.worker_info(info.worker_id), info.model_dump_json(), ex=keys.HEARTBEAT_TTL_S)
    stamp(pipe, keys.model_workers(info.model_id), info.worker_id)


def write_slots(pipe: Pipeline, worker_id: str, slots: list[SlotState],
                bodies: dict[int, tuple[SlotState, str]] | None = None) -> None:
    """Queue the write of a worker's slot states on `pipe` (for /slots). `bodies`, kept by
    the caller between writes, holds each slot's last state and its JSON: a state object
    written before (the engine hands the same one back while the slot is unchanged) is not
    encoded again."""
    memo: dict[int, tuple[SlotState, str]] = {} if bodies is None else bodies
    parts = []
    for slot in slots:
        known = memo.get(slot.id)
        if known is None or known[0] is not slot:
            known = memo[slot.id] = (slot, slot.model_dump_json())
        parts.append(known[1])
    pipe.set(keys.worker_slots(worker_id), "[" + ",".join(parts) + "]",
             ex=keys.HEARTBEAT_TTL_S)


def least_loaded(workers: list[WorkerInfo], loads: dict[str, float], n_jobs: int) -> WorkerInfo:
    """The worker with the lowest load that has `n_jobs` slots (registry order breaks ties);
    its load grows by those jobs, so the next group of a request goes elsewhere."""
    able = [w for w in workers if w.n_slots >= n_jobs] or workers
    chosen = min(able, key=lambda w: loads.get(w.worker_id, 0.0))
    loads[chosen.worker_id] = loads.get(chosen.worker_id, 0.0) + n_jobs / max(chosen.n_slots, 1)
    return chosen


_SLOTS = TypeAdapter(list[SlotState], config=ConfigDict(defer_build=True))  # on first use
