"""The slot engine: one thread, one llama_context, N slots decoded together (continuous batching).

Requests join and leave between two decode steps. Each step plans one llama_batch with one token
per generating slot (and its draft) and prompt chunks of slots in prefill, decodes it (retried
smaller when the KV cache is full), samples every slot that needs a token, and hands the step's
events to the sink in one call.

Owns: the engine thread, its loop, the step and the decode; starting runs. Hands off, each to
its module in worker/engine/: what other threads hand over (inbox), which request gets which
slot (admission), the step as data (step_plan), prompts into the cache (prefill), a slot made
ready (slot_start), the batch (step_batch), a token's effect and when a run stops (token_step,
stopping), probabilities (token_probs), a run's state and ending (slot_run, runs), results and
the slots' report (slots_report), requests (requests), drafts' verification (verify); and
elsewhere: KV moves and snapshots (worker/kv/), adapter sets (worker/adapters/), decision jobs
(worker/decisions/run.py).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import llama_cpp as lc

from scheduler.contract.errors import InvalidRequest, LlamaqError, ServerError
from scheduler.contract.jobs import CompletionJob
from scheduler.contract.results import (
    Continuation,
    GenerationSettings,
    StartedEvent,
)
from scheduler.registry import SlotState, WorkerMetrics
from worker.adapters.adapter_sets import AdapterSets
from worker.decisions.plan import DecisionRequest
from worker.decisions.run import DecisionRunner
from worker.engine import slots_report
from worker.engine.admission import Admission, DecodeSpeed
from worker.engine.inbox import Inbox, SlotResult
from worker.engine.prefill import Prefill, TierState, mrope, position
from worker.engine.requests import EngineDefaults, Request, prepare_request
from worker.engine.runs import JobEvent, SlotRuns
from worker.engine.slot_run import SlotRun
from worker.engine.slot_start import SlotStart
from worker.engine.step_batch import StepBatch, decode_error_message
from worker.engine.step_plan import RunState, StepPlan, plan_step, runs_that_go
from worker.engine.token_step import TokenRules, shift_context
from worker.engine.verify import Speculation
from worker.engine.view_outcome import ViewOutcome
from worker.kv import moves as kv_moves
from worker.kv.checkpoints import CheckpointRules
from worker.kv.prompt_cache import PromptCache
from worker.kv.slots import SlotCache
from worker.runtime.compute_threads import ComputeThreads, CpuSample, machine_cores
from worker.runtime.model import LoadedModel
from worker.speculative.drafter import Drafter
from worker.speculative.ngram_cache import NgramCache

log = logging.getLogger(__name__)

EventSink = Callable[[list[JobEvent]], None]
"""Called from the engine thread once per step with that step's events, in order."""


class Engine:
    def __init__(self, model: LoadedModel, defaults: EngineDefaults, sink: EventSink) -> None:
        self.model = model
        self.defaults = defaults
        self._sink = sink
        self.slots = [SlotCache(i) for i in range(model.plan.n_slots)]
        self._tasks_started = 0
        self.metrics = WorkerMetrics()
        self.speed = DecodeSpeed()
        self.on_slots_changed: Callable[[], None] = lambda: None
        """Called (from the engine thread) when a slot starts or ends a request."""
        self.on_tier_state: TierState = lambda tokens, data, salt: None
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
                                  model.n_ctx_slot,
                                  functools.partial(shift_context, self._kv, model.n_ctx_slot))
        self._spec = Speculation(Drafter(defaults.spec, len(self.slots), draft=model.draft,
                                         n_vocab_target=model.vocab.n_tokens),
                                 model.n_ctx_slot) if defaults.spec.enabled else None
        """Speculative decoding (worker/speculative/); None when --spec-type drafts nothing."""
        self._runs = SlotRuns(self._kv, self._sets, self._spec, self.reports, self.metrics,
                              self._inbox.cancel_error, lambda: self.on_slots_changed())
        """The runs on the slots and their endings (worker/engine/runs.py)."""
        self._active, self._previous = self._runs.active, self._runs.previous
        self._prefill = Prefill(model, self._kv, self._checkpoints, self.metrics,
                                lambda *state: self.on_tier_state(*state))
        """Prompts into the slots' caches (worker/engine/prefill.py)."""
        self._outcome = ViewOutcome(model, defaults.special, self._runs, self._tokens, self._kv,
                                    self._spec)
        """What a decoded view gives its runs (worker/engine/view_outcome.py)."""
        self.decisions = DecisionRunner(model, self.metrics, self._inbox.wake, defaults.worker_id,
                                        defaults.model_alias, self._runs.cancel_event,
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
        """Per slot, the job its cache begins with (cache-aware routing;
        worker/engine/slots_report.py)."""
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
            # cancelled runs first: a request handed over with a cancel (a preemption's)
            # takes the freed slot now, not after a decode of the others
            self._drop_cancelled(cancelled, events)
            self._admit(cancelled, events)
            with self._admission_lock:
                self.decisions.admit(self.slots, cancelled, not self._admission.waiting, events)
            if events:  # "started" goes out before the prompt is evaluated
                self._sink(events)
                events = []
            self._run_slot_tasks()
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
                self.slots, cancelled, len(self._active), self._runs.prefilling(),
                self.defaults.cont_batching, beside_busy=not self.model.plan.kv_unified,
                similarity=self.defaults.slot_similarity,
                usable=lambda request, slot: slot.salt == request.job.cache_salt
                and self._sets.usable(self._slot_start.first_set(request), slot))
        for request in decision.cancelled:
            request.sampler.free()
            events.append((request.job.job_id, self._runs.cancel_event(request.job.job_id)))
        for request, slot in decision.admitted:
            self._tasks_started += 1
            active = self._start(request, slot, self._tasks_started)
            self._active[slot.slot_id] = active
            self.on_slots_changed()  # once counted: what it tells reads busy_slots (issue 47)
            events.append((request.job.job_id, StartedEvent()))
            if request.job.stream and request.job.return_progress \
                    and request.resumed is None:  # the 0 % event (a continuation shows none)
                events.append((request.job.job_id, active.progress(active.t_start)))
        if decision.admitted and self.defaults.cache_idle_slots:
            self._slot_start.cache_idle_slots()

    def _start(self, request: Request, slot: SlotCache, task_no: int) -> SlotRun:
        active = SlotRun.begin(request, slot, task_no, self._slot_start.prepare(request, slot))
        self._tokens.resume(active)  # a continuation: where the dead worker stopped
        return active

    def _drop_cancelled(self, cancelled: set[str], events: list[JobEvent]) -> None:
        for slot_id, active in list(self._active.items()):
            if active.request.job.job_id in cancelled:
                log.info("job %s: cancelled, slot %d freed", active.request.job.job_id, slot_id)
                events.append((active.request.job.job_id,
                               self._runs.cancel_event(active.request.job.job_id)))
                self._runs.release(active)

    def _step(self, events: list[JobEvent]) -> None:
        """One decode: the runs that go this step, their media evaluated (each chunk in a
        decode of its own) and their drafts made, then the step planned as data
        (worker/engine/step_plan.py), its batch filled and decoded."""
        runs = self._step_runs(events)
        n_batch = self.model.plan.n_batch
        if self._spec is not None:  # none for M-RoPE media: drafts go by token index
            generating = [a for a in runs if not a.prefilling]
            self._spec.make_drafts([a for a in generating if not mrope(a)],
                                   n_batch - len(generating))
        plan = plan_step([self._state(a) for a in runs], n_batch,
                         self.speed.background_prompt_tokens(n_batch))
        n = self._fill(plan)
        if self._sets.decisions_turn():
            if self.model.projector is not None:
                self.decisions.evaluate_media(self.model.projector, events)
            n = self.decisions.fill(self._batch.raw, n, n_batch)
        self.metrics.n_busy_slots_total += len(self._active)
        self._sets.apply(self.model.ctx)
        self._decode(n, events)

    def _step_runs(self, events: list[JobEvent]) -> list[SlotRun]:
        """The runs that go this step, in slot order: of one adapter set
        (worker/adapters/adapter_sets.py), without batch lines while an online prompt is
        evaluated (worker/engine/step_plan.py), their next media chunks evaluated."""
        runs = sorted(self._active.values(), key=lambda a: a.slot.slot_id)
        for active in runs:
            active.batch_index = active.last_prompt_index = -1
            self._prefill.take_tier_state(active)
            alora = active.request.alora
            if alora is not None and active.prompt_done >= alora.pre_end:
                self._sets.enter(active.slot, alora.adapter_set)
        runs = self._sets.step_group(runs, bool(self.decisions.runs))  # one adapter set
        going = {r.slot_id for r in runs_that_go([self._state(a) for a in runs])}
        runs = [a for a in runs if a.slot.slot_id in going]
        if any(a.request.media is not None for a in runs):
            for active, error in self._prefill.evaluate_media(runs):
                self._runs.fail_one(active, error, events)
            runs = [a for a in runs if a.slot.slot_id in self._active]
        return runs

    def _state(self, active: SlotRun) -> RunState:
        """What the step's plan reads of a run."""
        prefilling = active.prefilling
        spec = self._spec
        return RunState(active.slot.slot_id, prefilling, active.request.job.background,
                        active.prompt_done, self._prefill.prompt_end(active) if prefilling else 0,
                        0 if prefilling or spec is None else len(spec.of(active).draft),
                        active.request.job.priority or 0)

    def _fill(self, plan: StepPlan) -> int:
        """The plan's tokens into the step's batch; returns their count."""
        n = 0
        for slot_id in plan.generate:
            active = self._active[slot_id]
            self._batch.put(n, active.next_token, position(active, len(active.slot.tokens)),
                            slot_id, True)
            active.slot.tokens.append(active.next_token)
            active.batch_index, n = n, n + 1
            if self._spec is not None:
                n = self._spec.add_draft(self._batch, n, active)
        for chunk in plan.prompts:
            active = self._active[chunk.slot_id]
            self._prefill.take_checkpoint(active, chunk.end)
            prompt = active.request.prompt_tokens
            text = prompt[chunk.start:chunk.end]  # no media chunk in between
            ends = chunk.end == len(prompt)  # the prompt's last token: its logits
            n = self._batch.put_span(n, text, position(active, chunk.start),
                                     active.slot.slot_id, False, ends)
            active.slot.tokens.extend(text)
            if ends and text:
                active.batch_index = n - 1
            active.last_prompt_index = n - 1
            active.prompt_done = chunk.end
        return n

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
            self._outcome.after_view(off, size, events)
            self.decisions.after_view(off, size, events)
            off += size
        if self._spec is not None:
            self._spec.finish_decode(self._outcome.remove_kv)

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

    def metrics_snapshot(self) -> WorkerMetrics:
        return self.metrics.model_copy(update={"requests_processing": len(self._active)
                                               + len(self.decisions.runs),
                                               "requests_deferred": len(self._inbox.arrivals)
                                               + len(self._admission.waiting)})

    def default_settings(self) -> GenerationSettings:
        return self.reports.default_settings()

    def slot_states(self) -> list[SlotState]:
        """A snapshot for /slots (worker/engine/slots_report.py; read from another thread)."""
        return self.reports.slot_states(self.slots, self._active, self._previous)

    def _fail_all(self, error: LlamaqError, events: list[JobEvent]) -> None:
        log.error("decode failed, failing %d requests: %s", len(self._active), error)
        self.decisions.fail_all(error, events)
        self._runs.fail_all(error, events)
