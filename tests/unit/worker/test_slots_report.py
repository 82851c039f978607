"""What the engine reports (worker/engine/slots_report.py): a run's result and settings, the slots
of /slots, the jobs slots hold for routing, the /metrics counters; from plain run state."""

from __future__ import annotations

from typing import Any, cast

from scheduler.contract.jobs import CompletionJob, SamplingSettings
from scheduler.contract.results import Timings
from scheduler.registry import WorkerMetrics
from worker.engine.requests import EngineDefaults, Request
from worker.engine.slot_run import SlotRun
from worker.engine.slots_report import RunReports, count, slot_jobs
from worker.engine.stopping import StopType
from worker.engine.textstream import TextStream
from worker.kv.slots import SlotCache
from worker.runtime.vocab import Vocab


class FakeVocab:
    def __init__(self) -> None:
        self.eog_tokens = [2]

    def detokenize(self, tokens: list[int], special: bool = True) -> str:
        return " ".join(str(t) for t in tokens)


DEFAULTS = EngineDefaults(sampling=SamplingSettings(top_k=7), n_predict=-1, n_keep=0,
                          cache_prompt=True, special=False, model_alias="m", worker_id="w1")
REPORTS = RunReports(DEFAULTS, cast(Vocab, FakeVocab()), n_ctx_slot=512)


def run(slot: SlotCache, job: CompletionJob, n_predict: int = 10) -> SlotRun:
    request = Request(job=job, prompt_tokens=[5, 6, 7], sampling=SamplingSettings(top_k=3),
                      sampler=cast(Any, None), n_predict=n_predict, cache_prompt=True,
                      logit_bias=[(9, float("-inf"))])
    active = SlotRun(request, slot, TextStream([]), task_no=4, n_cached=1, t_start=1.0,
                     prompt_done=3)
    active.generated = [11, 12]
    active.text.text = "hello"
    active.t_prompt_done = active.t_prompt_last = 2.0
    return active


def test_a_result_reports_what_ran() -> None:
    slot = SlotCache(1, [5, 6, 7, 11])
    active = run(slot, CompletionJob(model="m", prompt="p", return_tokens=True))
    result = REPORTS.result(active, StopType.LIMIT, now=3.0)
    assert (result.content, result.tokens, result.id_slot, result.prompt) == (
        "hello", [11, 12], 1, "5 6 7")
    assert (result.stop_type, result.worker_id, result.model) == ("limit", "w1", "m")
    assert (result.tokens_predicted, result.tokens_evaluated, result.tokens_cached) == (2, 3, 4)
    settings = result.generation_settings
    assert (settings.top_k, settings.n_predict, settings.max_tokens, settings.n_ctx) == (
        3, 10, 10, 512)
    assert settings.logit_bias[0].bias is None  # a ban
    assert REPORTS.settings(active) is settings  # made once


def test_a_streamed_result_leaves_the_text_to_the_events() -> None:
    active = run(SlotCache(0), CompletionJob(model="m", prompt="p", stream=True))
    result = REPORTS.result(active, StopType.EOS, now=3.0)
    assert (result.content, result.tokens) == ("", [])


def test_the_default_settings_ban_eog_under_ignore_eos() -> None:
    assert REPORTS.default_settings().top_k == 7
    ignoring = RunReports(EngineDefaults(
        sampling=SamplingSettings(ignore_eos=True), n_predict=-1, n_keep=0, cache_prompt=True,
        special=False, model_alias="m", worker_id="w"), cast(Vocab, FakeVocab()), 512)
    assert [b.token for b in ignoring.default_settings().logit_bias] == [2]


def test_slots_show_the_running_and_the_last_run() -> None:
    slots = [SlotCache(0, [5, 6, 7]), SlotCache(1, [5, 6]), SlotCache(2)]
    running = run(slots[0], CompletionJob(model="m", prompt="a"))
    ended = run(slots[1], CompletionJob(model="m", prompt="b"))
    states = REPORTS.slot_states(slots, {0: running}, {1: ended})
    assert [s.is_processing for s in states] == [True, False, False]
    assert states[0].next_token is not None and states[0].next_token[0].n_remain == 8
    assert states[0].n_prompt_tokens_processed == 2 and states[0].n_prompt_tokens_cache == 1
    assert states[1].id_task == 4 and states[1].next_token is not None
    assert (states[1].next_token[0].n_remain, states[1].next_token[0].n_decoded) == (-1, 0)
    assert states[2].id_task is None
    held = slot_jobs(slots, {0: running}, {1: ended})
    assert held == [running.request.job, ended.request.job, None]
    slots[1].tokens.clear()  # emptied since: it holds nothing to route by
    assert slot_jobs(slots, {0: running}, {1: ended})[1] is None


def test_an_idle_slot_state_is_made_again_only_when_what_it_reads_changed() -> None:
    """Each job start and end reports all the slots (issue 44): a slot not processing hands
    back its last state while its busy flag, last run and cached tokens are the same."""
    reports = RunReports(DEFAULTS, cast(Vocab, FakeVocab()), n_ctx_slot=512)
    slots = [SlotCache(0, [5, 6, 7]), SlotCache(1, [5, 6])]
    ended = run(slots[1], CompletionJob(model="m", prompt="b"))
    first = reports.slot_states(slots, {}, {1: ended})
    again = reports.slot_states(slots, {}, {1: ended})
    assert again[0] is first[0] and again[1] is first[1]
    slots[1].tokens.append(9)  # its cache grew
    grown = reports.slot_states(slots, {}, {1: ended})
    assert grown[1] is not first[1] and grown[1].n_prompt_tokens == 3
    assert grown[0] is first[0]
    slots[0].busy = True  # a decision holds it
    assert reports.slot_states(slots, {}, {1: ended})[0].is_processing
    slots[0].busy = False
    other = run(slots[1], CompletionJob(model="m", prompt="c", tenant="t2"))
    replaced = reports.slot_states(slots, {}, {1: other})[1]  # another request ended there
    assert replaced.tenant == "t2" and replaced is not grown[1]
    running = run(slots[0], CompletionJob(model="m", prompt="a"))
    busy = reports.slot_states(slots, {0: running}, {1: other})
    assert busy[0].is_processing and busy[0].next_token is not None
    running.generated.append(13)  # a processing slot is made afresh every time
    assert reports.slot_states(slots, {0: running}, {1: other})[0] is not busy[0]
    after = reports.slot_states(slots, {}, {0: running, 1: other})[0]
    assert not after.is_processing and after.id_task == 4
    assert after.next_token is not None and after.next_token[0].n_decoded == 0
    fresh = RunReports(DEFAULTS, cast(Vocab, FakeVocab()), n_ctx_slot=512)
    assert [s.model_dump() for s in fresh.slot_states(slots, {}, {0: running, 1: other})] == [
        s.model_dump() for s in reports.slot_states(slots, {}, {0: running, 1: other})]


def test_counters_add_up() -> None:
    metrics = WorkerMetrics()
    timings = Timings(cache_n=0, prompt_n=3, prompt_ms=30.0, prompt_per_token_ms=10.0,
                      prompt_per_second=100.0, predicted_n=2, predicted_ms=20.0,
                      predicted_per_token_ms=20.0, predicted_per_second=50.0)
    count(metrics, timings, 40)
    count(metrics, timings, 10)
    assert (metrics.prompt_tokens_total, metrics.tokens_predicted_total) == (6, 4)
    assert metrics.prompt_seconds_total == 0.06 and metrics.n_tokens_max == 40
