"""How many threads ggml computes with, from how busy the machine is (plain state).

ggml's OpenMP threads, as llama-server ships them (OMP_WAIT_POLICY unset), spin for a while at
each barrier of a graph before they sleep: on a quiet machine that is the fastest way to wait
(sleeping at every barrier, OMP_WAIT_POLICY=PASSIVE, cost 0.6x at 1 client on 2 cores), but
when other processes want those cores a spinning thread burns the time that the thread it waits
for needs, and each step gets many times slower (llama-server at 1/8 clients beside one busy
loop on 2 cores: 6 and 14 tok/s, against 63 and 124 alone). So the engine computes with the
threads it was given while the rest of the machine leaves them room, and with fewer (down to
one: no barrier at all) while it does not, measured from /proc/stat: the CPU time every other
process used over the last interval.

Owns: that choice. Does not own: llama.cpp (the engine applies the count with
llama_set_n_threads), reading /proc (CpuSample.read does, and only that).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass

INTERVAL_S = 0.5
"""How often the machine's load is looked at (the engine thread reads two small files)."""
MARGIN_CORES = 0.7
"""Other processes may use this much of a core beside our threads before one thread is
dropped: the api, Redis and clients on the same box use a little, in bursts, and two spinning
threads still beat one beside them (measured: 2 cores, 8 streams, ~0.3-0.5 cores of others)."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CpuSample:
    """Cumulative CPU seconds: the whole machine's busy time, and this process's."""

    machine_busy_s: float
    own_s: float
    at_s: float

    @staticmethod
    def read(now_s: float) -> CpuSample | None:
        """From /proc/stat (all CPUs: user nice system irq softirq steal) and os.times; None
        where /proc is not there."""
        try:
            with open("/proc/stat", encoding="ascii") as stat:
                fields = stat.readline().split()
        except OSError:
            return None
        tick = os.sysconf("SC_CLK_TCK")
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[1:9])
        own = os.times()
        return CpuSample((user + nice + system + irq + softirq + steal) / tick,
                         own.user + own.system, now_s)

    def others_cores(self, since: CpuSample) -> float | None:
        """The cores every other process used between `since` and this sample."""
        wall = self.at_s - since.at_s
        if wall <= 0:
            return None
        return max(0.0, (self.machine_busy_s - since.machine_busy_s)
                   - (self.own_s - since.own_s)) / wall


@dataclass
class ComputeThreads:
    """The thread count for the next decode: `configured` (-t / -tb) while other processes
    leave room for them, fewer while they do not."""

    configured: int
    configured_batch: int
    cores: int
    current: int = 0
    last: CpuSample | None = None
    others_cores: float = 0.0
    """What the other processes used over the last interval, in cores."""

    def __post_init__(self) -> None:
        self.current = self.configured

    def threads(self) -> tuple[int, int]:
        """(n_threads, n_threads_batch) to compute with now."""
        if self.current == self.configured:
            return self.configured, self.configured_batch
        return self.current, min(self.current, self.configured_batch)

    def observe(self, sample: CpuSample | None) -> bool:
        """Take a new sample (at most every INTERVAL_S: None in between is fine); True when
        the thread count changed."""
        if sample is None:
            return False
        last, self.last = self.last, sample
        if last is None:
            return False
        others = sample.others_cores(last)
        if others is None:
            return False
        self.others_cores = others
        room = math.floor(self.cores - others + MARGIN_CORES)
        wanted = max(1, min(self.configured, room))
        changed = wanted != self.current
        self.current = wanted
        return changed

    def due(self, now_s: float) -> bool:
        return self.last is None or now_s - self.last.at_s >= INTERVAL_S


WAIT_POLICY_ENV = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def wait_policy_by_hand(env: Mapping[str, str]) -> bool:
    """OMP_WAIT_POLICY or GOMP_SPINCOUNT set: threads that sleep at once (PASSIVE) or spin as
    told; the engine then keeps the thread count it was given."""
    return any(name in env for name in WAIT_POLICY_ENV)


def machine_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


BACKGROUND_NICE = 10
"""How much lower the background decode thread's CPU priority is (nice steps)."""


def lower_cpu_priority() -> None:
    """Run the calling thread (and the ggml threads it starts: OpenMP gives each thread that
    starts a parallel region a pool of its own) at a lower CPU priority than the rest of the
    worker, and of the machine's processes: batch work yields the cores to online requests,
    to the event loop that hands them in and out, and to the api and Redis beside it. Linux
    only (a thread id is a process id for setpriority there); elsewhere nothing changes."""
    if sys.platform != "linux":
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + BACKGROUND_NICE)
    except OSError as error:
        log.warning("cannot lower the background decode thread's priority: %s", error)
