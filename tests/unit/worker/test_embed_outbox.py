"""The embedder's answers (worker/embed/outbox.py): each request settled once, its future set
on the outbox's thread, in order, all of them by the time it stops."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from scheduler.contract.errors import Unavailable
from scheduler.contract.jobs import EmbeddingJob
from scheduler.contract.results import EmbeddingResult
from worker.embed.outbox import Outbox
from worker.embed.queue import EmbedRequest


def request(job_id: str) -> EmbedRequest:
    return EmbedRequest(EmbeddingJob(job_id=job_id, model="m", inputs=["x"]), [], 2)


def test_a_request_is_answered_once_on_the_outbox_thread_in_order() -> None:
    outbox = Outbox()
    outbox.start()
    first, second, failed = request("a"), request("b"), request("c")
    order: list[tuple[str, str]] = []

    def seen(job_id: str) -> Callable[[object], None]:
        return lambda _: order.append((job_id, threading.current_thread().name))

    for item in (first, second, failed):
        item.future.add_done_callback(seen(item.job.job_id))
    answer = EmbeddingResult(pooling="mean", items=[])
    assert outbox.settle(first, answer)
    assert not outbox.settle(first, Unavailable("cancelled"))  # it had its answer
    assert outbox.settle(second, answer)
    assert outbox.settle(failed, Unavailable("the worker stopped"))
    assert not outbox.settle(failed, answer)
    outbox.stop()
    assert first.future.result(timeout=0) is answer and second.future.result(timeout=0) is answer
    with pytest.raises(Unavailable):
        failed.future.result(timeout=0)
    assert order == [("a", "llamaq-embedder-answers"), ("b", "llamaq-embedder-answers"),
                     ("c", "llamaq-embedder-answers")]


def test_a_future_its_caller_cancelled_does_not_stop_the_answers() -> None:
    outbox = Outbox()
    outbox.start()
    gone, kept = request("a"), request("b")
    assert gone.future.cancel()
    answer = EmbeddingResult(pooling="mean", items=[])
    outbox.settle(gone, answer)
    outbox.settle(kept, answer)
    outbox.stop()
    assert kept.future.result(timeout=0) is answer
