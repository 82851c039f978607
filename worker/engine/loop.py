"""The slot engine: one thread, one llama_context, N slots decoded together (continuous batching).

Requests join and leave between two decode steps. Each step builds one llama_batch with one token
per generating slot and prompt chunks of slots in prefill, decodes it (retried smaller when the KV
cache is full), samples every slot that needs a token, and hands the step's events to the sink in
one call.

Owns: the engine thread, its loop, the step and the decode; starting, ending and failing runs.
Hands off: what other threads hand over (worker/engine/inbox.py), which request gets which slot
and the step's budget (worker/engine/admission.py), a slot made ready for a prompt
(worker/engine/slot_start.py), the KV cache moves (worker/kv/moves.py), the batch
(worker/engine/step_batch.py), what a token does to its run and when it stops (worker/engine/token_step.py,
worker/engine/stopping.py), token probabilities (worker/engine/token_probs.py), results and the slots' report
(worker/engine/slots_report.py), a run's state (worker/engine/slot_run.py), sampler chains
(worker/engine/sampling.py), a job into a Request (worker/engine/requests.py), decision jobs
(worker/decisions/run.py), slot snapshots (worker/kv/snapshots.py), LoRA adapter sets (the step's
group, the cache keyed by set: worker/adapters/adapter_sets.py), speculative decoding (drafts into the
step's batch, their verification and KV clean-up: worker/speculative/).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import llama_cpp as lc

from scheduler.contract.errors import InvalidRequest, LlamaqError, ServerError, Unavailable
from scheduler.contract.jobs import CompletionJob
from scheduler.contract.results import (
    Continuation,
    ErrorEvent,
    FinalEvent,
    GenerationSettings,
    StartedEvent,
    TokenEvent,
    TokenProbs,
)
from scheduler.registry import SlotState, WorkerMetrics
from worker.engine import slots_report, token_probs
from worker.kv import moves as kv_moves
from worker.adapters.adapter_sets import AdapterSets
from worker.engine.admission import Admission, DecodeSpeed, prompt_chunks
from worker.kv.checkpoints import CheckpointRules
from worker.runtime.compute_threads import ComputeThreads, CpuSample, machine_cores
from worker.decisions.plan import DecisionRequest
from worker.decisions.run import DecisionRunner
from worker.engine.inbox import Inbox, SlotResult
from worker.runtime.model import LoadedModel
from worker.kv.prompt_cache import PromptCache
from worker.engine.reasoning import ReasoningTracker
from worker.engine.requests import EngineDefaults, Request, prepare_request
from worker.engine.slot_run import SlotRun
from worker.engine.slot_start import SlotStart
from worker.kv.slots import SlotCache
from worker.kv.snapshots import save_slot
from worker.speculative.drafter import Drafter
from worker.speculative.ngram_cache import NgramCache
from worker.engine.verify import Speculation
from worker.engine.step_batch import StepBatch, decode_error_message
from worker.engine.stopping import StopType
from worker.engine.textstream import TextStream
from worker.engine.token_step import TokenRules

log = logging.getLogger(__name__)

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
        self.on_tier_state: Callable[[list[int], bytes], None] = lambda tokens, data: None
        """Called (from the engine thread) with a prompt prefix's KV state for the fleet-wide
        KV tier (worker/kv/tier.py)."""
        self._inbox = Inbox()
        """What other threads hand over (worker/engine/inbox.py)."""
        self._admission: Admission[Request] = Admission()
        """Requests waiting for a slot (the engine thread's alone)."""
        self._admission_lock = threading.Lock()
        """Held by the engine thread while it moves arrivals into admission and decides (pure
        Python, no llama.cpp), and by withdraw_waiting; taken before the inbox's."""
        self._batch = StepBatch(model.plan.n_batch)
        self._threads = ComputeThreads(model.plan.n_threads, model.plan.n_threads_batch,
                                       machine_cores()) if defaults.adapt_threads else None
        self._kv = kv_moves.LlamaKv(model.memory, model.ctx)
        self._checkpoints = CheckpointRules(
            defaults.ctx_checkpoints, defaults.checkpoint_min_step, model.n_swa,
            model.rollback_only_full, model.plan.n_batch, model.plan.n_ubatch)
        """Context checkpoints of SWA and recurrent models (worker/kv/checkpoints.py)."""
        self.prompt_cache = PromptCache(defaults.cache_ram_mib, model.n_ctx) \
            if defaults.cache_ram_mib != 0 and defaults.cache_prompt else None
        """--cache-ram: prompts' states kept in host memory (worker/kv/prompt_cache.py)."""
        self._sets = AdapterSets(model.adapters)
        """Per-request LoRA adapter sets: the step's group, each slot's cache set."""
        self._slot_start = SlotStart(model, self.slots, self._kv, self._sets, self._checkpoints,
                                     self.prompt_cache)
        """A slot made ready for a request's prompt (worker/engine/slot_start.py)."""
        self.reports = slots_report.RunReports(defaults, model.vocab, model.n_ctx_slot)
        self._tokens = TokenRules(model.vocab, defaults.special, defaults.context_shift,
                                  model.n_ctx_slot, self._shift_context)
        self._spec = Speculation(Drafter(defaults.spec, len(self.slots), draft=model.draft,
                                         n_vocab_target=model.vocab.n_tokens),
                                 model.n_ctx_slot) if defaults.spec.enabled else None
        """Speculative decoding (worker/speculative/); None when --spec-type drafts nothing."""
        self.decisions = DecisionRunner(model, self.metrics, self._inbox.wake, defaults.worker_id,
                                        defaults.model_alias, self._cancel_event,
                                        lambda: self.on_slots_changed())
        """Decision jobs (/v1/systemone): their tokens join each step's batch."""
        self._thread = threading.Thread(target=self._run, name="llamaq-engine", daemon=True)

    # -- called from other threads -------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if not self._inbox.stop():
            return  # stopped already (a worker that went to sleep)
        self._thread.join()
        self._batch.free()

    def prepare(self, job: CompletionJob, resumed: Continuation | None = None,
                media: list[bytes] | None = None) -> Request:
        """The job as a Request (`resumed`: it continues where a dead worker stopped;
        `media`: the bytes of its media, in order)."""
        return prepare_request(job, self.model, self.defaults, len(self.slots), resumed, media)

    def submit(self, request: Request) -> None:
        self._inbox.submit(request)

    def cancel(self, job_id: str, error: LlamaqError | None = None) -> None:
        """Free the job's slot; its last event is `error` (default: "cancelled")."""
        self._inbox.cancel(job_id, error)

    def withdraw_waiting(self) -> list[Request | DecisionRequest]:
        """Take back every request that waits for a slot (a draining worker hands them to
        another); no event is sent for them."""
        with self._admission_lock:
            waiting = [*self._admission.waiting, *self._inbox.take_arrivals()]
            self._admission.waiting.clear()
            decisions = self.decisions.withdraw()
        for request in waiting:
            request.sampler.free()
        return [*waiting, *decisions]

    def end_reasoning(self, job_id: str) -> None:
        """/v1/chat/completions/control: force the end of the job's thinking block."""
        self._inbox.end_reasoning(job_id)

    def run_on_slot(self, slot_id: int,
                    action: Callable[[SlotCache], SlotResult]) -> Future[SlotResult]:
        """Run `action` on the engine thread once the slot is idle (save, restore, erase)."""
        if not 0 <= slot_id < len(self.slots):
            raise InvalidRequest("Invalid slot ID")
        return self._inbox.run_on_slot(slot_id, action)

    def busy_slots(self) -> int:
        return len(self._active)

    def lookup_cache(self) -> NgramCache | None:
        """Lookup decoding's caches (ngram-cache), when it speculates with them."""
        return self._spec.drafter.ngram_cache if self._spec is not None else None

    def slot_jobs(self) -> list[CompletionJob | None]:
        """Per slot, the job its cache begins with (cache-aware routing; worker/engine/slots_report.py)."""
        return slots_report.slot_jobs(self.slots, self._active, self._previous)

    # -- the engine thread ---------------------------------------------------------------

    def _run(self) -> None:
        while True:
            taken = self._inbox.wait(lambda: not self._active and not self._admission.waiting
                                     and not self.decisions.has_work())
            if taken is None:
                return
            cancelled, end_reasoning = taken
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
        ready = self._inbox.take_slot_tasks(lambda slot_id: not self.slots[slot_id].busy)
        for slot_id, action, future in ready:
            self._sets.forget(slot_id)
            try:
                future.set_result(action(self.slots[slot_id]))
            except Exception as error:  # handed to the waiting job, not lost
                future.set_exception(error)
        if ready:
            self.on_slots_changed()

    def _admit(self, cancelled: set[str], events: list[JobEvent]) -> None:
        """Start the requests admission lets in (worker/engine/admission.py) on their slots."""
        with self._admission_lock:
            self._admission.arrive(self._inbox.take_arrivals())
            decision = self._admission.admit(
                self.slots, cancelled, len(self._active),
                [a.request.prompt_tokens for a in self._active.values() if a.prefilling],
                self.defaults.cont_batching, beside_busy=not self.model.plan.kv_unified,
                similarity=self.defaults.slot_similarity,
                usable=lambda request, slot: self._sets.usable(
                    self._slot_start.first_set(request), slot))
        for request in decision.cancelled:
            request.sampler.free()
            events.append((request.job.job_id, self._cancel_event(request.job.job_id)))
        for request, slot in decision.admitted:
            self.on_slots_changed()
            self._tasks_started += 1
            active = self._start(request, slot, self._tasks_started)
            self._active[slot.slot_id] = active
            events.append((request.job.job_id, StartedEvent()))
            if request.job.stream and request.job.return_progress \
                    and request.resumed is None:  # the 0 % event (a continuation shows none)
                events.append((request.job.job_id, active.progress(active.t_start)))
        if decision.admitted and self.defaults.cache_idle_slots:
            self._slot_start.cache_idle_slots()

    def _start(self, request: Request, slot: SlotCache, task_no: int) -> SlotRun:
        n_reuse = self._slot_start.prepare(request, slot)
        spec = request.job.reasoning
        active = SlotRun(request, slot, TextStream(request.stop), task_no,
                         n_cached=n_reuse, t_start=time.perf_counter(), prompt_done=n_reuse,
                         reasoning=ReasoningTracker.start(spec) if spec else None)
        if request.resumed is not None:  # where the dead worker stopped
            self._tokens.replay(active, request.resumed.tokens)
            active.probs = list(request.resumed.probs)
            active.earlier_predicted_ms = request.resumed.predicted_ms
        return active

    def _take_tier_state(self, active: SlotRun) -> None:
        """The run's prefill reached its tier boundary: its slot holds exactly that prefix."""
        tier = active.request.tier
        if tier is None or tier.saved or tier.save_at != active.prompt_done:
            return
        tier.saved = True
        try:
            data, tokens = save_slot(self.model, active.slot)
        except LlamaqError as error:
            log.warning("kv tier: state of %d tokens not taken (%s)", tier.save_at, error)
            return
        self.on_tier_state(tokens, data)

    def _take_checkpoint(self, active: SlotRun, end: int) -> None:
        """A context checkpoint before the run's prompt tokens up to `end` are decoded, when
        llama-server would take one (worker/kv/checkpoints.py); none for prompts with media."""
        n_prompt = len(active.request.prompt_tokens)
        if self._checkpoints.wanted(n_prompt, active.prompt_done, end,
                                    active.request.media is not None,
                                    active.request.user_starts, active.slot.checkpoints):
            kv_moves.take_checkpoint(self._kv, active.slot, self._checkpoints,
                                     active.prompt_done, active.task_no)

    def _evaluate_media(self, runs: list[SlotRun], events: list[JobEvent]) -> None:
        """The media chunks that come next in a prefilling run's prompt, each in a decode of
        its own (worker/runtime/media.py): the text before them was decoded in an earlier step."""
        projector = self.model.projector
        for active in runs:
            media = active.request.media
            if media is None or projector is None or not active.prefilling:
                continue
            try:
                while (span := media.span_at(active.prompt_done)) is not None:
                    projector.evaluate(self.model.ctx, span, active.slot.slot_id,
                                       self.model.plan.n_batch)
                    active.slot.tokens.extend(active.request.prompt_tokens[span.start:span.end])
                    active.prompt_done = span.end
                    self.metrics.n_decode_total += 1
            except Exception as error:  # one request's media must not stop the engine
                kv_moves.clear(self._kv, active.slot)
                self._fail_one(active, error, events)

    def _prompt_end(self, active: SlotRun) -> int:
        """Where this step's prompt tokens of a run may go up to: its next media chunk, and
        the cuts at user messages and before the prompt's last tokens that llama-server makes
        for its checkpoints (with media too, where it takes none right after a chunk but cuts
        all the same)."""
        media, tier = active.request.media, active.request.tier
        n_prompt = len(active.request.prompt_tokens)
        text_end = media.text_end(active.prompt_done) if media is not None else n_prompt
        end = self._checkpoints.chunk_end(n_prompt, active.prompt_done, text_end,
                                          active.request.user_starts, active.slot.checkpoints)
        if tier is not None and tier.save_at is not None and active.prompt_done < tier.save_at:
            end = min(end, tier.save_at)  # its state is taken there (worker/kv/tier.py)
        alora = active.request.alora
        if alora is not None and active.prompt_done < alora.pre_end:
            end = min(end, alora.pre_end)  # the base phase ends there (worker/adapters/alora.py)
        return end

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
            self._take_tier_state(active)
            alora = active.request.alora
            if alora is not None and active.prompt_done >= alora.pre_end:
                self._sets.enter(active.slot, alora.adapter_set)
        runs = self._sets.step_group(runs, bool(self.decisions.runs))  # one adapter set
        if any(a.prefilling and not a.request.job.background for a in runs):
            runs = [a for a in runs if not a.request.job.background]
        if any(a.request.media is not None for a in runs):
            self._evaluate_media(runs, events)
            runs = [a for a in runs if a.slot.slot_id in self._active]
        generating = [a for a in runs if not a.prefilling]
        if self._spec is not None:  # none for M-RoPE media: drafts go by token index
            self._spec.make_drafts([a for a in generating if not mrope(a)],
                                   self.model.plan.n_batch - len(generating))
        for active in generating:
            n = self._add(n, active.next_token, position(active, len(active.slot.tokens)),
                          active, True)
            if self._spec is not None:
                n = self._spec.add_draft(self._batch, n, active)
        n_batch = self.model.plan.n_batch
        online = [a for a in runs if a.prefilling and not a.request.job.background]
        background = [a for a in runs if a.prefilling and a.request.job.background]
        ends = prompt_chunks(n, [(a.prompt_done, self._prompt_end(a)) for a in online], n_batch)
        n_online = n + sum(end - a.prompt_done for a, end in zip(online, ends, strict=True))
        ends += prompt_chunks(0, [(a.prompt_done, self._prompt_end(a)) for a in background],
                              min(n_batch - n_online, self.speed.background_prompt_tokens(n_batch)))
        prefilling = online + background
        for active, end in zip(prefilling, ends, strict=True):
            if end == active.prompt_done:
                continue
            self._take_checkpoint(active, end)
            prompt = active.request.prompt_tokens
            shift = position(active, active.prompt_done) - active.prompt_done
            for pos in range(active.prompt_done, end):  # text: no media chunk in between
                n = self._add(n, prompt[pos], pos + shift, active, pos == len(prompt) - 1)
            active.last_prompt_index = n - 1
            active.prompt_done = end
        if self._sets.decisions_turn():
            if self.model.projector is not None:
                self.decisions.evaluate_media(self.model.projector, events)
            n = self.decisions.fill(self._batch.raw, n, self.model.plan.n_batch)
        self.metrics.n_busy_slots_total += len(self._active)
        self._sets.apply(self.model.ctx)
        self._decode(n, events)

    def _decode(self, n: int, events: list[JobEvent]) -> None:
        """Decode the step's batch; when the KV cache has no room, free an idle slot's cache
        (unified KV) or retry in smaller views, and end every request with llama-server's
        message when not even one token fits."""
        self._adapt_threads()
        off, n_view = 0, n
        while off < n:
            size = min(n_view, n - off)
            started = time.perf_counter()
            rc = lc.llama_decode(self.model.ctx, self._batch.view(off, size))
            if rc == 0:
                self.speed.add(time.perf_counter() - started, size)
            if rc == 1 and self.model.plan.kv_unified and \
                    kv_moves.clear_idle_slot(self._kv, self.slots):
                continue
            if rc == 1 and size > 1:
                n_view = size // 2
                log.warning("no room in the KV cache for %d tokens, retrying with %d",
                            size, n_view)
                continue
            if rc != 0:
                self._fail_all(ServerError(decode_error_message(rc)), events)
                break
            self.metrics.n_decode_total += 1
            self._after_view(off, size, events)
            self.decisions.after_view(off, size, events)
            off += size
        if self._spec is not None:
            self._spec.finish_decode(self._remove_kv)

    def _adapt_threads(self) -> None:
        """Fewer compute threads while other processes want the cores
        (worker/runtime/compute_threads.py)."""
        threads = self._threads
        now = time.monotonic()
        if threads is None or not threads.due(now) or not threads.observe(CpuSample.read(now)):
            return
        n_threads, n_threads_batch = threads.threads()
        lc.llama_set_n_threads(self.model.ctx, n_threads, n_threads_batch)
        log.info("computing with %d thread(s) (%d for prompts): other processes used %.2f of "
                 "%d cores", n_threads, n_threads_batch, threads.others_cores, threads.cores)

    def _after_view(self, off: int, size: int, events: list[JobEvent]) -> None:
        """Progress and sampling for the requests whose tokens were in the decoded view."""
        now = time.perf_counter()
        drafted: list[SlotRun] = []
        for active in list(self._active.values()):
            job = active.request.job
            if off <= active.last_prompt_index < off + size:
                active.t_prompt_last = now
                if job.return_progress and job.stream and active.request.resumed is None:
                    events.append((job.job_id, active.progress(now)))
            if not off <= active.batch_index < off + size:
                continue
            if not active.t_prompt_done:
                active.t_prompt_done = active.t_prompt_last = now
                if self._spec is not None:
                    self._spec.begin(active)
            if active.request.n_predict == 0:  # evaluate the prompt into the cache, no tokens
                self._finish(active, StopType.LIMIT, now, events)
                continue
            if self._spec is not None and self._spec.has_draft(active):
                drafted.append(active)  # verified after the plain runs, as llama-server does
                continue
            try:
                token, probs = token_probs.sample(active, self.model.ctx, active.batch_index - off,
                                                  self.model.vocab.n_tokens, self._piece)
                self._on_token(active, token, probs, now, events)
            except Exception as error:  # one request's failure must not stop the engine
                self._fail_one(active, error, events)
        for active in drafted:
            self._verify(active, off, size, now, events)

    def _verify(self, active: SlotRun, off: int, size: int, now: float,
                events: list[JobEvent]) -> None:
        """A speculating run's draft (worker/engine/verify.py): each accepted token goes
        through the token rules in turn, as plain decoding's would."""
        assert self._spec is not None

        def sample(run: SlotRun, index: int, accept: bool) -> tuple[int, TokenProbs | None]:
            return token_probs.sample(run, self.model.ctx, index, self.model.vocab.n_tokens,
                                      self._piece, accept)

        def emit(run: SlotRun, token: int, probs: TokenProbs | None) -> bool:
            self._on_token(run, token, probs, now, events)
            return self._active.get(run.slot.slot_id) is run

        try:
            self._spec.verify(active, off, size, sample, emit, self._remove_kv,
                              self.model.vocab.is_eog)
        except Exception as error:  # one request's failure must not stop the engine
            kv_moves.clear(self._kv, active.slot)
            self._fail_one(active, error, events)

    def _remove_kv(self, slot_id: int, pos: int) -> None:
        self._kv.remove(slot_id, pos, -1)

    def _piece(self, token: int) -> bytes:
        return self.model.vocab.piece(token, self.defaults.special)

    def _add(self, n: int, token: int, pos: int, active: SlotRun, logits: bool) -> int:
        self._batch.put(n, token, pos, active.slot.slot_id, logits)
        active.slot.tokens.append(token)
        if logits:
            active.batch_index = n
        return n + 1

    def _on_token(self, active: SlotRun, token: int, probs: TokenProbs | None, now: float,
                  events: list[JobEvent]) -> None:
        event, reason = self._tokens.apply(active, token, probs, now)
        if event is not None:
            events.append((active.request.job.job_id, event))
        if reason is not None:
            self._finish(active, reason.stop_type, now, events)

    def _finish(self, active: SlotRun, stop_type: StopType, now: float,
                events: list[JobEvent]) -> None:
        result = self.reports.result(active, stop_type, now)
        slots_report.count(self.metrics, result.timings, len(active.slot.tokens))
        events.append((active.request.job.job_id, FinalEvent(result=result)))
        self._release(active)

    def metrics_snapshot(self) -> WorkerMetrics:
        return self.metrics.model_copy(update={"requests_processing": len(self._active)
                                               + len(self.decisions.runs),
                                               "requests_deferred": len(self._inbox.arrivals)
                                               + len(self._admission.waiting)})

    def _shift_context(self, active: SlotRun) -> bool:
        """--context-shift (worker/kv/moves.py); False when the cache cannot shift."""
        request = active.request
        if request.media is not None:  # llama-server: no context shift with media
            return False
        n_keep = len(request.prompt_tokens) if request.n_keep < 0 else request.n_keep
        dropped = kv_moves.shift_context(self._kv, active.slot, n_keep, request.n_discard,
                                         self.model.n_ctx_slot)
        if dropped is not None:
            log.debug("job %s: context shift, %d tokens dropped", request.job.job_id, dropped)
        return dropped is not None

    def default_settings(self) -> GenerationSettings:
        return self.reports.default_settings()

    def slot_states(self) -> list[SlotState]:
        """A snapshot for /slots (worker/engine/slots_report.py; read from another thread)."""
        return self.reports.slot_states(self.slots, self._active, self._previous)

    def _cancel_event(self, job_id: str) -> ErrorEvent:
        error = self._inbox.cancel_error(job_id)
        return _cancelled_event() if error is None else ErrorEvent(error=error.to_info())

    def _release(self, active: SlotRun) -> None:
        if active.request.alora is not None:
            self._sets.end_alora(self._kv, active.slot, active.request.alora)
        self._previous[active.slot.slot_id] = active
        self.on_slots_changed()
        active.request.sampler.free()
        if self._spec is not None:
            self._spec.end(active, self.metrics)
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
            kv_moves.clear(self._kv, active.slot)
            self._release(active)


def _cancelled_event() -> ErrorEvent:
    return ErrorEvent(error=Unavailable("the request was cancelled").to_info())


def mrope(active: SlotRun) -> bool:
    media = active.request.media
    return media is not None and media.mrope


def position(active: SlotRun, index: int) -> int:
    """The model position of the run's token at `index` (prompt or generated): the index,
    less what M-RoPE media chunks before it take in tokens beyond their positions
    (worker/runtime/media.py MediaPrompt.pos_of; llama-server's server_tokens::pos_next)."""
    media = active.request.media
    return index if media is None or not media.spans else media.pos_of(index)
