"""The embedder: one thread that decodes the inputs of every embedding and rerank job the worker
holds together, as separate sequences of one llama_decode (llama.cpp's n_seq_max), on a context
made with embeddings on.

Each decode takes waiting sequences in order, online jobs' when there are, else background ones
(batch chunks), as many as fit: at most n_seq_max sequences and n_batch tokens (an embedding
worker's logical batch is its physical one, as llama-server forces it). A sequence is decoded
whole in one decode, so a job is done once each of its sequences went through one. The context
keeps nothing between decodes.

Online work does not wait for a decode of background sequences: it aborts it (llama.cpp's abort
callback, checked after every graph node) and the background sequences go back to the front of
their queue. A background decode yields once at most, so a batch always moves on. Two threads
take turns on the context: one decodes online inputs, the other background ones at a lower CPU
priority (`lower_cpu_priority`, worker/runtime/compute_threads.py).

Owns: the threads and their queues, the decodes, reading embeddings back (pooled per sequence or
one row per token), the decode counters. Hands off: tokenizing and the size checks
(worker/embed/inputs.py), what a decode takes (worker/embed/queue.py, by the engine's rule for
prompts that go whole, worker/engine/admission.py), the batch (the engine's StepBatch), media
chunks (the engine's, worker/engine/prefill.py), normalization and the job's answer
(worker/embed/pooling.py), setting the futures (worker/embed/outbox.py, a thread of its own).
Threads: other threads only append to `_waiting`/`_cancelled` and raise the abort flag under
`_wake`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
import time
from collections import deque
from concurrent.futures import Future
from typing import TYPE_CHECKING

import llama_cpp as lc

from scheduler.contract.errors import LlamaqError, ServerError, Unavailable
from scheduler.contract.results import (
    EmbeddingResult,
    RerankResult,
)
from scheduler.registry import WorkerMetrics
from worker.embed.outbox import Outbox
from worker.embed.pooling import Pooling, finished_rows, job_result
from worker.embed.queue import EmbedRequest, Sequence, take_step
from worker.engine.prefill import media_chunks
from worker.engine.step_batch import StepBatch
from worker.runtime.compute_threads import INTERVAL_S, CpuSample, lower_cpu_priority
from worker.runtime.model import LoadedModel
from worker.runtime.thread_trial import ThreadTrial

if TYPE_CHECKING:
    import numpy as np  # for annotations: imported where used, ~19 MiB a worker may never need

log = logging.getLogger(__name__)

POOLING_NAMES: dict[int, Pooling] = {
    lc.LLAMA_POOLING_TYPE_NONE: "none", lc.LLAMA_POOLING_TYPE_MEAN: "mean",
    lc.LLAMA_POOLING_TYPE_CLS: "cls", lc.LLAMA_POOLING_TYPE_LAST: "last",
    lc.LLAMA_POOLING_TYPE_RANK: "rank"}
POOLING_TYPES: dict[str, int] = {name: value for value, name in POOLING_NAMES.items()}
ABORTED = 2
"""llama_decode's status when the abort callback stopped it."""

class AbortFlag:
    """llama.cpp's abort callback without Python: ggml calls it after every graph node, on the
    decoding thread, where a Python callback would take the GIL each time. The callback is
    libc's strlen on a two-byte buffer: "" reads 0 (go on), "\x01" reads 1 (abort); its size_t
    result is 0 or 1, which is the C bool ggml reads."""

    def __init__(self, ctx: lc.llama_context_p) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        self._buffer = ctypes.create_string_buffer(2)
        self._callback = ctypes.cast(libc.strlen, lc.ggml_abort_callback)
        lc.llama_set_abort_callback(ctx, self._callback,
                                    ctypes.cast(self._buffer, ctypes.c_void_p))

    def set(self) -> None:
        self._buffer[0] = b"\x01"

    def clear(self) -> None:
        self._buffer[0] = b"\x00"


class Embedder:
    def __init__(self, model: LoadedModel, trial_threads: bool = False) -> None:
        """`trial_threads`: choose the compute thread count by trying
        (worker/runtime/thread_trial.py); off when the OpenMP wait policy was set by hand."""
        self.model = model
        self._trial = ThreadTrial(model.plan.n_threads_batch) if trial_threads else None
        self._load: CpuSample | None = None
        """The machine's CPU time at the trial's last look (worker/runtime/compute_threads.py)."""
        self.n_seq_max = lc.llama_n_seq_max(model.ctx)
        self.n_batch = lc.llama_n_batch(model.ctx)
        self.pooling_type = lc.llama_pooling_type(model.ctx)
        self.pooling = POOLING_NAMES.get(self.pooling_type, "none")
        self.n_embd_out = lc.llama_model_n_embd_out(model.model)
        self.metrics = WorkerMetrics()
        self._waiting: deque[Sequence] = deque()
        self._background: deque[Sequence] = deque()
        self._cancelled: dict[str, LlamaqError] = {}
        lock = threading.RLock()  # the threads' wake-ups, one each (`_notify`)
        self._wake, self._wake_background = threading.Condition(lock), threading.Condition(lock)
        self._stopping = False
        self._processing = 0
        self._batch = StepBatch(self.n_batch)
        self._outbox = Outbox()
        """Sets the requests' futures off the decode threads (worker/embed/outbox.py)."""
        self._abort = AbortFlag(model.ctx)
        self._decoding = False
        """One of the two threads decodes now (they take turns on the one context)."""
        self._abortable = False
        """The decode under way holds only background sequences that never yielded."""
        self.n_decode_yielded = 0
        """Background decodes aborted for online work."""
        self._threads = [
            threading.Thread(target=self._run, args=(False,), name="llamaq-embedder",
                             daemon=True),
            threading.Thread(target=self._run, args=(True,), name="llamaq-embedder-background",
                             daemon=True)]

    # -- called from other threads -------------------------------------------------------

    def start(self) -> None:
        self._outbox.start()
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Stop both threads and free the batch (again: nothing; an idle sleep stops it
        before the worker's end does)."""
        with self._wake:
            if self._stopping:
                return
            self._stopping = True
            self._notify()
        for thread in self._threads:
            if thread.is_alive():
                thread.join()
        self._outbox.stop()
        self._batch.free()

    def submit(self, request: EmbedRequest) -> Future[EmbeddingResult | RerankResult]:
        """Queue the request's inputs (each must have tokens and no error)."""
        request.left = len(request.inputs)
        if not request.inputs:
            request.future.set_result(self._result(request))
            return request.future
        queue = self._background if request.background else self._waiting
        with self._wake:
            queue.extend(Sequence(request, item) for item in request.inputs)
            self._processing += 1
            if not request.background and self._abortable:
                self._abort.set()
            self._notify()
        return request.future

    def cancel(self, job_id: str, error: LlamaqError | None = None) -> None:
        with self._wake:
            self._cancelled[job_id] = error or Unavailable("cancelled")
            self._notify()

    def yields_to_online(self) -> bool:
        """Whether the decode under way would stop for an online request now."""
        with self._wake:
            return self._abortable

    def metrics_snapshot(self) -> WorkerMetrics:
        with self._wake:
            deferred = len({id(s.request) for s in (*self._waiting, *self._background)})
            processing = self._processing
        return self.metrics.model_copy(update={"requests_processing": processing,
                                               "requests_deferred": deferred})

    # -- the decode threads ----------------------------------------------------------------

    def _run(self, background: bool) -> None:
        """One of the two decode threads: online inputs, or background ones (at a lower CPU
        priority, and only while no online input waits). They take turns on the context."""
        if background:
            lower_cpu_priority()
        wake = self._wake_background if background else self._wake
        while True:
            with self._wake:
                while not (self._stopping or self._ready(background)):
                    wake.wait()
                if self._stopping:
                    self._fail_all(Unavailable("the worker stopped"))
                    return
                self._drop_cancelled()
                step = take_step(self._background if background else self._waiting,
                                 self.n_seq_max, self.n_batch)
                if not step:  # only cancelled inputs were left: the other thread may go on
                    self._notify()
                    continue
                self._decoding = True
                self._abortable = background and not any(
                    s.yielded or s.input.media is not None for s in step)
                self._abort.clear()
            try:
                self._decode(step)
            except Exception as error:  # a bug fails the step's jobs, not the worker
                log.exception("embedding decode failed")
                self._fail(step, ServerError(f"internal error: {error}"))
            finally:
                with self._wake:
                    self._decoding = self._abortable = False
                    self._notify()

    def _notify(self) -> None:
        """Under `_wake`: wake the threads that can go now (not one for nothing: the GIL)."""
        if self._stopping or self._ready(False):
            self._wake.notify()
        if self._stopping or self._ready(True):
            self._wake_background.notify()

    def _ready(self, background: bool) -> bool:
        """Under `_wake`: whether the thread has something to do now."""
        if self._decoding:
            return False
        if background:
            return bool(self._background) and not self._waiting
        return bool(self._waiting or self._cancelled)

    def _drop_cancelled(self) -> None:
        """Under `_wake`: forget the waiting sequences of cancelled jobs; end those jobs."""
        if not self._cancelled:
            return
        cancelled, self._cancelled = self._cancelled, {}
        for queue in (self._waiting, self._background):
            kept = [s for s in queue if s.request.job.job_id not in cancelled]
            for sequence in queue:
                request = sequence.request
                if request.job.job_id in cancelled and \
                        self._outbox.settle(request, cancelled[request.job.job_id]):
                    self._processing -= 1
            queue.clear()
            queue.extend(kept)

    def _decode(self, step: list[Sequence]) -> None:
        if step[0].input.media is not None:
            self._decode_media(step[0])
            return
        n = 0
        for seq_id, sequence in enumerate(step):
            n = self._batch.put_span(n, sequence.input.tokens, 0, seq_id, True, False)
        started = time.perf_counter()
        status = lc.llama_decode(self.model.ctx, self._batch.view(0, n))
        elapsed = time.perf_counter() - started
        with self._wake:  # before any result goes out
            self._abortable = False
        if status == ABORTED:
            self._yield(step)
            return
        if status != 0:
            lc.llama_memory_clear(self.model.memory, True)
            self._fail(step, ServerError(f"llama_decode failed with status {status}"))
            return
        self._retime(n, elapsed)
        m = self.metrics
        m.n_decode_total += 1
        m.n_busy_slots_total += len(step)
        m.prompt_tokens_total += n
        m.prompt_seconds_total += elapsed
        m.n_tokens_max = max(m.n_tokens_max, max(len(s.input.tokens) for s in step))
        offset = 0
        for seq_id, sequence in enumerate(step):
            rows = self._read(seq_id, offset, len(sequence.input.tokens))
            offset += len(sequence.input.tokens)
            self._done(sequence, rows)
        lc.llama_memory_clear(self.model.memory, True)  # memory-less models: a no-op

    def _retime(self, n_tokens: int, seconds: float) -> None:
        """A decode's timing to the thread trial; its count applied when it changes. Only the
        decoding thread calls this (the two take turns)."""
        if self._trial is None:
            return
        now = time.monotonic()
        if self._load is None or now - self._load.at_s >= INTERVAL_S:
            sample = CpuSample.read(now)
            if self._load is not None and sample is not None:
                self._trial.observe_load(sample.others_cores(self._load))
            self._load = sample
        threads = self._trial.record(n_tokens, seconds, now)
        if threads is not None:
            lc.llama_set_n_threads(self.model.ctx, threads, threads)
            log.info("embedding with %d thread(s) (trial %d)", threads, self._trial.trials)

    def _decode_media(self, sequence: Sequence) -> None:
        """An input with media, alone in sequence 0, as llama-server's slot decodes it: its
        text pieces and media chunks in order into the KV cache (a media chunk's embeddings in
        decodes of their own: the engine's media_chunks, worker/engine/prefill.py), every text
        token an output. The answer is what the last decode gives, as llama-server reads it
        after the prompt's last batch: pooled over the text after the last media chunk (that
        text attends to everything before it), or with pooling none one row per token of that
        text."""
        media, tokens = sequence.input.media, sequence.input.tokens
        projector = self.model.projector
        assert media is not None
        if projector is None:
            self._fail([sequence], ServerError("this worker has no multimodal projector"))
            return
        ctx, batch = self.model.ctx, self._batch
        started = time.perf_counter()
        pos, n_last = 0, 0
        try:
            while pos < len(tokens):
                for span in media_chunks(projector, ctx, media, pos, 0, self.n_batch):
                    pos, n_last = span.end, 0
                if pos == len(tokens):
                    break
                end = media.text_end(pos)  # M-RoPE chunks take fewer positions than tokens
                batch.put_span(0, tokens[pos:end], media.pos_of(pos), 0, True, False)
                status = lc.llama_decode(ctx, batch.view(0, end - pos))
                if status != 0:
                    raise ServerError(f"llama_decode failed with status {status}")
                pos, n_last = end, end - pos
            if n_last == 0:  # the tokenizer refuses a prompt that ends with media
                raise ServerError("an input with media must end with text")
            rows = self._read(0, 0, n_last)
        except LlamaqError as error:
            lc.llama_memory_clear(self.model.memory, True)
            self._fail([sequence], error)
            return
        elapsed = time.perf_counter() - started
        lc.llama_memory_clear(self.model.memory, True)
        m = self.metrics
        m.n_decode_total += 1
        m.n_busy_slots_total += 1
        m.prompt_tokens_total += len(tokens)
        m.prompt_seconds_total += elapsed
        m.n_tokens_max = max(m.n_tokens_max, len(tokens))
        self._done(sequence, rows)

    def _yield(self, step: list[Sequence]) -> None:
        """An aborted background decode: its sequences go back to the front of their queue,
        in order, not to yield again."""
        lc.llama_memory_clear(self.model.memory, True)
        self.n_decode_yielded += 1
        for sequence in step:
            sequence.yielded = True
        with self._wake:
            self._background.extendleft(reversed(step))

    def _read(self, seq_id: int, offset: int, n_tokens: int) -> np.ndarray:
        """The sequence's pooled embedding (one row), or one row per token with pooling none."""
        import numpy as np

        ctx, width = self.model.ctx, self.n_embd_out
        if self.pooling_type == lc.LLAMA_POOLING_TYPE_NONE:
            rows = []
            for i in range(offset, offset + n_tokens):
                pointer = lc.llama_get_embeddings_ith(ctx, i)
                rows.append(_floats(pointer, width))
            return np.stack(rows)
        pointer = lc.llama_get_embeddings_seq(ctx, seq_id)
        if self.pooling_type == lc.LLAMA_POOLING_TYPE_RANK:
            width = max(1, lc.llama_model_n_cls_out(self.model.model))
        return _floats(pointer, width)[None, :]

    def _done(self, sequence: Sequence, rows: np.ndarray) -> None:
        request = sequence.request
        if request.settled:  # cancelled meanwhile
            return
        pooled = self.pooling_type != lc.LLAMA_POOLING_TYPE_NONE
        request.rows[sequence.input.index] = finished_rows(rows, pooled, request.job,
                                                           request.normalize)
        request.left -= 1
        if request.left == 0:
            with self._wake:
                self._processing -= 1
            self._outbox.settle(request, self._result(request))

    def _result(self, request: EmbedRequest) -> EmbeddingResult | RerankResult:
        n_tokens = {item.index: len(item.tokens) for item in request.inputs}
        return job_result(request.job, self.pooling, n_tokens, request.rows, request.errors)

    def _fail(self, step: list[Sequence], error: LlamaqError) -> None:
        for request in {id(s.request): s.request for s in step}.values():
            if self._outbox.settle(request, error):
                with self._wake:
                    self._processing -= 1

    def _fail_all(self, error: LlamaqError) -> None:
        """Under `_wake`."""
        for queue in (self._waiting, self._background):
            for sequence in queue:
                self._outbox.settle(sequence.request, error)
            queue.clear()


def _floats(pointer: ctypes._Pointer[ctypes.c_float] | None, width: int) -> np.ndarray:
    import numpy as np

    if not pointer:
        raise ServerError("failed to get embeddings")
    return np.ctypeslib.as_array(pointer, shape=(width,)).copy()
