"""Placement: which worker loads a model, and what unloads to make room (router mode).

DESIGN
------
A worker process serves one model at a time. Workers started with `-m`/`-hf` are *pinned*:
they serve that model for life and are never asked to load or unload. Workers started without
a model are *hosts*: a host is `free` until asked to load a model, then `loading`, `loaded`
(serving it), `unloading` (draining), and free again. The fleet, not one process, is the
router: any api pod may decide a placement, under a Redis lock (`keys.PLACEMENT_LOCK`) so that
two pods never give one host two models or load past `--models-max`.

The rule, given the fleet as one api pod reads it (`Placement`):

1. A model that is already *running* (a host loading or serving it, or a pinned worker) is not
   placed again: `/models/load` answers 400 "model is already running".
2. `--models-max N` (N > 0) bounds the distinct models running fleet-wide (pinned ones
   included). At the bound, the least recently used running model (the LRU clock is the time
   of the last POST request that named it, else when it was loaded) whose hosts are all idle
   is unloaded from every host; a model with a busy host, a pinned model or the one being
   placed is never a victim. No victim: the load is refused (as rule 5).
3. The model goes to a free host (the one that has been free the longest, then by id). If
   rule 2 freed hosts, the first of them takes it (it unloads, then loads, in that order).
4. No free host: a host that is unloading takes it (it loads once its drain ends: an unload
   then at once a load of another model succeeds, as it does in llama-server). Else an idle
   host of the least recently used other model is evicted (it unloads, then loads the new
   model). A host whose model has another host goes first, so that an eviction does not take
   a model off the fleet when it can be avoided.
5. Nothing free, unloading or idle: refused, with llama-server's 500 "model limit reached,
   try again later".

A host is idle when no slot of it is processing and nothing waits in its queues. The plan is
a list of commands (unload / load per host) that the caller writes to each host's command
list; a host runs its commands in order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class HostState(StrEnum):
    FREE = "free"
    LOADING = "loading"
    LOADED = "loaded"
    UNLOADING = "unloading"
    SLEEPING = "sleeping"
    """Loaded, but its weights are freed until a request wakes it (idle sleep)."""


RUNNING_STATES = (HostState.LOADING, HostState.LOADED, HostState.SLEEPING)


class AlreadyRunning(Exception):
    """The model is loading or loaded somewhere in the fleet."""


class NoCapacity(Exception):
    """No host can take the model now (all busy, or --models-max with every model busy)."""


@dataclass(frozen=True)
class HostView:
    host_id: str
    state: HostState
    model: str | None = None
    idle: bool = True
    since: float = 0.0
    """When the host entered its state (unix s)."""


@dataclass(frozen=True)
class LoadPlan:
    host_id: str
    """The host that loads the model."""
    unload: tuple[str, ...] = ()
    """Hosts that unload their model first (the chosen host may be one of them)."""
    victims: tuple[str, ...] = ()
    """Models that leave the fleet entirely (for --models-max)."""


@dataclass
class Placement:
    hosts: list[HostView]
    last_used: dict[str, float] = field(default_factory=dict)
    models_max: int = 0
    pinned: frozenset[str] = frozenset()
    """Models served by pinned workers (started with -m)."""

    def running_models(self) -> set[str]:
        running = {h.model for h in self.hosts if h.state in RUNNING_STATES and h.model}
        return running | set(self.pinned)

    def hosts_of(self, model: str) -> list[HostView]:
        return [h for h in self.hosts if h.model == model and h.state in RUNNING_STATES]

    def _clock(self, model: str) -> float:
        """The LRU clock of a model: its last use, else when its first host took it."""
        used = self.last_used.get(model)
        if used is not None:
            return used
        return min((h.since for h in self.hosts_of(model)), default=0.0)

    def plan_load(self, model: str) -> LoadPlan:
        """Where `model` loads, and what unloads first (rules 1-5 of the module doc)."""
        running = self.running_models()
        if model in running:
            raise AlreadyRunning(model)
        unload: list[str] = []
        victims: list[str] = []
        if self.models_max > 0 and len(running) >= self.models_max:
            victim = self._lru_victim(model)
            if victim is None:
                raise NoCapacity(f"--models-max {self.models_max} models are loaded and each "
                                 "is busy or pinned")
            victims.append(victim)
            unload += sorted(h.host_id for h in self.hosts_of(victim))
        free = sorted((h for h in self.hosts if h.state is HostState.FREE),
                      key=lambda h: (h.since, h.host_id))
        if free:
            return LoadPlan(free[0].host_id, tuple(unload), tuple(victims))
        if unload:
            return LoadPlan(unload[0], tuple(unload), tuple(victims))
        freeing = sorted((h for h in self.hosts if h.state is HostState.UNLOADING),
                         key=lambda h: (h.since, h.host_id))
        if freeing:  # its load command runs when its unload (the drain) ends
            return LoadPlan(freeing[0].host_id, (), tuple(victims))
        evictable = [h for h in self.hosts
                     if h.state in (HostState.LOADED, HostState.SLEEPING) and h.idle
                     and h.model and h.model != model]
        if not evictable:
            raise NoCapacity("no worker is free: every worker is busy or loading")
        chosen = min(evictable, key=lambda h: (len(self.hosts_of(h.model or "")) == 1,
                                              self._clock(h.model or ""), h.host_id))
        return LoadPlan(chosen.host_id, (chosen.host_id,), ())

    def _lru_victim(self, model: str) -> str | None:
        candidates = []
        for other in self.running_models() - {model} - set(self.pinned):
            hosts = self.hosts_of(other)
            if hosts and all(h.idle and h.state is not HostState.LOADING for h in hosts):
                candidates.append(other)
        return min(candidates, key=lambda m: (self._clock(m), m), default=None)

    def plan_unload(self, model: str) -> list[str]:
        """The hosts that unload when `model` is unloaded (pinned workers never do)."""
        return sorted(h.host_id for h in self.hosts_of(model))
