"""Every Redis key, queue and channel name llamaq uses, in one place."""

from __future__ import annotations

PREFIX = "llamaq"

# Worker registry: a sorted set per model (member = worker id, score = last heartbeat, unix s)
# and one JSON document per worker that expires when its heartbeats stop.
HEARTBEAT_TTL_S = 8
HEARTBEAT_EVERY_S = 2.0


def model_workers(model_id: str) -> str:
    return f"{PREFIX}:model:{model_id}:workers"


def worker_info(worker_id: str) -> str:
    return f"{PREFIX}:worker:{worker_id}"


def worker_slots(worker_id: str) -> str:
    """JSON list of the worker's slot states, rewritten when a slot changes."""
    return f"{PREFIX}:worker:{worker_id}:slots"


def worker_metrics(worker_id: str) -> str:
    """JSON WorkerMetrics, rewritten with every request's end."""
    return f"{PREFIX}:worker:{worker_id}:metrics"


def worker_queue(model_id: str, worker_id: str) -> str:
    """arq queue of jobs for one worker (requests that name a slot with `id_slot`)."""
    return f"{PREFIX}:queue:{model_id}:worker:{worker_id}"


def slot_queue(model_id: str) -> str:
    """arq queue of jobs that need a slot (completions)."""
    return f"{PREFIX}:queue:{model_id}:slot"


def utility_queue(model_id: str) -> str:
    """arq queue of quick jobs that need only the vocabulary (tokenize, detokenize)."""
    return f"{PREFIX}:queue:{model_id}:utility"


def embed_queue(model_id: str) -> str:
    """arq queue of online embedding and rerank jobs (for --embedding, --rerank workers)."""
    return f"{PREFIX}:queue:{model_id}:embed"


def embed_background_queue(model_id: str) -> str:
    """arq queue of background embedding and rerank jobs (batch chunks): a worker takes few of
    them at a time and decodes their inputs after the online ones."""
    return f"{PREFIX}:queue:{model_id}:embed:background"


def wake_channel(queue_name: str) -> str:
    """Published when a job is queued and no worker of the queue waits (scheduler/wake.py): its
    full workers look (preemption); a waiting worker is woken on its own channel instead."""
    return f"{queue_name}:wake"


def worker_wake_channel(queue_name: str, worker_id: str) -> str:
    """One worker's wake channel for `queue_name`: published when a job is queued and this
    worker came first of its waiters (scheduler/wake.py: the most room)."""
    return f"{queue_name}:wake:{worker_id}"


def queue_waiters(queue_name: str) -> str:
    """Sorted set of the wake channels of the workers waiting for a job of `queue_name` (a poll
    left them room), the most room first, then the oldest look (scheduler/wake.py)."""
    return f"{queue_name}:waiters"


def queue_order(queue_name: str) -> str:
    """Sorted sets of its waiting jobs by priority, then order (scheduler/queue_order.py)."""
    return f"{queue_name}:order"


def fair_state(model_id: str) -> str:
    """Hash of a model's virtual time and tenants' tags (scheduler/fair_share.py)."""
    return f"{PREFIX}:fair:{model_id}"


def job_events(job_id: str) -> str:
    """Pub/sub channel carrying one job's events, in order, with sequence numbers."""
    return f"{PREFIX}:job:{job_id}:events"


def job_owner(job_id: str) -> str:
    """The job's lease: the id of the worker running it, expiring JOB_LEASE_S after the last
    renewal; gone while the job is queued and once its worker died (or finished it)."""
    return f"{PREFIX}:job:{job_id}:owner"


def job_state(job_id: str) -> str:
    """Hash of a job's run: `tries` (how many times a worker started it), `sent` (events with
    output published so far), `seq` (the next event's seq), `at` (when events were last
    written, ms), `worker` (who started its last run) and `conn` (the name of that worker's
    Redis connections, scheduler/worker_presence.py). Expires JOB_STATE_TTL_S after the last
    write."""
    return f"{PREFIX}:job:{job_id}:state"


def metrics_window(model_id: str) -> str:
    """Hash, per worker of the model, of its prompt and generation totals at the last /metrics
    scrape: the throughput gauges are averages over the window between two scrapes."""
    return f"{PREFIX}:model:{model_id}:metrics_window"


METRICS_WINDOW_TTL_S = 86400


def cold_waiting(model_id: str) -> str:
    """Sorted set of the requests held for a model that has no live worker (api/cold_start.py):
    job id -> the hold's deadline (Unix ms); members past it no longer count."""
    return f"{PREFIX}:model:{model_id}:cold"


def model_counters(model_id: str) -> str:
    """Hash of fleet-wide job counters of a model: `retried`, `failed:<cause>` and
    `cold_start_timeouts`."""
    return f"{PREFIX}:model:{model_id}:counters"


def media_marker(model_id: str) -> str:
    """The media marker every worker of a model uses (the first worker with a projector sets
    it; /props reports it; worker/process/serve.py)."""
    return f"{PREFIX}:model:{model_id}:media_marker"


def job_cancel(job_id: str) -> str:
    """Flag set when nobody waits for the job any more (checked when a worker takes the job)."""
    return f"{PREFIX}:job:{job_id}:cancel"


CANCEL_CHANNEL = f"{PREFIX}:cancel"
"""Pub/sub channel of cancelled job ids; every worker listens and frees the slot."""

CONTROL_CHANNEL = f"{PREFIX}:control:reasoning-end"
"""Pub/sub channel of job ids whose thinking block must end now; every worker listens."""


LORA_CHANNEL = f"{PREFIX}:control:lora-scales"
"""Pub/sub channel of model ids whose global LoRA scales changed (POST /lora-adapters); every
worker of that model reads lora_scales and applies them."""


def lora_scales(model_id: str) -> str:
    """JSON list of a model's global LoRA scales, one per adapter, as POST /lora-adapters set
    them last; a worker that starts or wakes takes them (absent: its flags' scales)."""
    return f"{PREFIX}:model:{model_id}:lora-scales"


def chat_completion(completion_id: str) -> str:
    """JSON of a live chat completion armed with reasoning_control: its `job_ids`, its
    `owner` tenant (--tenants) and the `holder` request that armed it."""
    return f"{PREFIX}:chatcmpl:{completion_id}"


CANCEL_TTL_S = 3600
JOB_LEASE_S = 3.0
"""A job's lease (its owner key and arq's in-progress key) lasts this long past its last
renewal: a worker that died lets go of its jobs within this time."""
LEASE_RENEW_EVERY_S = 1.0
JOB_STATE_TTL_S = 3600
JOB_TTL_S = 3600
"""arq's job document of a queued job expires after this (the api's --timeout default)."""
OWNER_CHECK_EVERY_S = 0.5
"""How long an api waits on a silent job before it checks that the job's worker is alive."""
GONE_FOR_S = 0.5
"""A worker with no Redis connection (CLIENT LIST) at two looks this far apart has died (its
process ended: the kernel closed its sockets): its jobs' leases are taken from it at once
instead of after JOB_LEASE_S (scheduler/worker_presence.py)."""


# Reliable events: every job's events also go to a capped Redis stream (entry id `0-<seq+1>`),
# kept for a bounded time after the last one, so that a gap or a lost final event is recovered
# from it and a client can resume a response on any api pod.
def job_event_log(job_id: str) -> str:
    """Redis stream of one job's events (field `e`: the EventEnvelope JSON)."""
    return f"{PREFIX}:job:{job_id}:log"


EVENT_LOG_TTL_S = 600
"""How long a job's event log outlives its last event (and how long a response can resume)."""
EVENT_LOG_MAXLEN = 20000
"""Events kept per job; older ones are trimmed (a resume from before them is a 404)."""
EVENT_LOG_MAX_BYTES = 4 << 20
"""Bytes of events kept per job's log (their JSON); older ones are trimmed past it, as past
EVENT_LOG_MAXLEN. With n_probs 100 an event is ~7 KB: 600 of them, where 20,000 were 140 MB."""
RESULT_INLINE_MAX_BYTES = 1 << 20
"""A final result whose JSON is bigger (a tokenize with pieces of a long text, token-level
embeddings) goes to the object store (`results/<job id>.json`); its event carries the key
(StoredFinalEvent), so Redis does not hold it for EVENT_LOG_TTL_S."""
STORED_RESULT_TTL_S = EVENT_LOG_TTL_S + 60
"""A stored result is deleted this long after it was written (its event's log is gone by
then, so nothing can ask for it)."""


def stored_results() -> str:
    """Sorted set of the stored results' store keys, scored by when they were written (Redis
    TIME, s): any worker's sweep deletes those past STORED_RESULT_TTL_S."""
    return f"{PREFIX}:stored_results"


EVENT_INLINE_MAX_BYTES = 32 * 1024
"""Bigger events travel by the stream only: pub/sub carries a small pointer instead, so that
one request's huge events cannot push the api's shared subscriber past Redis's pub/sub output
buffer limit (which would cut every stream of that pod)."""


def stream_record(record_id: str) -> str:
    """JSON StreamRecord of a streamed response: its jobs and the ids the api pod minted, so
    that any pod can resume it from an SSE event id."""
    return f"{PREFIX}:stream:{record_id}"


def stream_conversation(tenant: str, conversation_id: str) -> str:
    """Record id of the newest response streamed for a web UI conversation (the request's
    `X-Conversation-Id`), by which `DELETE /v1/stream?conv_id=` stops it."""
    return f"{PREFIX}:stream-conv:{tenant}:{conversation_id}"


CONVERSATION_STREAM_TTL_S = 300
"""A web UI conversation's replay buffer lives this long after its last byte (llama-server's)."""


def conversation_stream(tenant: str, conversation_id: str) -> str:
    """Hash of a web UI conversation's live stream session (llama-server's resumable streams):
    `token` of its producing api connection, `started_at`, `completed_at` (0 while it runs)."""
    return f"{PREFIX}:conv-stream:{tenant}:{conversation_id}"


def conversation_stream_bytes(tenant: str, conversation_id: str) -> str:
    """Every SSE byte of a web UI conversation's stream (`GET /v1/stream?conv_id=&from=`)."""
    return f"{PREFIX}:conv-stream:{tenant}:{conversation_id}:bytes"


def conversation_stream_variants(tenant: str, conversation_id: str) -> str:
    """Set of the `<id>::<model>` sessions of a bare conversation id, for the lookup."""
    return f"{PREFIX}:conv-stream:{tenant}:{conversation_id}:variants"


def stream_holder(record_id: str) -> str:
    """Token of the api connection that currently streams the response (a pod whose client
    left cancels the jobs after RESUME_GRACE_S only if nobody resumed meanwhile)."""
    return f"{PREFIX}:stream:{record_id}:holder"


RESUME_GRACE_S = 3.0
"""How long the jobs of a stream whose client went away keep running for a resume."""
REDIS_RETRY_AFTER_S = 5
"""Retry-After of the 503 answered while Redis cannot be reached."""
PUBLISH_GRACE_S = 5.0
"""How long a worker keeps retrying events Redis refused before it ends their jobs."""

EPOCH = f"{PREFIX}:epoch"
"""A random value set once (no TTL): when it changes or vanishes, Redis lost its data (it was
restarted without persistence), and so did every queued job; api pods then end their waiting
requests at once instead of after --timeout."""
HUB_GRACE_S = 3.0
"""How long an api pod's event hub may be cut from Redis before its open streams end with an
error (a shorter blip is bridged: missed events are read back from the jobs' logs)."""

MODELS_CHANNEL = f"{PREFIX}:models:events"
"""Pub/sub of model lifecycle events (router mode): each message is the JSON of one event of the
spec's `GET /models/sse` (model_status, download_progress, download_finished, download_failed,
model_remove, models_reload), published by whichever process saw it, relayed by every api pod."""


# Batch jobs (the OpenAI Batch API). Files and result chunks live in object storage; a batch's
# record and progress live here (scheduler/batches.py).
def batch_queue(model_id: str) -> str:
    """arq queue of batch lines: a worker takes them only when it has room that online jobs
    do not need (worker/process/arq_worker.py RoomGate)."""
    return f"{PREFIX}:queue:{model_id}:batch"


def batch_record(batch_id: str) -> str:
    """JSON BatchRecord of one batch (the OpenAI Batch object and its plan)."""
    return f"{PREFIX}:batch:{batch_id}"


def batch_chunks(batch_id: str) -> str:
    """Hash of a batch's finished chunks: chunk index -> "completed failed" line counts (a
    chunk run again overwrites its entry, so counts never double)."""
    return f"{PREFIX}:batch:{batch_id}:chunks"


def batch_driver(batch_id: str) -> str:
    """The batch's driver lease: the token of the api pod driving it, expiring
    BATCH_LEASE_S after its last renewal; another pod takes the batch over once it lapses."""
    return f"{PREFIX}:batch:{batch_id}:driver"


BATCHES = f"{PREFIX}:batches"
"""Sorted set of every batch id, scored by creation time in (fractional) seconds, so that
batches created within one second keep their order (GET /v1/batches pages through it)."""


def batches_active(model_id: str) -> str:
    """Set of the model's batch ids that are not in a final state: what the drivers of the api
    pods serving that model look for."""
    return f"{PREFIX}:model:{model_id}:batches:active"


BATCH_COUNTERS = f"{PREFIX}:batches:counters"
"""Hash of fleet-wide batch counters: `lines_completed`, `lines_failed` (for /metrics)."""
BATCH_LEASE_S = 10.0
BATCH_RENEW_EVERY_S = 2.0
BATCH_SCAN_EVERY_S = 1.0
BATCH_RECORD_TTL_S = 30 * 24 * 3600
"""A batch in a final state is kept this long (OpenAI keeps batches listed for 30 days)."""

# Router mode: worker processes started without a model ("hosts") load one when asked.
HOSTS = f"{PREFIX}:hosts"
"""Sorted set of host workers (member = host id, score = last heartbeat, unix s)."""


def host_info(host_id: str) -> str:
    """JSON HostInfo of a host worker: its model and state; expires with its heartbeats."""
    return f"{PREFIX}:host:{host_id}"


def host_commands(host_id: str) -> str:
    """List of JSON HostCommand (load / unload) for one host, taken in order (BLPOP)."""
    return f"{PREFIX}:host:{host_id}:commands"


def host_claim(host_id: str) -> str:
    """The model a placement just gave the host (until the host reports it is loading it)."""
    return f"{PREFIX}:host:{host_id}:claim"


HOST_CLAIM_TTL_S = 30
MODELS_LAST_USED = f"{PREFIX}:models:last_used"
"""Sorted set: model name -> when a POST request last asked for it (the fleet's LRU clock)."""
MODELS_WAITING = f"{PREFIX}:models:waiting"
"""Sorted set: model name -> when its first request began to wait for it to load (unix s):
loads are placed first in, first out; an entry older than the wait's timeout is dropped."""
PLACEMENT_LOCK = f"{PREFIX}:models:placement"
"""Held (SET NX PX) while one api pod decides where a model loads and what unloads."""
PLACEMENT_LOCK_MS = 5000


def model_failure(model_id: str) -> str:
    """JSON of the last failed load of a model (exit code, args); cleared by the next load."""
    return f"{PREFIX}:model:{model_id}:failure"


# Model downloads (POST /models, a worker's -hf/-mu): one record per model while a download
# runs or after it stopped unfinished, so that any api pod lists it as `downloading` (its
# downloader is alive) or `incomplete`.
DOWNLOADS = f"{PREFIX}:downloads"
"""Set of the model names that have a download record."""


def download_record(model: str) -> str:
    """JSON DownloadRecord of the model's last unfinished download (gone once it finished)."""
    return f"{PREFIX}:download:{model}"


def download_alive(model: str) -> str:
    """Set while a process is downloading the model; expires DOWNLOAD_ALIVE_TTL_S after the
    downloader's last progress (a dead downloader leaves an `incomplete` model)."""
    return f"{PREFIX}:download:{model}:alive"


def download_stop(model: str) -> str:
    """Flag asking the model's downloader to stop (pause: its partial files are kept)."""
    return f"{PREFIX}:download:{model}:stop"


DOWNLOAD_ALIVE_TTL_S = 15
DOWNLOAD_REPORT_EVERY_S = 0.5
"""Progress events and records of one download are written at most this often."""


def worker_prefixes(worker_id: str) -> str:
    """JSON PrefixSummary of a worker (scheduler/affinity.py): hashes of the prompt blocks its
    slots hold and its free slots, for cache-aware routing; expires with its heartbeats."""
    return f"{PREFIX}:worker:{worker_id}:prefixes"


def lookup_cache_lock(model_sha: str, name: str) -> str:
    """Lock (redis-py's Lock) around a save of the fleet's dynamic lookup cache of a model
    file (-lcd: worker/speculative/lookup_share.py): read, merge, write."""
    return f"{PREFIX}:lookup-cache:{model_sha}:{name}:lock"


def kv_tier_blocks(model_id: str, fingerprint: str) -> str:
    """Hash of the fleet-wide KV tier (worker/kv/tier.py): prefix hash → "n_tokens:bytes" of
    each state in the object store under that model fingerprint."""
    return f"{PREFIX}:kvtier:{model_id}:{fingerprint}:blocks"


def kv_tier_lru(model_id: str, fingerprint: str) -> str:
    """Sorted set of those prefix hashes by last use (Redis TIME): --kv-store-max's order."""
    return f"{PREFIX}:kvtier:{model_id}:{fingerprint}:lru"
