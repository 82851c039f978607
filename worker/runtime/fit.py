"""`--fit on` (llama-server's default): unset arguments adjusted to the free device memory.

A port of llama.cpp's common_fit_params (common/fit.cpp, in libcommon, which the wheel does not
ship) on exact figures: each projection comes from llama.cpp itself, a model and context built
with `no_alloc` and their memory breakdown read through worker/runtime/memory_probe.py.

Ported as llama.cpp does it: the context size, when not given, becomes the model's training
context per KV stream; when the projection leaves less than `--fit-target` free (per device; of
the host's total memory on a machine without offload devices), the context is cut down linearly
towards `--fit-ctx` (aligned to 256 per stream), unless `-c 0` asked for the full context.
Simplified: with offload devices and `-ngl` left to auto, llamaq then searches the largest layer
count whose projection fits every device (llama.cpp's default split between devices); llama.cpp
additionally fills devices back to front and moves single MoE tensors, which is not ported.

Owns: the decision (pure: it calls `measure` for projections). Does not own: measuring
(worker/runtime/memory_probe.py) or the flags (worker/process/startup.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

MiB = 1024 * 1024
ALL_CONTEXT = -1
"""n_ctx_min when `-c 0` was given: the full context is asked for, never cut."""


@dataclass(frozen=True)
class Use:
    """Memory a model and context take on one device (or the host), in bytes."""

    model: int = 0
    context: int = 0
    compute: int = 0

    @property
    def total(self) -> int:
        return self.model + self.context + self.compute


@dataclass(frozen=True)
class DeviceUse:
    name: str
    free: int
    total: int
    use: Use


@dataclass(frozen=True)
class Projection:
    devices: list[DeviceUse]
    """The model's offload devices (none on a CPU-only machine)."""
    host: Use
    host_total: int

    def shortfall(self, margins: list[int]) -> int:
        """Bytes missing to leave every margin free (0: it fits)."""
        if not self.devices:
            return max(0, margins[0] - (self.host_total - self.host.total))
        return sum(max(0, margin - (d.free - d.use.total))
                   for d, margin in zip(self.devices, margins, strict=False))

    def used(self) -> int:
        return sum(d.use.total for d in self.devices) if self.devices else self.host.total

    def room(self, margins: list[int]) -> int:
        """What may be used in all (free memory less the margins)."""
        if not self.devices:
            return self.host_total - margins[0]
        return sum(d.free - m for d, m in zip(self.devices, margins, strict=False))


Measure = Callable[[int, int | None], Projection]
"""(n_ctx, n_gpu_layers or None for the configured value) → the projection."""


@dataclass(frozen=True)
class FitRequest:
    n_ctx: int
    """As configured: 0 means "from the model" (then fitted)."""
    n_ctx_train: int
    n_streams: int
    """KV streams: 1 with a unified KV cache, else the slots."""
    n_ctx_min: int
    """--fit-ctx (ALL_CONTEXT: `-c 0` was given)."""
    margins: list[int]
    """--fit-target per device, in bytes (the first one for the host without devices)."""
    n_layer: int
    layers_auto: bool
    """-ngl left to auto: the fit may choose it."""


@dataclass(frozen=True)
class FitResult:
    n_ctx: int
    n_gpu_layers: int | None
    """None: as configured."""
    fits: bool
    note: str
    projection: Projection


def fit(request: FitRequest, measure: Measure) -> FitResult:
    """llama.cpp's common_fit_params on the figures `measure` gives."""
    n_ctx_max = request.n_ctx_train * request.n_streams
    n_ctx = n_ctx_max if request.n_ctx == 0 else request.n_ctx
    full = measure(n_ctx, None)
    if full.shortfall(request.margins) == 0:
        return FitResult(n_ctx, None, True, "fits as configured", full)
    projection = full
    short_in_all = full.room(request.margins) < full.used()
    if short_in_all and request.n_ctx == 0 and request.n_ctx_min != ALL_CONTEXT:
        n_ctx_min = request.n_ctx_min * request.n_streams
        if n_ctx_max > n_ctx_min:
            smallest = measure(n_ctx_min, None)
            target = full.room(request.margins)
            if len(full.devices) > 1:  # whole layers per device waste about half a layer each
                target -= (len(full.devices) + 1) * sum(d.use.model for d in full.devices) \
                    // max(1, request.n_layer) // 2
            if target > smallest.used():
                n_ctx = n_ctx_min + (n_ctx_max - n_ctx_min) * (target - smallest.used()) \
                    // max(1, full.used() - smallest.used())
                align = 256 * request.n_streams
                n_ctx = max(n_ctx - n_ctx % align, n_ctx_min)
                projection = measure(n_ctx, None)
                if len(full.devices) <= 1:
                    return FitResult(n_ctx, None, True,
                                     f"context reduced from {n_ctx_max} to {n_ctx}", projection)
            else:
                n_ctx, projection = n_ctx_min, smallest
    if not full.devices:
        return FitResult(n_ctx, None, False, "was unable to fit model into system memory by "
                         "reducing context", projection)
    if projection.shortfall(request.margins) == 0:
        return FitResult(n_ctx, None, True, f"context reduced to {n_ctx}", projection)
    if not request.layers_auto:
        return FitResult(n_ctx, None, False, "n_gpu_layers already set by user", projection)
    return _fit_layers(request, measure, n_ctx)


def _fit_layers(request: FitRequest, measure: Measure, n_ctx: int) -> FitResult:
    """The most layers (of n_layer + 1: the output layer counts) whose projection fits."""
    low, high = 0, request.n_layer + 1
    best = measure(n_ctx, 0)
    if best.shortfall(request.margins) > 0:
        return FitResult(n_ctx, 0, False, "does not fit with no layers offloaded", best)
    while low < high:
        middle = (low + high + 1) // 2
        projection = measure(n_ctx, middle)
        if projection.shortfall(request.margins) == 0:
            low, best = middle, projection
        else:
            high = middle - 1
    return FitResult(n_ctx, low, True, f"{low} of {request.n_layer + 1} layers offloaded", best)
