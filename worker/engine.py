"""The slot engine: one thread, one llama_context, N slots decoded together (continuous batching).

Requests join and leave between two decode steps. Each step builds one llama_batch with one token
per generating slot and prompt chunks of slots in prefill, decodes it, samples every slot that
needs a token, and hands the step's events to the sink in one call.

Owns: the engine thread and its loop; the KV cache moves of a run's start (prefix reuse, copying
another slot's prefix, --cache-reuse shifts) and of a context shift; building and decoding the
batch (and retrying it smaller when the KV cache is full); sampling and token probabilities; a
run's result and release; the worker's metrics and the slots' report.
Hands off: which request gets which slot and how a step's budget is shared (worker/admission.py),
when a run stops (worker/stopping.py), a run's state and timings (worker/slot_run.py), sampler
chains (worker/sampling.py), turning a job into a Request (worker/requests.py), slot snapshots
(worker/snapshots.py).
Threads: other threads only append to `_arrivals`/`_cancelled`/`_end_reasoning`/`_slot_tasks`
under `_wake`; the engine thread holds that lock only to take them, never across llama.cpp calls.
"""

from __future__ import annotations

import ctypes
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

import llama_cpp as lc
import numpy as np

from scheduler.contract.errors import (
    InvalidRequest,
    LlamaqError,
    ServerError,
    Unavailable,
)
from scheduler.contract.jobs import CompletionJob, SamplingSettings
from scheduler.contract.results import (
    Candidate,
    CompletionResult,
    ErrorEvent,
    FinalEvent,
    GenerationSettings,
    StartedEvent,
    Timings,
    TokenBias,
    TokenEvent,
    TokenProbs,
)
from scheduler.registry import NextToken, SlotState, WorkerMetrics
from worker.admission import Admission, DecodeSpeed, prompt_chunks
from worker.decision_plan import DecisionRequest
from worker.decisions import DecisionRunner
from worker.model import LoadedModel
from worker.reasoning import ReasoningTracker
from worker.requests import EngineDefaults, Request, prepare_request
from worker.sampling import token_probabilities
from worker.slot_run import SlotRun
from worker.slots import SlotCache, reusable_prefix, reuse_chunks
from worker.stopping import StepState, StopReason, StopType, indent_cut, stop_reason
from worker.textstream import TextStream

log = logging.getLogger(__name__)

SlotResult = TypeVar("SlotResult")
SHARE_MIN_TOKENS = 16
"""Copying another slot's cache (a whole KV stream when slots do not share one) pays off
from about this many prompt tokens."""
JobEvent = tuple[str, TokenEvent | FinalEvent | ErrorEvent | StartedEvent]
EventSink = Callable[[list[JobEvent]], None]
"""Called from the engine thread once per step with that step's events, in order."""


class Engine:
    def __init__(self, model: LoadedModel, defaults: EngineDefaults, sink: EventSink) -> None:
        self.model = model
        self.defaults = defaults
        self._sink = sink
        self.slots = [SlotCache(i) for i in range(model.plan.n_slots)]
        self._active: dict[int, SlotRun] = {}
        self._previous: dict[int, SlotRun] = {}
        self._tasks_started = 0
        self.metrics = WorkerMetrics()
        self.speed = DecodeSpeed()
        self.on_slots_changed: Callable[[], None] = lambda: None
        """Called (from the engine thread) when a slot starts or ends a request."""
        self._arrivals: deque[Request] = deque()
        """Submitted, not yet seen by the engine thread (guarded by _wake)."""
        self._admission: Admission[Request] = Admission()
        """Requests waiting for a slot (the engine thread's alone)."""
        self._admission_lock = threading.Lock()
        """Held by the engine thread while it moves arrivals into admission and decides (pure
        Python, no llama.cpp), and by withdraw_waiting; taken before `_wake`."""
        self._cancelled: set[str] = set()
        self._cancel_errors: dict[str, LlamaqError] = {}
        self._end_reasoning: set[str] = set()
        self._slot_tasks: deque[tuple[int, Callable[[SlotCache], Any], Future[Any]]] = deque()
        self._wake = threading.Condition()
        self._stopping = False
        self._batch = lc.llama_batch_init(model.plan.n_batch, 0, 1)
        self.decisions = DecisionRunner(model, self.metrics, self._wake, defaults.worker_id,
                                        defaults.model_alias, self._cancel_event,
                                        lambda: self.on_slots_changed())
        """Decision jobs (/v1/systemone): their tokens join each step's batch."""
        self._thread = threading.Thread(target=self._run, name="llamaq-engine", daemon=True)

    # -- called from other threads -------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            if self._stopping:
                return  # stopped already (a worker that went to sleep)
            self._stopping = True
            self._wake.notify()
        self._thread.join()
        lc.llama_batch_free(self._batch)

    def prepare(self, job: CompletionJob) -> Request:
        return prepare_request(job, self.model, self.defaults, len(self.slots))

    def submit(self, request: Request) -> None:
        with self._wake:
            self._arrivals.append(request)
            self._wake.notify()

    def cancel(self, job_id: str, error: LlamaqError | None = None) -> None:
        """Free the job's slot; its last event is `error` (default: "cancelled")."""
        with self._wake:
            self._cancelled.add(job_id)
            if error is not None:
                self._cancel_errors[job_id] = error
            self._wake.notify()

    def withdraw_waiting(self) -> list[Request | DecisionRequest]:
        """Take back every request that waits for a slot (a draining worker hands them to
        another); no event is sent for them."""
        with self._admission_lock:
            with self._wake:
                arrivals, self._arrivals = list(self._arrivals), deque()
            waiting = [*self._admission.waiting, *arrivals]
            self._admission.waiting.clear()
            decisions = self.decisions.withdraw()
        for request in waiting:
            request.sampler.free()
        return [*waiting, *decisions]

    def end_reasoning(self, job_id: str) -> None:
        """/v1/chat/completions/control: force the end of the job's thinking block."""
        with self._wake:
            self._end_reasoning.add(job_id)
            self._wake.notify()

    def run_on_slot(self, slot_id: int,
                    action: Callable[[SlotCache], SlotResult]) -> Future[SlotResult]:
        """Run `action` on the engine thread once the slot is idle (save, restore, erase)."""
        if not 0 <= slot_id < len(self.slots):
            raise InvalidRequest("Invalid slot ID")
        future: Future[SlotResult] = Future()
        with self._wake:
            self._slot_tasks.append((slot_id, action, future))
            self._wake.notify()
        return future

    def busy_slots(self) -> int:
        return len(self._active)

    def slot_jobs(self) -> list[CompletionJob | None]:
        """Per slot, the job whose prompt its cache begins with, for cache-aware routing (read
        from another thread): the running one (its prompt is going in), else the last one
        unless the cache was emptied since."""
        held = []
        for slot in self.slots:
            run = self._active.get(slot.slot_id)
            if run is None and slot.tokens:
                run = self._previous.get(slot.slot_id)
            held.append(run.request.job if run is not None else None)
        return held

    # -- the engine thread ---------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._wake:  # held only to take what other threads handed over
                while (not self._stopping and not self._active and not self._arrivals
                       and not self._admission.waiting and not self._slot_tasks
                       and not self.decisions.has_work()):
                    self._wake.wait()
                if self._stopping:
                    return
                cancelled, self._cancelled = self._cancelled, set()
                end_reasoning, self._end_reasoning = self._end_reasoning, set()
            events: list[JobEvent] = []
            self._admit(cancelled, events)
            with self._admission_lock:
                self.decisions.admit(self.slots, cancelled, not self._admission.waiting, events)
            if events:  # "started" goes out before the prompt is evaluated
                self._sink(events)
                events = []
            self._run_slot_tasks()
            self._drop_cancelled(cancelled, events)
            for active in self._active.values():
                if active.reasoning is not None and active.request.job.job_id in end_reasoning:
                    active.reasoning.request_end(self.model.vocab)
            if self._active or self.decisions.runs:
                self._step(events)
            if events:
                self._sink(events)

    def _run_slot_tasks(self) -> None:
        """Slot actions whose slot is idle now; the others wait for it (as llama-server
        defers them)."""
        with self._wake:
            ready = [t for t in self._slot_tasks if not self.slots[t[0]].busy]
            for task in ready:
                self._slot_tasks.remove(task)
        for slot_id, action, future in ready:
            try:
                future.set_result(action(self.slots[slot_id]))
            except Exception as error:  # handed to the waiting job, not lost
                future.set_exception(error)
        if ready:
            self.on_slots_changed()

    def _admit(self, cancelled: set[str], events: list[JobEvent]) -> None:
        """Start the requests admission lets in (worker/admission.py) on their slots."""
        with self._admission_lock:
            with self._wake:
                arrivals, self._arrivals = self._arrivals, deque()
            self._admission.arrive(arrivals)
            decision = self._admission.admit(
                self.slots, cancelled, len(self._active),
                [a.request.prompt_tokens for a in self._active.values() if a.prefilling],
                self.defaults.cont_batching)
        for request in decision.cancelled:
            request.sampler.free()
            events.append((request.job.job_id, self._cancel_event(request.job.job_id)))
        for request, slot in decision.admitted:
            self.on_slots_changed()
            self._tasks_started += 1
            active = self._start(request, slot, self._tasks_started)
            self._active[slot.slot_id] = active
            events.append((request.job.job_id, StartedEvent()))
            if request.job.stream and request.job.return_progress:  # the 0 % event
                events.append((request.job.job_id, active.progress(active.t_start)))

    def _share_prefix(self, slot: SlotCache, prompt: list[int], n_reuse: int) -> int:
        """Copy another slot's cache when it holds more of the prompt than this slot does
        (worth it from SHARE_MIN_TOKENS more tokens); returns the new reusable length."""
        donors = [(reusable_prefix(s.tokens, prompt, True), s) for s in self.slots
                  if s is not slot]
        n_shared, donor = max(donors, key=lambda d: d[0], default=(0, slot))
        if n_shared < n_reuse + SHARE_MIN_TOKENS:
            return n_reuse
        memory = self.model.memory
        lc.llama_memory_seq_rm(memory, slot.slot_id, -1, -1)
        lc.llama_memory_seq_cp(memory, donor.slot_id, slot.slot_id, -1, -1)
        slot.tokens[:] = donor.tokens
        return n_shared

    def _start(self, request: Request, slot: SlotCache, task_no: int) -> SlotRun:
        n_reuse = reusable_prefix(slot.tokens, request.prompt_tokens, request.cache_prompt)
        if request.cache_prompt:
            n_reuse = self._share_prefix(slot, request.prompt_tokens, n_reuse)
        if request.cache_reuse > 0 and request.cache_prompt:
            n_reuse = self._reuse_chunks(slot, request.prompt_tokens, n_reuse,
                                         request.cache_reuse)
        if not lc.llama_memory_seq_rm(self.model.memory, slot.slot_id, n_reuse, -1):
            lc.llama_memory_seq_rm(self.model.memory, slot.slot_id, -1, -1)
            n_reuse = 0
        del slot.tokens[n_reuse:]
        log.debug("job %s: slot %d, %d prompt tokens, %d cached", request.job.job_id,
                  slot.slot_id, len(request.prompt_tokens), n_reuse)
        spec = request.job.reasoning
        return SlotRun(request, slot, TextStream(request.stop), task_no,
                      n_cached=n_reuse, t_start=time.perf_counter(), prompt_done=n_reuse,
                      reasoning=ReasoningTracker.start(spec) if spec else None)

    def _reuse_chunks(self, slot: SlotCache, prompt: list[int], n_past: int,
                      min_chunk: int) -> int:
        """Shift reusable chunks of the slot's cache to their place in the new prompt
        (llama-server's n_cache_reuse); returns how many prompt tokens are now cached."""
        memory, seq = self.model.memory, slot.slot_id
        if not lc.llama_memory_can_shift(memory):
            return n_past
        for head_c, head_p, n in reuse_chunks(slot.tokens, prompt, n_past, min_chunk):
            lc.llama_memory_seq_rm(memory, seq, head_p, head_c)
            lc.llama_memory_seq_add(memory, seq, head_c, head_c + n, head_p - head_c)
            slot.tokens[head_p : head_p + n] = prompt[head_p : head_p + n]
            n_past = head_p + n
        return n_past

    def _drop_cancelled(self, cancelled: set[str], events: list[JobEvent]) -> None:
        for slot_id, active in list(self._active.items()):
            if active.request.job.job_id in cancelled:
                log.info("job %s: cancelled, slot %d freed", active.request.job.job_id, slot_id)
                events.append((active.request.job.job_id,
                               self._cancel_event(active.request.job.job_id)))
                self._release(active)

    def _step(self, events: list[JobEvent]) -> None:
        """One decode: a token for each generating run, then prompt tokens, each part in
        slot order (llama-server's), since without a unified KV cache llama.cpp puts only
        consecutive sequence ids in one ubatch (llama_batch_allocr::split_equal): slots in
        the order their requests arrived cost one graph computation per break in the order.
        Batch lines (background jobs) sit the step out while an online prompt is evaluated,
        and their prompts go in parts (DecodeSpeed), so an online request waits little."""
        n = 0
        runs = sorted(self._active.values(), key=lambda a: a.slot.slot_id)
        for active in runs:
            active.batch_index = active.last_prompt_index = -1
        if any(a.prefilling and not a.request.job.background for a in runs):
            runs = [a for a in runs if not a.request.job.background]
        for active in runs:
            if not active.prefilling:
                n = self._add(n, active.next_token, len(active.slot.tokens), active, True)
        n_batch = self.model.plan.n_batch
        online = [a for a in runs if a.prefilling and not a.request.job.background]
        background = [a for a in runs if a.prefilling and a.request.job.background]
        ends = prompt_chunks(n, [(a.prompt_done, len(a.request.prompt_tokens))
                                 for a in online], n_batch)
        n_online = n + sum(end - a.prompt_done for a, end in zip(online, ends, strict=True))
        ends += prompt_chunks(0, [(a.prompt_done, len(a.request.prompt_tokens))
                                  for a in background],
                              min(n_batch - n_online, self.speed.background_prompt_tokens(n_batch)))
        prefilling = online + background
        for active, end in zip(prefilling, ends, strict=True):
            if end == active.prompt_done:
                continue
            prompt = active.request.prompt_tokens
            for pos in range(active.prompt_done, end):
                n = self._add(n, prompt[pos], pos, active, pos == len(prompt) - 1)
            active.last_prompt_index = n - 1
            active.prompt_done = end
        n = self.decisions.fill(self._batch, n, self.model.plan.n_batch)
        self.metrics.n_busy_slots_total += len(self._active)
        self._decode(n, events)

    def _decode(self, n: int, events: list[JobEvent]) -> None:
        """Decode the step's batch; when the KV cache has no room, free an idle slot's cache
        (unified KV) or retry in smaller views, and end every request with llama-server's
        message when not even one token fits."""
        off, n_view = 0, n
        while off < n:
            size = min(n_view, n - off)
            started = time.perf_counter()
            rc = lc.llama_decode(self.model.ctx, self._view(off, size))
            if rc == 0:
                self.speed.add(time.perf_counter() - started, size)
            if rc == 1 and self._clear_idle_slot():
                continue
            if rc == 1 and size > 1:
                n_view = size // 2
                log.warning("no room in the KV cache for %d tokens, retrying with %d",
                            size, n_view)
                continue
            if rc != 0:
                self._fail_all(ServerError(decode_error_message(rc)), events)
                return
            self.metrics.n_decode_total += 1
            self._after_view(off, size, events)
            self.decisions.after_view(off, size, events)
            off += size

    def _view(self, off: int, size: int) -> lc.llama_batch:
        """Tokens [off, off + size) of the step's batch, as a batch of their own."""
        batch = self._batch
        if off == 0:
            batch.n_tokens = size
            return batch
        return lc.llama_batch(
            n_tokens=size, token=_at(batch.token, off, ctypes.c_int32), embd=batch.embd,
            pos=_at(batch.pos, off, ctypes.c_int32), n_seq_id=_at(batch.n_seq_id, off,
                                                                    ctypes.c_int32),
            seq_id=_at(batch.seq_id, off, ctypes.c_void_p),
            logits=_at(batch.logits, off, ctypes.c_int8))

    def _clear_idle_slot(self) -> bool:
        """Unified KV: drop the cache of one idle slot to make room (llama-server's
        try_clear_idle_slots); False when there is none to drop."""
        if not self.model.plan.kv_unified:
            return False
        for slot in self.slots:
            if not slot.busy and slot.tokens:
                log.warning("purging slot %d with %d tokens", slot.slot_id, len(slot.tokens))
                lc.llama_memory_seq_rm(self.model.memory, slot.slot_id, -1, -1)
                slot.tokens.clear()
                return True
        return False

    def _after_view(self, off: int, size: int, events: list[JobEvent]) -> None:
        """Progress and sampling for the requests whose tokens were in the decoded view."""
        now = time.perf_counter()
        for active in list(self._active.values()):
            job = active.request.job
            if off <= active.last_prompt_index < off + size:
                active.t_prompt_last = now
                if job.return_progress and job.stream:
                    events.append((job.job_id, active.progress(now)))
            if not off <= active.batch_index < off + size:
                continue
            if not active.t_prompt_done:
                active.t_prompt_done = active.t_prompt_last = now
            if active.request.n_predict == 0:  # evaluate the prompt into the cache, no tokens
                self._finish(active, StopType.LIMIT, now, events)
                continue
            try:
                token, probs = self._sample(active, active.batch_index - off)
                self._on_token(active, token, probs, now, events)
            except Exception as error:  # one request's failure must not stop the engine
                self._fail_one(active, error, events)

    def _sample(self, active: SlotRun, index: int) -> tuple[int, TokenProbs | None]:
        """The next token (from the logits at `index` of the last decoded view), and its
        probabilities when the request asked for n_probs."""
        job = active.request.job
        ctx = self.model.ctx
        post = job.n_probs > 0 and job.post_sampling_probs
        forced = active.reasoning.next_forced() if active.reasoning else None
        if forced is not None:  # the end of a thinking block, cut short
            active.request.sampler.accept_prompt([forced])
            return forced, None
        token, candidates = active.request.sampler.sample(ctx, index, with_candidates=post)
        if job.n_probs <= 0:
            return token, None
        if not post:
            probs = token_probabilities(ctx, index, self.model.vocab.n_tokens)
            top_ids = np.argsort(-probs)[: job.n_probs]
            candidates = [(int(t), float(probs[t])) for t in top_ids]
            chosen = float(probs[token])
        else:
            chosen = next((p for t, p in candidates if t == token), 0.0)
            candidates = [(t, p) for t, p in candidates[: job.n_probs] if p > 0.0]
        top = [self._candidate(t, p) for t, p in candidates]
        return token, TokenProbs(id=token, token="", bytes=[], p=chosen, top=top)

    def _candidate(self, token: int, p: float) -> Candidate:
        piece = self.model.vocab.piece(token, self.defaults.special)
        return Candidate(id=token, token=valid_utf8_prefix(piece), bytes=list(piece), p=p)

    def _add(self, n: int, token: int, pos: int, active: SlotRun, logits: bool) -> int:
        batch = self._batch
        batch.token[n] = token
        batch.pos[n] = pos
        batch.n_seq_id[n] = 1
        batch.seq_id[n][0] = active.slot.slot_id
        batch.logits[n] = logits
        active.slot.tokens.append(token)
        if logits:
            active.batch_index = n
        return n + 1

    def _on_token(self, active: SlotRun, token: int, probs: TokenProbs | None, now: float,
                  events: list[JobEvent]) -> None:
        request = active.request
        active.generated.append(token)
        active.next_token = token
        is_eog = self.model.vocab.is_eog(token)
        ends = is_eog and not request.sampling.ignore_eos
        content = active.text.push(b"" if ends else self.model.vocab.piece(token,
                                                                          self.defaults.special))
        if active.reasoning is not None:
            active.reasoning.after_token(active.text.text, self.model.vocab)
        if "\n" in content:
            active.has_new_line = True
        reason = self._stop_reason(active, is_eog, now)
        if reason is not None:
            content += active.text.finish()
        if probs is not None:
            probs.token = content
            probs.bytes = list(content.encode())
            active.probs.append(probs)
        if request.job.stream:
            timings = active.timings(now) if request.job.timings_per_token else None
            events.append((request.job.job_id, TokenEvent(
                content=content, tokens=[token], timings=timings,
                n_decoded=len(active.generated), n_prompt_tokens=len(request.prompt_tokens),
                probs=[probs] if probs is not None else [],
                post_sampling_probs=request.job.post_sampling_probs)))
        if reason is not None:
            self._finish(active, reason.stop_type, now, events)

    def _stop_reason(self, active: SlotRun, is_eog: bool, now: float) -> StopReason | None:
        """The stop rules (worker/stopping.py) on this run's state; shifts the context first
        when it is full and --context-shift is on; cuts the text for n_indent."""
        request = active.request
        context_full = len(active.slot.tokens) + 1 >= self.model.n_ctx_slot
        predict_left = request.n_predict < 0 or len(active.generated) < request.n_predict
        if context_full and predict_left and not (is_eog and not request.sampling.ignore_eos) \
                and not active.text.stopping_word:
            active.truncated = True
            context_full = not (self.defaults.context_shift and self._shift_context(active))
        cut, line_start = indent_cut(active.text.text, active.line_start, request.job.n_indent)
        reason = stop_reason(StepState(
            is_eog=is_eog, ignore_eos=request.sampling.ignore_eos,
            stopping_word=bool(active.text.stopping_word), n_generated=len(active.generated),
            n_predict=request.n_predict, context_full=context_full,
            elapsed_ms=(now - active.t_prompt_done) * 1000,
            t_max_predict_ms=request.job.t_max_predict_ms, has_new_line=active.has_new_line,
            under_indented=cut is not None))
        if reason is StopReason.N_INDENT and cut is not None:
            active.text.text = active.text.text[:cut]
        active.line_start = line_start
        return reason

    def _finish(self, active: SlotRun, stop_type: StopType, now: float,
                events: list[JobEvent]) -> None:
        result = self._result(active, stop_type, now)
        self._count(result.timings, len(active.slot.tokens))
        events.append((active.request.job.job_id, FinalEvent(result=result)))
        self._release(active)

    def _count(self, timings: Timings, n_tokens: int) -> None:
        metrics = self.metrics
        metrics.prompt_tokens_total += timings.prompt_n
        metrics.prompt_seconds_total += timings.prompt_ms / 1000
        metrics.tokens_predicted_total += timings.predicted_n
        metrics.tokens_predicted_seconds_total += timings.predicted_ms / 1000
        metrics.n_tokens_max = max(metrics.n_tokens_max, n_tokens)

    def metrics_snapshot(self) -> WorkerMetrics:
        return self.metrics.model_copy(update={"requests_processing": len(self._active)
                                               + len(self.decisions.runs),
                                               "requests_deferred": len(self._arrivals)
                                               + len(self._admission.waiting)})

    def _shift_context(self, active: SlotRun) -> bool:
        """--context-shift: keep the first n_keep tokens, drop half of the rest, move the
        remainder back (llama-server's rule). False when the cache cannot shift."""
        memory, seq = self.model.memory, active.slot.slot_id
        if not lc.llama_memory_can_shift(memory):
            return False
        tokens = active.slot.tokens
        n_keep = active.request.n_keep
        n_keep = len(active.request.prompt_tokens) if n_keep < 0 else n_keep
        n_keep = min(n_keep, self.model.n_ctx_slot - 4)
        n_left = len(tokens) - n_keep
        n_discard = active.request.n_discard or n_left // 2
        n_discard = max(0, min(n_discard, n_left - 1))
        lc.llama_memory_seq_rm(memory, seq, n_keep, n_keep + n_discard)
        lc.llama_memory_seq_add(memory, seq, n_keep + n_discard, len(tokens), -n_discard)
        del tokens[n_keep : n_keep + n_discard]
        log.debug("job %s: context shift, %d tokens dropped", active.request.job.job_id,
                  n_discard)
        return True

    def _result(self, active: SlotRun, stop_type: StopType, now: float) -> CompletionResult:
        request = active.request
        job = request.job
        stream = job.stream
        return CompletionResult(
            worker_id=self.defaults.worker_id,
            content="" if stream else active.text.text,
            tokens=[] if stream or not job.return_tokens else active.generated,
            id_slot=active.slot.slot_id,
            model=self.defaults.model_alias,
            prompt=self.model.vocab.detokenize(request.prompt_tokens),
            stop_type=stop_type.value,
            stopping_word=active.text.stopping_word,
            truncated=active.truncated,
            has_new_line=active.has_new_line,
            tokens_predicted=len(active.generated),
            tokens_evaluated=len(request.prompt_tokens),
            tokens_cached=len(active.slot.tokens),
            generation_settings=self._settings(active),
            timings=active.timings(now),
            probs=[] if stream else active.probs,
            post_sampling_probs=job.post_sampling_probs,
        )

    def _settings(self, active: SlotRun) -> GenerationSettings:
        if active.settings is None:
            active.settings = self._report_settings(active.request)
        return active.settings

    def _report_settings(self, request: Request) -> GenerationSettings:
        job = request.job
        return self.generation_settings(
            request.sampling, n_predict=request.n_predict, stop=request.stop, stream=job.stream,
            timings_per_token=job.timings_per_token, n_keep=request.n_keep,
            n_discard=request.n_discard, n_probs=job.n_probs,
            logit_bias=[TokenBias(token=t, bias=None if math.isinf(b) else b)
                        for t, b in request.logit_bias])

    def generation_settings(self, sampling: SamplingSettings, **report: Any) -> GenerationSettings:
        """What ran: the resolved sampling settings dumped as they are, and the rest."""
        return GenerationSettings(**sampling.model_dump(), **report,
                                  max_tokens=report["n_predict"], n_ctx=self.model.n_ctx_slot,
                                  model=self.defaults.model_alias)

    def default_settings(self) -> GenerationSettings:
        d = self.defaults
        bans = self.model.vocab.eog_tokens if d.sampling.ignore_eos else []  # --ignore-eos
        return self.generation_settings(d.sampling, n_predict=d.n_predict, stop=list(d.stop),
                                        stream=False, timings_per_token=False, n_keep=d.n_keep,
                                        logit_bias=[TokenBias(token=t, bias=None) for t in bans])

    def slot_states(self) -> list[SlotState]:
        """A snapshot for /slots (read from another thread: only plain attribute reads).
        A slot that ended its request reads as llama-server's after release: its counters
        reset (n_remain -1, n_decoded 0), its last task's id and parameters kept."""
        states = []
        for slot in self.slots:
            active = self._active.get(slot.slot_id)
            processing = active is not None
            active = active or self._previous.get(slot.slot_id)
            state = SlotState(id=slot.slot_id, n_ctx=self.model.n_ctx_slot,
                              is_processing=processing or slot.busy)  # busy: decisions
            if active is not None:
                request = active.request
                n_predict = request.n_predict
                state.id_task = active.task_no
                state.n_prompt_tokens = len(slot.tokens)
                state.n_prompt_tokens_processed = \
                    active.prompt_done - active.n_cached if processing else 0
                state.n_prompt_tokens_cache = active.n_cached if processing else 0
                state.params = self._settings(active)
                state.next_token = [NextToken(
                    has_next_token=processing,
                    has_new_line=active.has_new_line and processing,
                    n_remain=-1 if n_predict < 0 or not processing
                    else n_predict - len(active.generated),
                    n_decoded=len(active.generated) if processing else 0)]
            states.append(state)
        return states

    def _cancel_event(self, job_id: str) -> ErrorEvent:
        with self._wake:
            error = self._cancel_errors.pop(job_id, None)
        return _cancelled_event() if error is None else ErrorEvent(error=error.to_info())

    def _release(self, active: SlotRun) -> None:
        self._previous[active.slot.slot_id] = active
        self.on_slots_changed()
        active.request.sampler.free()
        active.slot.busy = False
        active.slot.last_used = time.monotonic()
        del self._active[active.slot.slot_id]

    def _fail_one(self, active: SlotRun, error: Exception, events: list[JobEvent]) -> None:
        job_id = active.request.job.job_id
        log.exception("job %s: failed on slot %d", job_id, active.slot.slot_id, exc_info=error)
        info = (error if isinstance(error, LlamaqError)
                else ServerError(f"internal error: {type(error).__name__}")).to_info()
        events.append((job_id, ErrorEvent(error=info)))
        if active.slot.slot_id in self._active:
            self._release(active)

    def _fail_all(self, error: LlamaqError, events: list[JobEvent]) -> None:
        log.error("decode failed, failing %d requests: %s", len(self._active), error)
        self.decisions.fail_all(error, events)
        for active in list(self._active.values()):
            events.append((active.request.job.job_id, ErrorEvent(error=error.to_info())))
            lc.llama_memory_seq_rm(self.model.memory, active.slot.slot_id, -1, -1)
            active.slot.tokens.clear()
            self._release(active)


def decode_error_message(rc: int) -> str:
    """llama-server's words for a failed llama_decode."""
    if rc == 1:
        return "Context size has been exceeded."
    if rc == -1:
        return "Invalid input batch."
    if rc < -1:
        return "Compute error."
    return f"llama_decode failed with status {rc}"


def _at(pointer: Any, off: int, item: type[Any]) -> Any:
    """`pointer + off` for a ctypes pointer to items of type `item`."""
    address = ctypes.cast(pointer, ctypes.c_void_p).value
    return ctypes.cast((address or 0) + off * ctypes.sizeof(item), type(pointer))


def _cancelled_event() -> ErrorEvent:
    return ErrorEvent(error=Unavailable("the request was cancelled").to_info())


def valid_utf8_prefix(data: bytes) -> str:
    """The longest prefix of `data` that is whole UTF-8 (llama-server's validate_utf8)."""
    for cut in range(len(data), max(len(data) - 4, -1), -1):
        try:
            return data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return data.decode("utf-8", errors="ignore")
