"""The worker's CPU placement flags (llama-server's -C/-Cr/--cpu-strict/--poll and their batch
forms, --prio-batch, --numa), a part of WorkerSettings (worker/runtime/settings.py);
worker/runtime/cpu_pools.py turns them into ggml thread pools and llama_numa_init."""

from __future__ import annotations

from pydantic import field_validator

from scheduler.config.settings import flag
from scheduler.contract.deferred import DeferredModel

NUMA_STRATEGIES = {"distribute": 1, "": 1, "isolate": 2, "numactl": 3}
"""--numa's values as llama.cpp's argument parser reads them (enum ggml_numa_strategy)."""
MAX_CPUS = 512
"""GGML_MAX_N_THREADS: the length of a thread pool's CPU mask."""


def parse_cpu_mask(mask: str) -> list[bool]:
    """llama.cpp's parse_cpu_mask: hex digits (an optional 0x), the last digit CPUs 0-3; at
    most 128 digits are read."""
    digits = mask[2:] if mask.startswith("0x") else mask
    digits = digits[:128]
    cpus = [False] * MAX_CPUS
    for i, char in enumerate(digits):
        try:
            value = int(char, 16)
        except ValueError:
            raise ValueError(f"invalid cpumask: invalid hex character '{char}'") from None
        top = (len(digits) - i) * 4 - 1
        for bit in range(4):
            if value & (8 >> bit):
                cpus[top - bit] = True
    return cpus


def parse_cpu_range(text: str) -> list[bool]:
    """llama.cpp's parse_cpu_range: [lo]-[hi], both ends in the mask."""
    lo, dash, hi = text.partition("-")
    if not dash:
        raise ValueError("invalid range: expected [<start>]-[<end>]")
    try:
        start = int(lo) if lo else 0
        end = int(hi) if hi else MAX_CPUS - 1
    except ValueError:
        raise ValueError(f"invalid range: '{text}'") from None
    if not 0 <= start < MAX_CPUS or not 0 <= end < MAX_CPUS:
        raise ValueError(f"invalid range: '{text}' (CPUs 0-{MAX_CPUS - 1})")
    return [start <= cpu <= end for cpu in range(MAX_CPUS)]


class CpuSettings(DeferredModel):
    cpu_mask: str | None = flag(None, "-C", "--cpu-mask",
                                help="CPU affinity mask: arbitrarily long hex. Complements "
                                "cpu-range")
    cpu_range: str | None = flag(None, "-Cr", "--cpu-range",
                                 help="range of CPUs for affinity. Complements --cpu-mask")
    cpu_strict: int = flag(0, "--cpu-strict", help="use strict CPU placement (<0|1>)")
    poll: int = flag(50, "--poll", help="use polling level to wait for work (0 - no polling; "
                     "read by ggml's own thread pool only: the shipped ggml uses OpenMP)")
    cpu_mask_batch: str | None = flag(None, "-Cb", "--cpu-mask-batch",
                                      help="CPU affinity mask of the batch threads (with -tb; "
                                      "without it the batch threads take -C's placement)")
    cpu_range_batch: str | None = flag(None, "-Crb", "--cpu-range-batch",
                                       help="ranges of CPUs for affinity of the batch threads. "
                                       "Complements --cpu-mask-batch")
    cpu_strict_batch: int = flag(0, "--cpu-strict-batch",
                                 help="use strict CPU placement for the batch threads")
    prio_batch: int = flag(0, "--prio-batch", choices=(0, 1, 2, 3),
                           help="batch threads' priority: 0-normal, 1-medium, 2-high, "
                           "3-realtime")
    poll_batch: int = flag(50, "--poll-batch", help="use polling to wait for work (batch "
                           "threads; as --poll)")
    numa: str | None = flag(None, "--numa", env="LLAMA_ARG_NUMA",
                            help="attempt optimizations that help on some NUMA systems: "
                            "distribute, isolate, numactl")

    @field_validator("cpu_mask", "cpu_mask_batch")
    @classmethod
    def _mask(cls, value: str | None) -> str | None:
        if value is not None:
            parse_cpu_mask(value)
        return value

    @field_validator("cpu_range", "cpu_range_batch")
    @classmethod
    def _range(cls, value: str | None) -> str | None:
        if value is not None:
            parse_cpu_range(value)
        return value

    @field_validator("numa")
    @classmethod
    def _numa_strategy(cls, value: str | None) -> str | None:
        if value is not None and value not in NUMA_STRATEGIES:
            raise ValueError(f"invalid value for --numa: '{value}' (distribute, isolate, "
                             "numactl)")
        return value

    @field_validator("cpu_strict", "cpu_strict_batch", "poll", "poll_batch")
    @classmethod
    def _unsigned(cls, value: int) -> int:
        if value < 0:
            raise ValueError("must not be negative")
        return value
