"""Coalescing a job's token events (--stream-interval, ours): the publisher flushes at most
every interval, and consecutive token events of one job in a flush become one event carrying
all their tokens and text (as vLLM's stream_interval). Fewer events mean fewer Redis commands
(each event is an XADD, an EXPIRE and a PUBLISH, and its job's state a HSET and an EXPIRE
more), fewer pub/sub messages for the api pods to parse and fewer SSE chunks to write, at the
cost of up to one interval of delay per token (docs/scale.md has the measurements).

Owns: which events merge and how. A job's first token, prompt progress, and every event that
starts or ends a job are never held back: they go with the next flush as they are.
"""

from __future__ import annotations

from scheduler.contract.results import TokenEvent
from worker.engine.runs import JobEvent


def mergeable(event: object) -> bool:
    return isinstance(event, TokenEvent) and event.progress is None and bool(event.tokens)


def can_wait(events: list[JobEvent]) -> bool:
    """Events that may wait for the next flush: later tokens of running jobs only."""
    return all(mergeable(e) and e.n_decoded > 1 for _, e in events)  # type: ignore[union-attr]


def coalesce(events: list[JobEvent]) -> list[JobEvent]:
    """Each run of consecutive token events of one job (other jobs' events between them do
    not break it; any other event of the job does) as one event, in the order of its first."""
    out: list[JobEvent] = []
    last: dict[str, int] = {}
    """Per job, the index in `out` of its last event, while that one is mergeable."""
    for job_id, event in events:
        at = last.get(job_id)
        if at is not None and mergeable(event):
            before = out[at][1]
            assert isinstance(before, TokenEvent) and isinstance(event, TokenEvent)
            out[at] = (job_id, merged(before, event))
            continue
        if mergeable(event):
            last[job_id] = len(out)
        else:
            last.pop(job_id, None)
        out.append((job_id, event))
    return out


def merged(first: TokenEvent, then: TokenEvent) -> TokenEvent:
    return TokenEvent(content=first.content + then.content, tokens=first.tokens + then.tokens,
                      timings=then.timings, probs=first.probs + then.probs,
                      n_decoded=then.n_decoded, n_prompt_tokens=then.n_prompt_tokens,
                      post_sampling_probs=then.post_sampling_probs)
