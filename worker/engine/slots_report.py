"""What the engine reports: a run's result (CompletionResult) and generation settings, the
server-wide defaults as settings, the slots for /slots, the token counters of /metrics.

Owns: building those from a run's state (worker/engine/slot_run.py) and the engine's defaults. Plain
functions: no llama.cpp call but the prompt's detokenization; the engine decides when.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from scheduler.contract.jobs import CompletionJob, SamplingSettings
from scheduler.contract.results import CompletionResult, GenerationSettings, Timings, TokenBias
from scheduler.registry import NextToken, SlotState, WorkerMetrics
from worker.engine.requests import EngineDefaults, Request
from worker.engine.slot_run import SlotRun
from worker.engine.stopping import StopType
from worker.kv.slots import SlotCache
from worker.runtime.vocab import Vocab


@dataclass(frozen=True)
class RunReports:
    """Reports of one engine: its defaults, its model's vocabulary and slot context."""

    defaults: EngineDefaults
    vocab: Vocab
    n_ctx_slot: int
    simulated: bool | None = None
    """True on a simulated engine (its slots say so in /slots; ours)."""
    _idle: dict[int, tuple[bool, SlotRun | None, int, SlotState]] = field(
        default_factory=dict, compare=False, repr=False)
    """Per slot not processing: (busy, its last run, its cached tokens, the state made
    from them). Such a state reads only those, so it is made again only when one of them
    changed (issue 44: every job start and end reports all the slots)."""

    def result(self, active: SlotRun, stop_type: StopType, now: float) -> CompletionResult:
        request = active.request
        job = request.job
        stream = job.stream
        return CompletionResult(
            worker_id=self.defaults.worker_id,
            content="" if stream else active.text.text,
            tokens=[] if stream or not job.return_tokens else active.generated,
            id_slot=active.slot.slot_id,
            model=self.defaults.model_alias,
            prompt=self.vocab.detokenize(request.prompt_tokens[:request.n_prompt]),
            stop_type=stop_type.value,
            stopping_word=active.text.stopping_word,
            truncated=active.truncated,
            has_new_line=active.has_new_line,
            tokens_predicted=len(active.generated),
            tokens_evaluated=request.n_prompt,
            tokens_cached=len(active.slot.tokens),
            generation_settings=self.settings(active),
            timings=active.timings(now),
            probs=[] if stream else active.probs,
            post_sampling_probs=job.post_sampling_probs,
        )

    def settings(self, active: SlotRun) -> GenerationSettings:
        """The run's generation settings, made once (slot reports read them on every change)."""
        if active.settings is None:
            active.settings = self.request_settings(active.request)
        return active.settings

    def request_settings(self, request: Request) -> GenerationSettings:
        job = request.job
        return self.generation_settings(
            request.sampling, n_predict=request.n_predict, stop=request.stop, stream=job.stream,
            timings_per_token=job.timings_per_token, n_keep=request.n_keep,
            n_discard=request.n_discard, n_probs=job.n_probs, lora=job.lora or [],
            post_sampling_probs=job.post_sampling_probs,
            preserved_tokens=sorted(request.preserved), chat_format=job.chat_format,
            reasoning_format=job.reasoning_format, speculative_types=self.defaults.spec.name_str(),
            logit_bias=[TokenBias(token=t, bias=None if math.isinf(b) else b)
                        for t, b in request.logit_bias])

    def generation_settings(self, sampling: SamplingSettings,
                            **report: Any) -> GenerationSettings:
        """What ran: the resolved sampling settings dumped as they are, and the rest."""
        return GenerationSettings(**sampling.model_dump(), **report,
                                  max_tokens=report["n_predict"], n_ctx=self.n_ctx_slot,
                                  model=self.defaults.model_alias)

    def default_settings(self) -> GenerationSettings:
        """The server's defaults (/props): `speculative.types` reads `none` there, as
        llama-server's default task parameters do, whatever --spec-type says."""
        d = self.defaults
        bans = self.vocab.eog_tokens if d.sampling.ignore_eos else []  # --ignore-eos
        return self.generation_settings(d.sampling, n_predict=d.n_predict, stop=list(d.stop),
                                        stream=False, timings_per_token=False, n_keep=d.n_keep,
                                        logit_bias=[TokenBias(token=t, bias=None) for t in bans])

    def slot_states(self, slots: list[SlotCache], active_runs: dict[int, SlotRun],
                    previous: dict[int, SlotRun]) -> list[SlotState]:
        """A snapshot for /slots (read from another thread: only plain attribute reads).
        A slot that ended its request reads as llama-server's after release: its counters
        reset (n_remain -1, n_decoded 0), its last task's id and parameters kept. A slot not
        processing gets the same state object as last time when nothing it reads changed:
        the states are read-only to callers."""
        states = []
        for slot in slots:
            active = active_runs.get(slot.slot_id)
            processing = active is not None
            if not processing:
                last = previous.get(slot.slot_id)
                known = self._idle.get(slot.slot_id)
                if (known is not None and known[0] == slot.busy and known[1] is last
                        and known[2] == len(slot.tokens)):
                    states.append(known[3])
                    continue
            active = active or previous.get(slot.slot_id)
            state = SlotState(id=slot.slot_id, n_ctx=self.n_ctx_slot,
                              speculative=self.defaults.spec.enabled,
                              is_processing=processing or slot.busy,  # busy: decisions
                              simulated=self.simulated)
            if active is not None:
                n_predict = active.request.n_predict
                state.id_task = active.task_no
                state.n_prompt_tokens = len(slot.tokens)
                state.n_prompt_tokens_processed = \
                    active.prompt_done - active.n_cached if processing else 0
                state.n_prompt_tokens_cache = active.n_cached if processing else 0
                state.params = self.settings(active)
                state.tenant = active.request.job.tenant
                state.next_token = [NextToken(
                    has_next_token=processing,
                    has_new_line=active.has_new_line and processing,
                    n_remain=-1 if n_predict < 0 or not processing
                    else n_predict - len(active.generated),
                    n_decoded=len(active.generated) if processing else 0)]
            if not processing:
                self._idle[slot.slot_id] = (slot.busy, active, len(slot.tokens), state)
            states.append(state)
        return states


def slot_jobs(slots: list[SlotCache], active_runs: dict[int, SlotRun],
              previous: dict[int, SlotRun]) -> list[CompletionJob | None]:
    """Per slot, the job whose prompt its cache begins with, for cache-aware routing (read
    from another thread): the running one (its prompt is going in), else the last one
    unless the cache was emptied since."""
    held = []
    for slot in slots:
        run = active_runs.get(slot.slot_id)
        if run is None and slot.tokens:
            run = previous.get(slot.slot_id)
        held.append(run.request.job if run is not None else None)
    return held


def count(metrics: WorkerMetrics, timings: Timings, n_tokens: int) -> None:
    """A finished run's tokens and times, into the worker's /metrics counters."""
    metrics.prompt_tokens_total += timings.prompt_n
    metrics.prompt_tokens_cached_total += timings.cache_n
    metrics.prompt_seconds_total += timings.prompt_ms / 1000
    metrics.tokens_predicted_total += timings.predicted_n
    metrics.tokens_predicted_seconds_total += timings.predicted_ms / 1000
    metrics.n_tokens_max = max(metrics.n_tokens_max, n_tokens)
