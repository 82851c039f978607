"""CPU placement as llama-server does it (common.cpp common_threadpools, server.cpp
llama_numa_init): the compute threads' CPU mask (-C, -Cr), strict placement (--cpu-strict),
priority (--prio, --prio-batch) and the batch threads' own (-Cb, -Crb, --cpu-strict-batch,
with -tb), as ggml thread pools attached to the context, and --numa. llama-cpp-python binds
none of the pool functions: they are reached with ctypes in the libraries it ships
(libggml-base, libggml-cpu, libllama), as worker/runtime/memory_probe.py reaches what the
bindings lack.

The shipped ggml-cpu is built with OpenMP (llama-server's default build is too): its threads
take the pool's mask and priority at each graph, and the pool's polling level (--poll,
--poll-batch) is read only by ggml's own (non-OpenMP) threads, so those two change nothing
there (`openmp()` tells). A pool is attached only when a placement flag is given; without one
ggml makes the same threads per graph, unplaced, as before."""

from __future__ import annotations

import ctypes
import functools
import logging
from dataclasses import dataclass, replace
from pathlib import Path

import llama_cpp as lc

from worker.runtime.cpu_settings import MAX_CPUS, NUMA_STRATEGIES, parse_cpu_mask, parse_cpu_range
from worker.runtime.settings import WorkerSettings

log = logging.getLogger(__name__)

PLACEMENT_FIELDS = frozenset({"cpu_mask", "cpu_range", "cpu_strict", "cpu_mask_batch",
                              "cpu_range_batch", "cpu_strict_batch", "prio_batch"})
"""The flags that make the worker attach thread pools."""


class ThreadpoolParams(ctypes.Structure):
    """struct ggml_threadpool_params (ggml.h)."""

    _fields_ = [("cpumask", ctypes.c_bool * MAX_CPUS), ("n_threads", ctypes.c_int),
                ("prio", ctypes.c_int), ("poll", ctypes.c_uint32),
                ("strict_cpu", ctypes.c_bool), ("paused", ctypes.c_bool)]


@dataclass(frozen=True)
class PoolSpec:
    n_threads: int
    mask: tuple[bool, ...] | None
    prio: int
    poll: int
    strict: bool


@dataclass(frozen=True)
class CpuPlan:
    main: PoolSpec | None
    """None: no placement flag, no pool (ggml's per-graph threads)."""
    batch: PoolSpec | None
    numa: int
    """enum ggml_numa_strategy (0: disabled)."""


def _mask(mask: str | None, cpu_range: str | None) -> tuple[bool, ...] | None:
    """Mask and range together (llama.cpp sets the bits of both in one mask)."""
    if mask is None and cpu_range is None:
        return None
    bits = [False] * MAX_CPUS
    for part in ([] if mask is None else [parse_cpu_mask(mask)]) + \
            ([] if cpu_range is None else [parse_cpu_range(cpu_range)]):
        bits = [a or b for a, b in zip(bits, part, strict=True)]
    return tuple(bits)


def cpu_plan(s: WorkerSettings, n_threads: int, n_threads_batch: int) -> CpuPlan:
    """llama.cpp's cpuparams and cpuparams_batch (postprocess_cpu_params: without -tb the
    batch threads take the main threads' whole placement)."""
    numa = 0 if s.numa is None else NUMA_STRATEGIES[s.numa]
    if not PLACEMENT_FIELDS & s.model_fields_set:
        return CpuPlan(None, None, numa)
    main = PoolSpec(n_threads, _mask(s.cpu_mask, s.cpu_range), s.prio, s.poll,
                    bool(s.cpu_strict))
    if s.threads_batch is None:
        batch = replace(main, n_threads=n_threads_batch)
    else:
        batch = PoolSpec(n_threads_batch, _mask(s.cpu_mask_batch, s.cpu_range_batch),
                         s.prio_batch, s.poll_batch, bool(s.cpu_strict_batch))
    return CpuPlan(main, batch, numa)


@functools.cache
def _libraries() -> tuple[ctypes.CDLL, ctypes.CDLL, ctypes.CDLL]:
    """libggml-base, libggml-cpu and libllama of the installed llama-cpp-python (already
    loaded by it: the same handles)."""
    folder = Path(lc.__file__).parent / "lib"
    base, cpu, llama = (ctypes.CDLL(str(folder / name)) for name in
                        ("libggml-base.so", "libggml-cpu.so", "libllama.so"))
    params = ctypes.POINTER(ThreadpoolParams)
    for lib, name, args, result in (
            (base, "ggml_threadpool_params_init", [params, ctypes.c_int], None),
            (base, "ggml_threadpool_params_match", [params, params], ctypes.c_bool),
            (cpu, "ggml_threadpool_new", [params], ctypes.c_void_p),
            (cpu, "ggml_threadpool_free", [ctypes.c_void_p], None),
            (llama, "llama_attach_threadpool", [ctypes.c_void_p] * 3, None),
            (llama, "llama_detach_threadpool", [ctypes.c_void_p], None)):
        function = getattr(lib, name)
        function.argtypes, function.restype = args, result
    return base, cpu, llama


def openmp() -> bool:
    """Whether the shipped ggml-cpu computes with OpenMP threads (llama_print_system_info)."""
    return b"OPENMP = 1" in lc.llama_print_system_info()


@functools.cache
def init_numa(strategy: int) -> None:
    """llama_numa_init, once a process, as llama-server calls it at start."""
    if strategy:
        lc.llama_numa_init(strategy)
        log.info("--numa: llama_numa_init(%d)", strategy)


def _params(spec: PoolSpec) -> ThreadpoolParams:
    base, _, _ = _libraries()
    params = ThreadpoolParams()
    base.ggml_threadpool_params_init(ctypes.byref(params), spec.n_threads)
    if spec.mask is not None:
        params.cpumask[:] = list(spec.mask)
    params.prio, params.poll, params.strict_cpu = spec.prio, spec.poll, spec.strict
    return params


class ThreadPools:
    """The pools attached to one context (common_threadpools::init): a batch pool of its own
    when its parameters differ, the main pool then starting paused. Free after the context."""

    def __init__(self, ctx: int, main: PoolSpec, batch: PoolSpec) -> None:
        base, cpu, llama = _libraries()
        self.pool: int | None = None
        self.batch: int | None = None
        params, params_batch = _params(main), _params(batch)
        if not base.ggml_threadpool_params_match(ctypes.byref(params),
                                                 ctypes.byref(params_batch)):
            self.batch = cpu.ggml_threadpool_new(ctypes.byref(params_batch))
            if not self.batch:
                raise RuntimeError(f"batch threadpool create failed: n_threads {batch.n_threads}")
            params.paused = True
        self.pool = cpu.ggml_threadpool_new(ctypes.byref(params))
        if not self.pool:
            self.free()
            raise RuntimeError(f"threadpool create failed: n_threads {main.n_threads}")
        llama.llama_attach_threadpool(ctx, self.pool, self.batch)
        log.info("thread pools attached: %d threads%s (strict %s, prio %d)%s", main.n_threads,
                 "" if main.mask is None else f" on CPUs {_cpus(main.mask)}", main.strict,
                 main.prio, "" if self.batch is None else
                 f"; batch {batch.n_threads} threads" +
                 ("" if batch.mask is None else f" on CPUs {_cpus(batch.mask)}"))

    def free(self) -> None:
        _, cpu, _ = _libraries()
        for pool in (self.pool, self.batch):
            if pool:
                cpu.ggml_threadpool_free(pool)
        self.pool = self.batch = None


def _cpus(mask: tuple[bool, ...]) -> str:
    return ",".join(str(i) for i, on in enumerate(mask) if on)
