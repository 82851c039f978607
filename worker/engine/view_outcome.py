"""What a decoded view of the step's batch gives its runs: progress for the prompts it
advanced, a token sampled for each run whose logits it holds (through the token rules), and
speculating runs' drafts verified after the plain runs, as llama-server does.

Owns: that order and a run's failure while sampling (it ends that run, never the engine).
"""

from __future__ import annotations

import time

from scheduler.contract.results import TokenProbs
from worker.engine import token_probs
from worker.engine.runs import JobEvent, SlotRuns
from worker.engine.slot_run import SlotRun
from worker.engine.stopping import StopType
from worker.engine.token_step import TokenRules
from worker.engine.verify import Speculation
from worker.kv import moves as kv_moves
from worker.runtime.model import LoadedModel


class ViewOutcome:
    def __init__(self, model: LoadedModel, special: bool, runs: SlotRuns, tokens: TokenRules,
                 kv: kv_moves.LlamaKv, spec: Speculation | None) -> None:
        self._model = model
        self._special = special
        self._runs = runs
        self._tokens = tokens
        self._kv = kv
        self._spec = spec

    def after_view(self, off: int, size: int, events: list[JobEvent]) -> None:
        """Progress and sampling for the runs whose tokens were in the view [off, off+size)."""
        now = time.perf_counter()
        spec = self._spec
        drafted: list[SlotRun] = []
        for active in list(self._runs.active.values()):
            job = active.request.job
            if off <= active.last_prompt_index < off + size:
                active.t_prompt_last = now
                if job.return_progress and job.stream and active.request.resumed is None:
                    events.append((job.job_id, active.progress(now)))
            if not off <= active.batch_index < off + size:
                continue
            if not active.t_prompt_done:
                active.t_prompt_done = active.t_prompt_last = now
                if spec is not None:
                    spec.begin(active)
            if active.request.n_predict == 0:  # evaluate the prompt into the cache, no tokens
                self._runs.finish(active, StopType.LIMIT, now, events)
                continue
            if spec is not None and spec.has_draft(active):
                drafted.append(active)  # verified after the plain runs, as llama-server does
                continue
            try:
                token, probs = token_probs.sample(active, self._model.ctx,
                                                  active.batch_index - off,
                                                  self._model.vocab.n_tokens, self._piece)
                self._on_token(active, token, probs, now, events)
            except Exception as error:  # one request's failure must not stop the engine
                self._runs.fail_one(active, error, events)
        for active in drafted:
            self._verify(active, off, size, now, events)

    def _verify(self, active: SlotRun, off: int, size: int, now: float,
                events: list[JobEvent]) -> None:
        """A speculating run's draft (worker/engine/verify.py): each accepted token goes
        through the token rules in turn, as plain decoding's would."""
        assert self._spec is not None

        def sample(run: SlotRun, index: int, accept: bool) -> tuple[int, TokenProbs | None]:
            return token_probs.sample(run, self._model.ctx, index, self._model.vocab.n_tokens,
                                      self._piece, accept)

        def emit(run: SlotRun, token: int, probs: TokenProbs | None) -> bool:
            self._on_token(run, token, probs, now, events)
            return self._runs.active.get(run.slot.slot_id) is run

        try:
            self._spec.verify(active, off, size, sample, emit, self.remove_kv,
                              self._model.vocab.is_eog)
        except Exception as error:  # one request's failure must not stop the engine
            kv_moves.clear(self._kv, active.slot)
            self._runs.fail_one(active, error, events)

    def remove_kv(self, slot_id: int, pos: int) -> None:
        self._kv.remove(slot_id, pos, -1)

    def _piece(self, token: int) -> bytes:
        return self._model.vocab.piece(token, self._special)

    def _on_token(self, active: SlotRun, token: int, probs: TokenProbs | None, now: float,
                  events: list[JobEvent]) -> None:
        event, reason = self._tokens.apply(active, token, probs, now)
        if event is not None:
            events.append((active.request.job.job_id, event))
        if reason is not None:
            self._runs.finish(active, reason.stop_type, now, events)
