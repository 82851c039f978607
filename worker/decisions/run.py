"""Decision jobs on the engine's thread: the state prefilled once, each question forked from it.

A decision run holds one slot (its owner) and prefills the shared prefix there, reusing what the
slot's cache already holds of it. Then each question runs in a lane: a sequence that starts as a
copy of the prefix (`llama_memory_seq_cp` from the owner), decodes the question's own suffix and
its label branches (worker/decisions/plan.py), and reads the logits over the candidate tokens.
The owner is the first lane; idle slots are borrowed as more lanes while no completion waits
for a slot, so the questions of one request run side by side. Every token goes into the engine's
step batch, with the other slots' tokens: decisions share decode steps with completions and with
each other. Nothing is sampled. A borrowed slot is handed back holding the prefix, so the next
request about the same state finds it cached.

Engine hooks (worker/engine/loop.py): `submit` (any thread), `has_work`, `admit` (start runs and
lanes on idle slots, drop cancelled ones), `fill` (add this step's tokens to the batch),
`after_view` (read the logits of a decoded view, advance lanes, finish runs), `fail_all`,
`withdraw`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import llama_cpp as lc

from scheduler.contract.errors import ErrorInfo, LlamaqError, ServerError
from scheduler.contract.results import (
    DecisionAnswer,
    DecisionResult,
    ErrorEvent,
    FinalEvent,
    StartedEvent,
    TokenEvent,
)
from scheduler.registry import WorkerMetrics
from worker.decisions.plan import (
    DecisionRequest,
    Path,
    child_logprobs,
    label_scores,
    restricted_softmax,
)
from worker.kv.slots import SlotCache, common_prefix
from worker.runtime.media import Projector
from worker.runtime.model import LoadedModel

log = logging.getLogger(__name__)

DecisionEvent = tuple[str, TokenEvent | FinalEvent | ErrorEvent | StartedEvent]
"""The engine's JobEvent (these emit only final and error events)."""


@dataclass
class Token:
    token: int
    pos: int
    node: Path | None = None
    """The trie node whose next-token distribution this token's logits give (None: none)."""


@dataclass
class Lane:
    """A sequence (a slot's) answering one question at a time for a run."""

    slot: SlotCache
    question: int = -1
    next_branch: int = 0
    todo: deque[Token] = field(default_factory=deque)
    inflight: list[tuple[int, Path]] = field(default_factory=list)
    """(batch index, trie node) of this step's tokens whose logits are read."""
    logprobs: dict[Path, dict[int, float]] = field(default_factory=dict)


@dataclass
class DecisionRun:
    request: DecisionRequest
    owner: SlotCache
    n_cached: int
    t_start: float
    prefill: deque[Token] = field(default_factory=deque)
    pending: deque[int] = field(default_factory=deque)
    lanes: list[Lane] = field(default_factory=list)
    answers: dict[int, list[float]] = field(default_factory=dict)
    decoded: int = 0

    @property
    def job_id(self) -> str:
        return self.request.job.job_id

    @property
    def n_prefix(self) -> int:
        return len(self.request.prefix)


class DecisionRunner:
    def __init__(self, model: LoadedModel, metrics: WorkerMetrics, wake: threading.Condition,
                 worker_id: str, model_alias: str,
                 cancel_event: Callable[[str], ErrorEvent],
                 slots_changed: Callable[[], None]) -> None:
        self._model = model
        self._metrics = metrics
        self._wake = wake
        self._worker_id = worker_id
        self._model_alias = model_alias
        self._cancel_event = cancel_event
        self._slots_changed = slots_changed
        self._arrivals: deque[DecisionRequest] = deque()
        """Submitted, not yet seen by the engine thread (guarded by `wake`)."""
        self._waiting: deque[DecisionRequest] = deque()
        self.runs: list[DecisionRun] = []

    # -- any thread ------------------------------------------------------------------------

    def submit(self, request: DecisionRequest) -> None:
        with self._wake:
            self._arrivals.append(request)
            self._wake.notify()

    def has_work(self) -> bool:
        """Called with `wake` held."""
        return bool(self._arrivals or self._waiting or self.runs)

    def withdraw(self) -> list[DecisionRequest]:
        """The requests that wait for a slot, taken back (a draining worker hands them on)."""
        with self._wake:
            arrivals, self._arrivals = list(self._arrivals), deque()
        waiting, self._waiting = [*self._waiting, *arrivals], deque()
        return waiting

    # -- the engine thread -----------------------------------------------------------------

    def admit(self, slots: list[SlotCache], cancelled: set[str], borrow: bool,
              events: list[DecisionEvent]) -> None:
        """Drop cancelled runs; start waiting runs on idle slots; give runs whose prefix is in
        the cache their lanes (borrowing idle slots only when `borrow`: no completion waits)."""
        with self._wake:
            self._waiting.extend(self._arrivals)
            self._arrivals.clear()
        for request in [r for r in self._waiting if r.job.job_id in cancelled]:
            self._waiting.remove(request)
            events.append((request.job.job_id, self._cancel_event(request.job.job_id)))
        for run in [r for r in self.runs if r.job_id in cancelled]:
            log.info("job %s: cancelled, decision slots freed", run.job_id)
            events.append((run.job_id, self._cancel_event(run.job_id)))
            self._release(run)
        while self._waiting:
            slot = self._idle_slot(slots, self._waiting[0])
            if slot is None:
                break
            self.runs.append(self._start(self._waiting.popleft(), slot))
        for run in self.runs:
            if run.prefill:
                continue
            if not run.lanes:
                run.lanes.append(Lane(run.owner))
                self._next_question(run, run.lanes[0])
            while run.pending and borrow:
                slot = self._idle_slot(slots, run.request)
                if slot is None:
                    break
                lane = self._borrow(run, slot)
                run.lanes.append(lane)
                self._next_question(run, lane)

    def fill(self, batch: Any, n: int, n_batch: int) -> int:
        """Add this step's decision tokens to the batch after the first `n`; returns the new
        count, at most `n_batch`.

        The order makes a request's numbers independent of which slots it got (the quantized
        CPU kernels round a row differently in differently shaped ubatches): with per-slot KV
        streams, sequences go in descending order, and llama.cpp, which puts into one ubatch
        only sequences whose ids ascend one by one, evaluates each prefix and each question
        in a ubatch of its own; with a unified KV cache (one ubatch for all) prefixes go first,
        then the questions in request order."""
        work: list[tuple[tuple[int, int, int], SlotCache, deque[Token], Lane | None,
                         DecisionRun]] = []
        for index, run in enumerate(self.runs):
            work.append(((0, index, 0), run.owner, run.prefill, None, run))
            work += [((1, index, lane.question), lane.slot, lane.todo, lane, run)
                     for lane in run.lanes]
        if not self._model.plan.kv_unified:
            work.sort(key=lambda item: -item[1].slot_id)
        else:
            work.sort(key=lambda item: item[0])
        for _, slot, todo, lane, run in work:
            n = self._add(batch, n, n_batch, slot, todo, lane, run)
        return n

    def evaluate_media(self, projector: Projector, events: list[DecisionEvent]) -> None:
        """The media chunks that come next in a run's prefix, each into the owner's sequence
        in a decode of its own (worker/runtime/media.py), as the engine does a completion's: the
        text before them was decoded in an earlier step (`_add` stops at a chunk)."""
        for run in list(self.runs):
            media = run.request.media
            if media is None:
                continue
            try:
                while run.prefill and (span := media.span_at(run.prefill[0].pos)) is not None:
                    projector.evaluate(self._model.ctx, span, run.owner.slot_id,
                                       self._model.plan.n_batch)
                    for _ in range(span.n_tokens):
                        run.owner.tokens.append(run.prefill.popleft().token)
                    run.decoded += span.n_tokens
                    self._metrics.n_decode_total += 1
            except Exception as error:  # one request's media must not stop the engine
                log.exception("job %s: a media chunk failed", run.job_id)
                events.append((run.job_id, ErrorEvent(error=_info(error))))
                self._release(run, forget=True)

    def after_view(self, off: int, size: int, events: list[DecisionEvent]) -> None:
        """The batch tokens [off, off + size) were decoded: read their logits, move the lanes
        whose tokens are all decoded on, and finish the runs whose questions are answered."""
        ctx, n_vocab = self._model.ctx, self._model.vocab.n_tokens
        for run in list(self.runs):
            try:
                for lane in list(run.lanes):
                    self._read(lane, run, off, size, ctx, n_vocab)
                if len(run.answers) == len(run.request.questions):
                    events.append((run.job_id, FinalEvent(result=self._result(run))))
                    self._release(run)
            except Exception as error:  # one request's failure must not stop the engine
                log.exception("job %s: decision failed", run.job_id)
                events.append((run.job_id, ErrorEvent(error=_info(error))))
                self._release(run, forget=True)

    def fail_all(self, error: LlamaqError, events: list[DecisionEvent]) -> None:
        for run in list(self.runs):
            events.append((run.job_id, ErrorEvent(error=error.to_info())))
            self._release(run, forget=True)

    # -- inside ----------------------------------------------------------------------------

    def _idle_slot(self, slots: list[SlotCache], request: DecisionRequest) -> SlotCache | None:
        """The idle slot holding most of the prefix (of its cache salt: its tenant group's)."""
        idle = [s for s in slots if not s.busy]
        if not idle:
            return None
        salt = request.job.cache_salt
        return max(idle, key=lambda s: (common_prefix(s.tokens, request.prefix)
                                        if s.salt == salt else 0, -s.last_used))

    def _start(self, request: DecisionRequest, slot: SlotCache) -> DecisionRun:
        slot.busy = True
        self._slots_changed()
        memory, prefix = self._model.memory, request.prefix
        n_cached = common_prefix(slot.tokens, prefix) if slot.salt == request.job.cache_salt \
            else 0  # another tenant group's KV is not reused
        slot.salt = request.job.cache_salt
        span = request.media.span_over(n_cached) if request.media is not None else None
        if span is not None:  # a cache that ends inside a media chunk backs off to its start
            n_cached = span.start
        if not lc.llama_memory_seq_rm(memory, slot.slot_id, n_cached, -1):
            lc.llama_memory_seq_rm(memory, slot.slot_id, -1, -1)
            n_cached = 0
        del slot.tokens[n_cached:]
        slot.checkpoints.clear()  # a decision's truncations leave them no meaning
        run = DecisionRun(request, slot, n_cached, time.perf_counter(),
                          prefill=deque(Token(t, pos) for pos, t in
                                        enumerate(prefix[n_cached:], n_cached)),
                          pending=deque(range(len(request.questions))))
        log.debug("job %s: decisions on slot %d, %d prefix tokens, %d cached, %d questions",
                  run.job_id, slot.slot_id, len(prefix), n_cached, len(request.questions))
        return run

    def _borrow(self, run: DecisionRun, slot: SlotCache) -> Lane:
        """An idle slot as one more lane of the run: its sequence becomes a copy of the
        prefix (the whole sequence is copied, as a copy between KV streams must be, and
        what lies past the prefix is removed)."""
        slot.busy = True
        memory = self._model.memory
        lc.llama_memory_seq_rm(memory, slot.slot_id, -1, -1)
        lc.llama_memory_seq_cp(memory, run.owner.slot_id, slot.slot_id, -1, -1)
        lc.llama_memory_seq_rm(memory, slot.slot_id, run.n_prefix, -1)
        slot.tokens[:] = run.request.prefix
        slot.salt = run.request.job.cache_salt
        slot.checkpoints.clear()
        self._slots_changed()
        return Lane(slot)

    def _next_question(self, run: DecisionRun, lane: Lane) -> None:
        """Start the lane on the run's next question, from the prefix; a lane with none left
        stops (a borrowed slot goes back)."""
        self._truncate(lane.slot, run.n_prefix)
        if not run.pending:
            lane.question = -1
            if lane.slot is not run.owner:
                run.lanes.remove(lane)
                self._free(lane.slot)
            return
        lane.question = run.pending.popleft()
        lane.next_branch = 0
        lane.logprobs = {}
        question = run.request.questions[lane.question]
        start = run.n_prefix
        lane.todo.extend(Token(t, pos) for pos, t in enumerate(question.suffix, start))
        lane.todo[-1].node = ()
        self._queue_branch(run, lane, start + len(question.suffix))

    def _queue_branch(self, run: DecisionRun, lane: Lane, start: int) -> None:
        question = run.request.questions[lane.question]
        if lane.next_branch >= len(question.branches):
            return
        branch = question.branches[lane.next_branch]
        lane.next_branch += 1
        lane.todo.extend(Token(t, pos, tuple(branch[: i + 1]))
                         for i, (pos, t) in enumerate(enumerate(branch, start)))

    def _add(self, batch: Any, n: int, n_batch: int, slot: SlotCache,
             todo: deque[Token], lane: Lane | None, run: DecisionRun) -> int:
        while todo and n < n_batch:
            if todo[0].token < 0:  # a media chunk's placeholder: evaluate_media's, next step
                break
            item = todo.popleft()
            batch.token[n] = item.token
            batch.pos[n] = item.pos
            batch.n_seq_id[n] = 1
            batch.seq_id[n][0] = slot.slot_id
            batch.logits[n] = item.node is not None
            if lane is not None and item.node is not None:
                lane.inflight.append((n, item.node))
            slot.tokens.append(item.token)
            run.decoded += 1
            n += 1
        return n

    def _read(self, lane: Lane, run: DecisionRun, off: int, size: int, ctx: lc.llama_context_p,
              n_vocab: int) -> None:
        import numpy as np

        if lane.question < 0:
            return
        question = run.request.questions[lane.question]
        for index, node in [e for e in lane.inflight if off <= e[0] < off + size]:
            pointer = lc.llama_get_logits_ith(ctx, index - off)
            row = np.ctypeslib.as_array(pointer, shape=(n_vocab,))
            lane.logprobs[node] = child_logprobs(row, question.children[node])
            lane.inflight.remove((index, node))
        if lane.todo or lane.inflight:
            return
        if lane.next_branch < len(question.branches):  # the next branch, from the suffix's end
            start = run.n_prefix + len(question.suffix)
            self._truncate(lane.slot, start)
            self._queue_branch(run, lane, start)
            return
        scores = label_scores(question, lane.logprobs)
        run.answers[lane.question] = restricted_softmax(scores, question.temperature)
        self._next_question(run, lane)

    def _truncate(self, slot: SlotCache, n: int) -> None:
        if len(slot.tokens) > n:
            lc.llama_memory_seq_rm(self._model.memory, slot.slot_id, n, -1)
            del slot.tokens[n:]

    def _free(self, slot: SlotCache) -> None:
        slot.busy = False
        slot.last_used = time.monotonic()
        self._slots_changed()

    def _release(self, run: DecisionRun, forget: bool = False) -> None:
        """Give back the run's slots, each holding the prefix (or nothing, after a failure)."""
        for slot in [run.owner, *(lane.slot for lane in run.lanes if lane.slot is not run.owner)]:
            if forget:
                lc.llama_memory_seq_rm(self._model.memory, slot.slot_id, -1, -1)
                slot.forget_tokens()
            elif not run.prefill:
                self._truncate(slot, run.n_prefix)
            self._free(slot)
        run.lanes.clear()
        self.runs.remove(run)
        elapsed = time.perf_counter() - run.t_start
        self._metrics.prompt_tokens_total += run.decoded
        self._metrics.prompt_seconds_total += elapsed
        self._metrics.n_tokens_max = max(self._metrics.n_tokens_max, run.request.n_tokens_max)

    def _result(self, run: DecisionRun) -> DecisionResult:
        questions = run.request.questions
        return DecisionResult(
            worker_id=self._worker_id, model=self._model_alias,
            answers=[DecisionAnswer(id=q.id, probabilities=run.answers[i],
                                    n_prompt_tokens=run.n_prefix + len(q.suffix))
                     for i, q in enumerate(questions)],
            n_prefix_tokens=run.n_prefix, prefix_cached=run.n_cached,
            tokens_decoded=run.decoded,
            temperatures={q.type: q.temperature for q in questions})


def _info(error: Exception) -> ErrorInfo:
    chosen = error if isinstance(error, LlamaqError) else ServerError(
        f"internal error: {type(error).__name__}")
    return chosen.to_info()
