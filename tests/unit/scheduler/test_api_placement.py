"""The api's placement service (api/placement.py) on workers made up here: the loading guard,
the capabilities' 501s, and n / n_cmpl / id_slot pinning."""

from __future__ import annotations

from typing import Any

import pytest

from api.placement import LOADING, NO_COMPLETIONS, NO_EMBEDDINGS, NO_RERANK, Placement
from scheduler.contract.errors import InvalidRequest, NotSupported, Unavailable
from scheduler.contract.jobs import CompletionJob
from scheduler.contract.results import GenerationSettings
from scheduler.decision_meta import DecisionCaps
from scheduler.registry import ModelMeta, WorkerInfo


def worker(worker_id: str, n_slots: int = 4, embedding: bool = False, pooling: str = "mean",
           decisions: bool = False) -> WorkerInfo:
    meta = ModelMeta(vocab_type=1, n_vocab=10, n_ctx_train=10, n_embd=1, n_params=1, size=1,
                     decisions=DecisionCaps(mode="prompted") if decisions else None)
    return WorkerInfo(worker_id=worker_id, model_id="m", model_path="m", n_slots=n_slots,
                      n_ctx_slot=10, meta=meta, embedding=embedding, pooling=pooling,
                      default_settings=GenerationSettings.model_construct(), started_at=0.0)


def placement(*workers: WorkerInfo, loads: dict[str, float] | None = None) -> Placement:
    async def workers_of(model_id: str, fresh: bool = False) -> list[WorkerInfo]:
        return list(workers)

    async def loads_of(of: list[WorkerInfo]) -> dict[str, float]:
        return dict(loads or {})

    return Placement(workers_of, loads_of)


def jobs(count: int) -> list[CompletionJob]:
    return [CompletionJob(model="m", prompt="x") for _ in range(count)]


async def raised(call: Any) -> Exception:
    with pytest.raises(Exception) as caught:
        await call
    return caught.value


async def test_no_live_worker_is_loading_model() -> None:
    error = await raised(placement().workers("m"))
    assert isinstance(error, Unavailable) and str(error) == LOADING
    error = await raised(placement().pin("m", jobs(2), choices=2, id_slot=-1, field="n"))
    assert isinstance(error, Unavailable)
    await placement().check_serves("m", "completion")  # nothing known yet: the job waits


async def test_capabilities_refused_as_the_spec_refuses_them() -> None:
    embedder = placement(worker("a", embedding=True))
    error = await raised(embedder.check_serves("m", "completion"))
    assert isinstance(error, NotSupported) and str(error) == NO_COMPLETIONS
    assert (await embedder.serving("m", "embedding")).worker_id == "a"
    error = await raised(embedder.serving("m", "rerank"))
    assert isinstance(error, NotSupported) and str(error) == NO_RERANK
    error = await raised(placement(worker("a")).serving("m", "embedding"))
    assert str(error) == NO_EMBEDDINGS
    ranker = placement(worker("a", embedding=True, pooling="rank"))
    assert (await ranker.serving("m", "rerank")).worker_id == "a"


async def test_decisions_need_a_worker_that_answers_them() -> None:
    error = await raised(placement(worker("a")).deciding("m"))
    assert isinstance(error, NotSupported)
    every, able = await placement(worker("a"), worker("b", decisions=True)).deciding("m")
    assert [w.worker_id for w in every] == ["a", "b"] and [w.worker_id for w in able] == ["b"]


async def test_n_is_bounded_by_the_largest_worker_and_not_pinned() -> None:
    fleet = placement(worker("a", 2), worker("b", 4))
    choices = jobs(4)
    await fleet.pin("m", choices, choices=4, id_slot=-1, field="n")
    assert all(job.worker_id is None for job in choices)
    error = await raised(fleet.pin("m", jobs(5), choices=5, id_slot=-1, field="n"))
    assert isinstance(error, InvalidRequest)
    assert str(error) == "n (5) exceeds the number of slots (4)"


async def test_n_cmpl_keeps_each_prompts_choices_on_the_least_loaded_worker() -> None:
    fleet = placement(worker("a", 4), worker("b", 4), loads={"a": 0.5})
    group = jobs(4)  # two prompts, two choices each
    await fleet.pin("m", group, choices=2, id_slot=-1, field="n_cmpl", together=True)
    assert [job.worker_id for job in group] == ["b", "b", "a", "a"]
    error = await raised(fleet.pin("m", jobs(5), choices=5, id_slot=-1, field="n_cmpl",
                                   together=True))
    assert str(error) == "n_cmpl (5) exceeds the number of slots (4)"


async def test_id_slot_pins_every_job_to_the_worker_holding_it() -> None:
    fleet = placement(worker("a", 2), worker("b", 4))
    group = jobs(2)
    await fleet.pin("m", group, choices=2, id_slot=3, field="n")
    assert [(job.worker_id, job.id_slot) for job in group] == [("b", 1), ("b", 1)]
    error = await raised(fleet.pin("m", jobs(3), choices=3, id_slot=0, field="n"))
    assert str(error) == "n (3) exceeds the number of slots (2)"
    error = await raised(fleet.pin("m", jobs(1), choices=1, id_slot=6, field="n"))
    assert isinstance(error, InvalidRequest) and "Invalid id_slot 6" in str(error)
    first = (await fleet.workers("m"))[0]
    assert first.worker_id == "a" and await fleet.slot("m", 1) == (first, 1)
