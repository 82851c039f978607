"""The one rule for re-runs, and n_cmpl placement by load."""

from __future__ import annotations

from scheduler.contract.results import GenerationSettings
from scheduler.leases import Decision, decide, died_after
from scheduler.registry import ModelMeta, WorkerInfo, least_loaded


def test_first_start_runs() -> None:
    assert decide(1, 0, movable=True) is Decision.RUN
    assert decide(1, 0, movable=False) is Decision.RUN


def test_a_job_that_sent_nothing_runs_once_more() -> None:
    assert died_after(1, 0, movable=True) is Decision.RUN
    assert decide(2, 0, movable=True) is Decision.RUN


def test_a_job_that_sent_something_or_cannot_move_ends_with_503() -> None:
    assert died_after(1, 3, movable=True) is Decision.WORKER_DIED
    assert died_after(1, 0, movable=False) is Decision.WORKER_DIED


def test_a_second_death_makes_a_poison_job() -> None:
    assert died_after(2, 0, movable=True) is Decision.POISON
    assert decide(3, 0, movable=True) is Decision.POISON
    assert decide(3, 5, movable=False) is Decision.POISON


def _worker(worker_id: str, n_slots: int) -> WorkerInfo:
    meta = ModelMeta(vocab_type=1, n_vocab=10, n_ctx_train=10, n_embd=1, n_params=1, size=1)
    return WorkerInfo(worker_id=worker_id, model_id="m", model_path="m", n_slots=n_slots,
                      n_ctx_slot=10, meta=meta,
                      default_settings=GenerationSettings.model_construct(),
                      started_at=0.0)


def test_groups_go_to_the_least_loaded_worker_and_spread() -> None:
    workers = [_worker("a", 4), _worker("b", 4)]
    loads = {"a": 1.0, "b": 0.0}
    assert least_loaded(workers, loads, 2).worker_id == "b"
    assert least_loaded(workers, loads, 2).worker_id == "b"  # b: 0.5, a: 1.0
    assert least_loaded(workers, loads, 2).worker_id == "a"  # b: 1.0, a: 1.0 -> first


def test_a_worker_with_too_few_slots_is_skipped() -> None:
    workers = [_worker("small", 1), _worker("big", 4)]
    assert least_loaded(workers, {"small": 0.0, "big": 3.0}, 2).worker_id == "big"


def test_with_a_migration_limit_a_job_that_sent_something_continues() -> None:
    assert died_after(1, 3, movable=True, migration_limit=3) is Decision.MIGRATE
    assert decide(2, 3, movable=True, migration_limit=3) is Decision.MIGRATE
    assert decide(4, 3, movable=True, migration_limit=3) is Decision.MIGRATE  # 3rd move
    assert decide(2, 0, movable=True, migration_limit=3) is Decision.RUN  # nothing sent


def test_past_the_migration_limit_it_is_a_poison_job() -> None:
    assert decide(5, 3, movable=True, migration_limit=3) is Decision.POISON
    assert died_after(4, 3, movable=True, migration_limit=3) is Decision.POISON
    assert decide(3, 3, movable=True, migration_limit=1) is Decision.POISON


def test_migration_limit_0_is_the_rule_without_migration() -> None:
    for tries in range(1, 5):
        for sent in (0, 2):
            for movable in (True, False):
                assert decide(tries, sent, movable, 0) is decide(tries, sent, movable)
    assert decide(2, 2, movable=True, migration_limit=0) is Decision.WORKER_DIED


def test_pinned_jobs_never_migrate() -> None:
    assert decide(2, 3, movable=False, migration_limit=3) is Decision.WORKER_DIED
