"""The simulated engine: the slot engine's interface (worker/engine/loop.py) and its parts —
the inbox, admission, the runs and their endings, the token rules (text, stop strings,
n_predict, ignore_eos), the reports of /slots and results — with the decode replaced by a
timing model (worker/simulate/timing.py) and the model's tokens by a deterministic generator
(worker/simulate/vocab.py). It runs as a task on the worker's event loop, not a thread, so
that many simulated workers share one process.

Owns: when each slot's prompt ends and its next token is due, the prefix cache's part
(worker/simulate/kv.py) in a run's cache_n. Hands off everything a real run does after a
token is chosen to the engine's own modules.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import cast

from scheduler.contract.errors import InvalidRequest, LlamaqError, NotSupported
from scheduler.contract.jobs import CompletionJob
from scheduler.contract.limits import check_completion
from scheduler.contract.results import Continuation, StartedEvent
from scheduler.registry import WorkerMetrics
from worker.adapters.adapter_sets import AdapterSets
from worker.decisions.plan import DecisionRequest
from worker.engine import slots_report
from worker.engine.admission import Admission, DecodeSpeed
from worker.engine.inbox import Inbox, SlotResult
from worker.engine.loop import Engine, EventSink
from worker.engine.requests import EngineDefaults, Request
from worker.engine.runs import JobEvent, SlotRuns
from worker.engine.sampling import SamplerChain, resolve_sampling
from worker.engine.slot_run import SlotRun
from worker.engine.stopping import StopType
from worker.engine.token_step import TokenRules
from worker.kv import moves as kv_moves
from worker.kv.slots import SlotCache, common_prefix
from worker.simulate.kv import BlockCache
from worker.simulate.model import SimModel
from worker.simulate.timing import TimingModel
from worker.simulate.vocab import SimVocab
from worker.speculative.ngram_cache import NgramCache

EARLY_S = 0.0005
"""Tokens due within this much of now go out in this step (one step, one sink call)."""


class NoSampler(SamplerChain):
    """The simulator chooses tokens itself: a chain that holds nothing to free."""

    def __init__(self) -> None:  # no llama.cpp sampler behind it
        self._chain = self._grammar = None


@dataclass
class Asked:
    """What the timing model asked of one run, and how late the engine's loop was to it (a
    starved process): the run's measured times are the asked ones plus the lateness of its
    first and last token (the tests compare them, whatever the box's load)."""

    prefill_s: float = 0.0
    itl_s: float = 0.0
    """The inter-token latencies drawn, summed (n_itl of them)."""
    n_itl: int = 0
    first_late_s: float = 0.0
    last_late_s: float = 0.0


ASKED_KEPT = 1024
"""The runs whose Asked record an engine keeps (the latest)."""


@dataclass
class Due:
    """A running request's next moment: its prompt's end, then each next token."""

    run: SlotRun
    at: float
    held: int
    """Tokens it holds in the KV budget."""
    asked: Asked
    generating: bool = False
    """Its prompt ended: each next moment is a token's."""


class SimEngine(Engine):
    def __init__(self, model: SimModel, defaults: EngineDefaults, sink: EventSink,
                 timing: TimingModel, kv: BlockCache, eos_after: int) -> None:
        """Not the real engine's constructor: no llama.cpp context, no thread."""
        self.model = model
        self.vocab = cast(SimVocab, model.vocab)
        self.defaults = defaults
        self._sink = sink
        self.timing = timing
        self.kv = kv
        self.eos_after = eos_after
        self.slots = [SlotCache(i) for i in range(model.plan.n_slots)]
        self._tasks_started = 0
        self.metrics = WorkerMetrics(simulated=True)
        self.speed = DecodeSpeed()
        self.on_slots_changed: Callable[[], None] = lambda: None
        self.on_tier_state: Callable[[list[int], bytes, str | None], None] = (
            lambda tokens, data, salt: None)
        self.prompt_cache = None
        self._inbox = Inbox()
        self._admission: Admission[Request] = Admission()
        self._admission_lock = threading.Lock()
        self._sets = AdapterSets(model.adapters)
        self.reports = slots_report.RunReports(defaults, model.vocab, model.n_ctx_slot,
                                               simulated=True)
        self._tokens = TokenRules(model.vocab, defaults.special, False, model.n_ctx_slot,
                                  lambda active: False)
        self._spec = None
        self._runs = SlotRuns(cast(kv_moves.LlamaKv, None), self._sets, None, self.reports,
                              self.metrics, self._inbox.cancel_error,
                              lambda: self.on_slots_changed())
        self._active, self._previous = self._runs.active, self._runs.previous
        self._due: dict[int, Due] = {}
        self.asked: dict[str, Asked] = {}
        """By job id, what the timing model asked of the latest runs (see Asked)."""
        self._rng = random.Random(defaults.worker_id)
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None

    # -- the engine's interface (called on the worker's event loop) -------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = self._loop.create_task(self._serve())

    def stop(self) -> None:
        self._inbox.stop()
        if self._task is not None:
            self._task.cancel()

    def prepare(self, job: CompletionJob, resumed: Continuation | None = None,
                media: list[bytes] | None = None) -> Request:
        """The job as a Request, with the real engine's checks (worker/engine/requests.py)
        that need no llama.cpp; grammars are accepted and not enforced (the text is the
        simulator's)."""
        check_completion(job, self.defaults.n_probs_max)
        if job.media or media:
            raise NotSupported("a simulated worker takes no media")
        vocab = self.vocab
        tokens = vocab.tokenize_prompt(job.prompt) if job.prompt else [vocab.bos]
        if job.infill is not None:  # no FIM tokens: the parts in order
            for part in (job.infill.input_prefix, job.infill.input_suffix):
                tokens += [t for t in vocab.tokenize_prompt(part) if t != vocab.bos]
        if len(tokens) <= int(vocab.add_bos):
            raise InvalidRequest("The prompt is empty")
        bad = [t for t in tokens if not vocab.valid(t)]
        if bad:
            raise InvalidRequest(f"Invalid token id {bad[0]} in the prompt")
        generated = resumed.tokens if resumed is not None else []
        n_ctx = self.model.n_ctx_slot
        if len(tokens) + len(generated) >= n_ctx:
            raise InvalidRequest(f"the request exceeds the available context size "
                                 f"({len(tokens)} tokens, context {n_ctx})")
        if job.id_slot >= len(self.slots):
            raise InvalidRequest(f"Invalid id_slot {job.id_slot}")
        d = self.defaults
        sampling = resolve_sampling(d.sampling, job.sampling, n_ctx)
        return Request(job, tokens + generated, sampling, NoSampler(),
                       d.n_predict if job.n_predict is None else job.n_predict,
                       d.cache_prompt if job.cache_prompt is None else job.cache_prompt,
                       d.n_keep if job.n_keep is None else job.n_keep, 0,
                       [s for s in job.stop if s] or list(d.stop),
                       n_discard=job.n_discard or 0, resumed=resumed)

    def submit(self, request: Request) -> None:
        self._inbox.submit(request)
        self._poke()

    def cancel(self, job_id: str, error: LlamaqError | None = None) -> None:
        self._inbox.cancel(job_id, error)
        self._poke()

    def end_reasoning(self, job_id: str) -> None:
        self._inbox.end_reasoning(job_id)
        self._poke()

    def run_on_slot(self, slot_id: int,
                    action: Callable[[SlotCache], SlotResult]) -> Future[SlotResult]:
        future = super().run_on_slot(slot_id, action)
        self._poke()
        return future

    def withdraw_waiting(self) -> list[Request | DecisionRequest]:
        with self._admission_lock:
            waiting = [*self._admission.waiting, *self._inbox.take_arrivals()]
            self._admission.waiting.clear()
        return list(waiting)

    def lookup_cache(self) -> NgramCache | None:
        return None

    def metrics_snapshot(self) -> WorkerMetrics:
        return self.metrics.model_copy(update={
            "requests_processing": len(self._active),
            "requests_deferred": len(self._inbox.arrivals) + len(self._admission.waiting)})

    # -- the engine's task ----------------------------------------------------------------

    def _poke(self) -> None:
        loop = self._loop
        if loop is None:
            return
        try:
            here = asyncio.get_running_loop() is loop
        except RuntimeError:
            here = False
        if here:
            self._wake.set()
        else:
            loop.call_soon_threadsafe(self._wake.set)

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._inbox.stopping:
            self._wake.clear()
            self._step_once(time.perf_counter())
            if self._due:
                delay = min(d.at for d in self._due.values()) - time.perf_counter()
                if delay <= EARLY_S:
                    await asyncio.sleep(0)
                    continue
                timer = loop.call_later(delay, self._wake.set)
                await self._wake.wait()
                timer.cancel()
            else:
                await self._wake.wait()

    def _step_once(self, now: float) -> None:
        """One step: what was handed over, then every run whose moment came."""
        cancelled, _ = self._inbox.take_marks()  # no reasoning in the simulator's text
        events: list[JobEvent] = []
        self._drop_cancelled(cancelled, events)  # first, as the real engine's: the freed
        self._admit_runs(cancelled, now, events)  # slots go to requests waiting now
        self._run_slot_tasks()
        self._settle()
        going = self._going(now)
        self._next_moments([due for due in going if self._advance(due, now, events)])
        if going:
            self.metrics.n_decode_total += 1
            self.metrics.n_busy_slots_total += len(self._active)
        self._settle()
        if events:
            self._sink(events)

    def _admit_runs(self, cancelled: set[str], now: float, events: list[JobEvent]) -> None:
        """Admission as the real engine's (worker/engine/admission.py); a run's prompt ends
        after its uncached tokens at the prefill speed."""
        with self._admission_lock:
            self._admission.arrive(self._inbox.take_arrivals())
            decision = self._admission.admit(
                self.slots, cancelled, len(self._active),
                [(a.request.job.cache_salt, a.request.prompt_tokens)
                 for a in self._active.values() if a.prefilling],
                self.defaults.cont_batching, similarity=self.defaults.slot_similarity)
        for request in decision.cancelled:
            events.append((request.job.job_id, self._runs.cancel_event(request.job.job_id)))
        for request, slot in decision.admitted:
            self.on_slots_changed()
            self._tasks_started += 1
            prompt = request.prompt_tokens
            cached = 0
            if request.cache_prompt:
                own = min(common_prefix(slot.tokens, prompt), len(prompt) - 1)
                cached = max(self.kv.lookup(prompt), own)
            slot.forget_tokens()
            slot.tokens.extend(prompt)
            active = SlotRun.begin(request, slot, self._tasks_started, cached)
            self._tokens.resume(active)
            self._active[slot.slot_id] = active
            self.kv.start(len(prompt))
            asked = Asked(prefill_s=self.timing.prefill_s(len(prompt) - cached))
            self._due[slot.slot_id] = Due(active, now + asked.prefill_s, len(prompt), asked)
            self.asked[request.job.job_id] = asked
            while len(self.asked) > ASKED_KEPT:
                del self.asked[next(iter(self.asked))]
            events.append((request.job.job_id, StartedEvent()))
            if request.job.stream and request.job.return_progress and request.resumed is None:
                events.append((request.job.job_id, active.progress(active.t_start)))

    def _going(self, now: float) -> list[Due]:
        """The runs whose moment came. Batched (TimingModel.batched): the generating runs
        share one moment, the step's, and a prompt that ends between two steps gives its
        first token with the next step's tokens, as a prompt's last batch is decoded with the
        other slots' tokens in the real engine (its time to first token grows by the wait)."""
        dues = list(self._due.values())
        if self.timing.batched:
            step = min((due.at for due in dues if due.generating), default=None)
            for due in dues:
                if step is not None and not due.generating and due.at < step:
                    due.asked.prefill_s += step - due.at
                    due.at = step
        return [due for due in dues if due.at <= now + EARLY_S]

    def _next_moments(self, going_on: list[Due]) -> None:
        """Each next token's moment, on the asked schedule (a late loop catches up, the mean
        stays): one latency for the whole step when batched, else one a run."""
        if not going_on:
            return
        if self.timing.batched:
            step = max(due.at for due in going_on)
            after = step + self.timing.itl_s(len(self._active), self._rng)
            moments = [after] * len(going_on)
        else:
            moments = [due.at + self.timing.itl_s(len(self._active), self._rng)
                       for due in going_on]
        for due, at in zip(going_on, moments, strict=True):
            due.asked.itl_s += at - due.at
            due.asked.n_itl += 1
            due.at = at
            due.generating = True

    def _advance(self, due: Due, now: float, events: list[JobEvent]) -> bool:
        """The run's prompt ends or its next token comes: through the token rules, as a
        sampled token would (worker/engine/token_step.py). False: the run ended."""
        active = due.run
        request = active.request
        late = max(0.0, now - due.at)
        if not active.t_prompt_done:
            due.asked.first_late_s = late
        due.asked.last_late_s = late
        if active.prefilling:
            active.prompt_done = len(request.prompt_tokens)
            active.t_prompt_last = now
            if request.job.return_progress and request.job.stream and request.resumed is None:
                events.append((request.job.job_id, active.progress(now)))
        if not active.t_prompt_done:
            active.t_prompt_done = now
        if request.n_predict == 0:
            self._runs.finish(active, StopType.LIMIT, now, events)
            return False
        token = self.vocab.generated(request.prompt_tokens[:request.n_prompt],
                                     len(active.generated), self.eos_after,
                                     request.sampling.ignore_eos)
        active.slot.tokens.append(token)
        event, reason = self._tokens.apply(active, token, None, now)
        if event is not None:
            events.append((request.job.job_id, event))
        if reason is not None:
            self._runs.finish(active, reason.stop_type, now, events)
            return False
        return True

    def _settle(self) -> None:
        """Runs that ended (finished, cancelled) give their KV to the prefix cache."""
        for slot_id, due in list(self._due.items()):
            if self._active.get(slot_id) is not due.run:
                del self._due[slot_id]
                self.kv.end(due.held, list(due.run.slot.tokens))
