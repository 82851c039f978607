"""Where the embedder's requests get their answers: a thread of its own sets each request's
future, so that the decode threads never do.

Setting a future that an event loop waits on writes to that loop's self-pipe: a system call,
during which the event loop's thread takes the GIL, and the decode thread then waits for it
(up to the interpreter's switch interval) before its next llama.cpp call. A profile of an
embedding worker at one input a request found 14 % of the decode thread's samples there. The
decode thread hands the answer over through a SimpleQueue instead (its put makes no system call
that gives up the GIL) and goes on; this thread takes the GIL while the next decode runs.

Owns: which requests are answered (each once, in the order they were settled), the thread.
"""

from __future__ import annotations

import threading
from concurrent.futures import InvalidStateError
from contextlib import suppress
from queue import SimpleQueue

from scheduler.contract.errors import LlamaqError
from scheduler.contract.results import EmbeddingResult, RerankResult
from worker.embed.queue import EmbedRequest

Answer = EmbeddingResult | RerankResult | LlamaqError


class Outbox:
    def __init__(self) -> None:
        self._queue: SimpleQueue[tuple[EmbedRequest, Answer] | None] = SimpleQueue()
        self._lock = threading.Lock()
        """Guards `settled` (the two decode threads may settle one request's fate)."""
        self._thread = threading.Thread(target=self._run, name="llamaq-embedder-answers",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """After the decode threads ended: every answer handed over is set, then the thread
        ends."""
        self._queue.put(None)
        if self._thread.is_alive():
            self._thread.join()

    def settle(self, request: EmbedRequest, answer: Answer) -> bool:
        """The request's answer, set soon on this outbox's thread; False (nothing done) when
        it had one already."""
        with self._lock:
            if request.settled:
                return False
            request.settled = True
        self._queue.put((request, answer))
        return True

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            request, answer = item
            with suppress(InvalidStateError):  # a caller's own cancel() of the future
                if isinstance(answer, LlamaqError):
                    request.future.set_exception(answer)
                else:
                    request.future.set_result(answer)
