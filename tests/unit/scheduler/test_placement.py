"""The placement rule (scheduler/placement.py): which worker loads a model, what unloads."""

from __future__ import annotations

import pytest

from scheduler.placement import (
    AlreadyRunning,
    HostState,
    HostView,
    NoCapacity,
    Placement,
)

FREE, LOADING, LOADED = HostState.FREE, HostState.LOADING, HostState.LOADED


def host(host_id: str, state: HostState = FREE, model: str | None = None, idle: bool = True,
         since: float = 0.0) -> HostView:
    return HostView(host_id, state, model, idle, since)


def test_a_free_host_takes_the_model_oldest_free_first() -> None:
    placement = Placement([host("b", since=5), host("a", since=9), host("c", LOADED, "x")])
    plan = placement.plan_load("m")
    assert (plan.host_id, plan.unload, plan.victims) == ("b", (), ())


def test_a_running_model_is_not_placed_again() -> None:
    for state in (LOADING, LOADED, HostState.SLEEPING):
        with pytest.raises(AlreadyRunning):
            Placement([host("a", state, "m"), host("b")]).plan_load("m")
    with pytest.raises(AlreadyRunning):
        Placement([host("b")], pinned=frozenset({"m"})).plan_load("m")


def test_models_max_unloads_the_least_recently_used_idle_model() -> None:
    hosts = [host("a", LOADED, "old"), host("b", LOADED, "new"), host("c")]
    placement = Placement(hosts, last_used={"old": 10.0, "new": 20.0}, models_max=2)
    plan = placement.plan_load("m")
    assert plan.victims == ("old",)
    assert plan.unload == ("a",)
    assert plan.host_id == "c"  # a free host loads; the victim's host becomes free


def test_models_max_victim_with_every_host_unloads_everywhere() -> None:
    hosts = [host("a", LOADED, "old"), host("b", LOADED, "old"), host("c", LOADED, "new")]
    placement = Placement(hosts, last_used={"old": 1.0, "new": 2.0}, models_max=2)
    plan = placement.plan_load("m")
    assert plan.victims == ("old",) and plan.unload == ("a", "b")
    assert plan.host_id == "a"  # no free host: the first freed one loads after its unload


def test_models_max_never_evicts_a_busy_pinned_or_loading_model() -> None:
    hosts = [host("a", LOADED, "busy", idle=False), host("b", LOADING, "coming"), host("c")]
    placement = Placement(hosts, last_used={"busy": 1.0}, models_max=3,
                          pinned=frozenset({"pinned"}))
    with pytest.raises(NoCapacity):
        placement.plan_load("m")
    placement.models_max = 4
    assert placement.plan_load("m").host_id == "c"


def test_the_lru_clock_falls_back_to_load_time() -> None:
    hosts = [host("a", LOADED, "never-used", since=50.0), host("b", LOADED, "used")]
    placement = Placement(hosts, last_used={"used": 40.0}, models_max=2)
    assert placement.plan_load("m").victims == ("used",)


def test_no_free_host_evicts_an_idle_host_of_the_lru_model() -> None:
    hosts = [host("a", LOADED, "x"), host("b", LOADED, "y")]
    placement = Placement(hosts, last_used={"x": 5.0, "y": 3.0})
    plan = placement.plan_load("m")
    assert (plan.host_id, plan.unload, plan.victims) == ("b", ("b",), ())


def test_eviction_prefers_a_model_that_keeps_another_host() -> None:
    hosts = [host("a", LOADED, "solo"), host("b", LOADED, "dup"), host("c", LOADED, "dup")]
    placement = Placement(hosts, last_used={"solo": 1.0, "dup": 9.0})
    assert placement.plan_load("m").host_id == "b"


def test_every_host_busy_is_no_capacity() -> None:
    hosts = [host("a", LOADED, "x", idle=False), host("b", LOADING, "y")]
    with pytest.raises(NoCapacity):
        Placement(hosts).plan_load("m")
    with pytest.raises(NoCapacity):
        Placement([]).plan_load("m")


def test_unload_names_every_host_of_the_model_but_never_pinned_ones() -> None:
    hosts = [host("a", LOADED, "m"), host("b", LOADING, "m"), host("c", LOADED, "x"),
             host("d")]
    placement = Placement(hosts, pinned=frozenset({"m"}))
    assert placement.plan_unload("m") == ["a", "b"]
    assert Placement([host("d")], pinned=frozenset({"m"})).plan_unload("m") == []


def test_status_of_each_value_as_the_spec_shows_it() -> None:
    from scheduler.catalog import ModelEntry
    from scheduler.fleet_models import Claim, FleetView, HostInfo, ModelFailure, status_of

    entry = ModelEntry(name="m", source="models_dir", model="/m.gguf")
    args = entry.args()
    assert status_of("m", entry, FleetView()).to_wire() == {"value": "unloaded"}
    failed = FleetView(failures={"m": ModelFailure(exit_code=1, args=args)})
    assert status_of("m", entry, failed).to_wire() == {
        "value": "unloaded", "args": args, "failed": True, "exit_code": 1}
    claimed = FleetView(hosts=[HostInfo(host_id="h", state=FREE)],
                        claims={"h": Claim(model="m")})
    assert status_of("m", entry, claimed).to_wire() == {"value": "loading", "args": args}
    for state in (LOADED, HostState.SLEEPING):
        view = FleetView(hosts=[HostInfo(host_id="h", state=state, model="m", args=["x"])],
                         failures=failed.failures)
        assert status_of("m", entry, view).to_wire() == {"value": state.value, "args": ["x"]}
    progress = {"https://h/m.gguf": {"done": 1, "total": 2}}
    assert status_of("m", entry, FleetView(downloads={"m": progress})).to_wire() == {
        "value": "downloading", "progress": progress}
    assert status_of("m", None, FleetView(incomplete={"m"})).to_wire() == {
        "value": "incomplete", "args": []}
    assert status_of("m", entry, FleetView(incomplete={"m"})).to_wire() == {"value": "unloaded"}


def test_a_model_whose_every_worker_sleeps_is_listed_sleeping() -> None:
    """Idle sleep (--sleep-idle-seconds): a host's or a pinned worker's loaded model shows
    `sleeping` once every live worker of it sleeps (scheduler/registry.py fleet_sleeping)."""
    from scheduler.catalog import ModelEntry
    from scheduler.fleet_models import FleetView, HostInfo, status_of
    from scheduler.registry import WorkerInfo

    entry = ModelEntry(name="m", source="models_dir", model="/m.gguf")
    hosted = [HostInfo(host_id="h", state=LOADED, model="m", args=["x"])]
    assert status_of("m", entry, FleetView(hosts=hosted, sleeping={"m"})).to_wire() == {
        "value": "sleeping", "args": ["x"]}
    assert status_of("m", entry, FleetView(hosts=hosted)).to_wire()["value"] == "loaded"
    worker = WorkerInfo.model_construct(worker_id="w", model_id="m", sleeping=True)
    pinned = FleetView(pinned={"m": [worker]}, sleeping={"m"})
    assert status_of("m", entry, pinned).to_wire()["value"] == "sleeping"


def test_a_host_that_is_unloading_takes_the_next_model() -> None:
    """POST /models/unload, then at once /models/load of another model: the draining host
    takes it (its load runs after the unload), before any idle model is evicted."""
    hosts = [host("a", HostState.UNLOADING, "x", since=3), host("b", LOADED, "y")]
    plan = Placement(hosts).plan_load("m")
    assert (plan.host_id, plan.unload, plan.victims) == ("a", (), ())
