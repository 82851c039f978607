"""A completion whose worker died after it streamed tokens continues on another worker: the
continuation is read back from the job's event log (what its client saw, nothing more).

Built by the worker that takes the lapsed job (worker/process/jobrun.py): it holds the job's
payload and its lease, so the log it reads can no longer grow (the dead worker wrote its last
event, and nobody else writes for the job), and the api needs to do nothing but keep reading
the job's events. The engine prefills prompt + the tokens generated so far and goes on with the
same sampling settings (worker/engine/requests.py, worker/engine/loop.py).

Owns: reading the log into a Continuation, the seed of a sampled continuation."""

from __future__ import annotations

import hashlib

from redis.asyncio import Redis

from scheduler.contract import keys
from scheduler.contract.results import (
    ENVELOPE,
    Continuation,
    EventEnvelope,
    FinalEvent,
    TokenEvent,
)
from scheduler.contract.sampling import DEFAULT_SEED


def continuation_from(envelopes: list[EventEnvelope], migrations: int = 1,
                      died_at_ms: int = 0) -> Continuation | None:
    """The continuation of a job from its whole event log (seq 0 first); None when it cannot
    continue: the log was trimmed (its first events are gone), or the job ended. A job that
    sent only prompt progress continues with no tokens: it starts over, its client having
    seen no text."""
    if not envelopes or envelopes[0].seq != 0:
        return None
    tokens: list[int] = []
    content: list[str] = []
    probs = []
    predicted_ms = 0.0
    for envelope in envelopes:
        event = envelope.event
        if isinstance(event, FinalEvent) or event.kind in ("stored_final", "error"):
            return None
        if not isinstance(event, TokenEvent) or event.progress is not None:
            continue
        tokens.extend(event.tokens)
        content.append(event.content)
        probs.extend(event.probs)
        if event.timings is not None:
            predicted_ms = event.timings.predicted_ms
    return Continuation(tokens=tokens, content="".join(content), probs=probs,
                        predicted_ms=predicted_ms, next_seq=envelopes[-1].seq + 1,
                        migrations=migrations, died_at_ms=died_at_ms)


async def read_continuation(redis: Redis, job_id: str, migrations: int = 1,
                            died_at_ms: int = 0) -> Continuation | None:
    """The job's continuation from its event log in Redis (see continuation_from)."""
    entries = await redis.xrange(keys.job_event_log(job_id), "-", "+")
    envelopes = [ENVELOPE.validate_json(fields[b"e"]) for _, fields in entries]
    if entries:  # when its worker last wrote (the job state's `at` is written now and then)
        died_at_ms = max(died_at_ms, int(entries[-1][1].get(b"a", 0)))
    return continuation_from(envelopes, migrations, died_at_ms)


def continuation_seed(seed: int, position: int) -> int:
    """The seed of a sampled continuation that starts at generated token `position`: derived
    from the request's seed and the position, so one request's continuations are
    reproducible; a random seed stays random. A sampler's state cannot be carried to another
    worker: the output after a migration is a valid sample, not the one an undisturbed run
    would have drawn."""
    if seed == DEFAULT_SEED:
        return seed
    digest = hashlib.blake2b(f"{seed}:{position}".encode(), digest_size=4).digest()
    derived = int.from_bytes(digest, "little")
    return derived if derived != DEFAULT_SEED else derived - 1
