"""A worker's LoRA adapters (--lora, --lora-scaled, --lora-init-without-apply): loaded on its
model, with their global scales, applied to the context before each decode.

Owns: the adapter list (llama_adapter_lora_init; task name, prompt prefix and aLoRA invocation
tokens read from each file), the global scales (set by POST /lora-adapters through Redis, from
any thread) and setting them on the context (llama_set_adapters_lora, on the engine thread,
only when they changed). The adapters are freed with the model (llama.cpp frees them there).
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp as lc

from scheduler.registry import LoraAdapterInfo
from worker.runtime.vocab import Vocab

log = logging.getLogger(__name__)


class LoraLoadError(RuntimeError):
    """An adapter file could not be loaded on the model (a start-up failure)."""


@dataclass(frozen=True)
class AdapterSpec:
    """One adapter of the flags: its file and its scale at start."""

    path: str
    scale: float


def adapter_specs(lora: list[str], lora_scaled: list[str],
                  init_without_apply: bool) -> list[AdapterSpec]:
    """The flags' adapters in llama-server's order (every --lora, then every --lora-scaled,
    as common/arg.cpp appends them), scale 1 (or FNAME:SCALE); 0 with --lora-init-without-apply
    (the spec's words; the vendored llama-server keeps the scale and only skips applying it)."""
    specs = [AdapterSpec(path, 1.0) for path in lora]
    for item in lora_scaled:
        parts = item.split(":")
        if len(parts) != 2:
            raise ValueError("lora-scaled format: FNAME:SCALE")
        try:
            specs.append(AdapterSpec(parts[0], float(parts[1])))
        except ValueError:
            raise ValueError(f"lora-scaled format: FNAME:SCALE (bad scale {parts[1]!r})") from None
    if init_without_apply:
        specs = [AdapterSpec(s.path, 0.0) for s in specs]
    return specs


@dataclass(frozen=True)
class LoadedAdapter:
    handle: Any
    """The llama_adapter_lora pointer (owned by the model)."""
    info: LoraAdapterInfo


class LoraAdapters:
    """The model's adapters and their global scales."""

    def __init__(self, adapters: list[LoadedAdapter], scales: list[float]) -> None:
        self.adapters = adapters
        self._scales = list(scales)
        self._applied: list[float] | None = None if adapters else []
        """What the context has now (None: nothing set yet)."""
        self._lock = threading.Lock()

    @classmethod
    def none(cls) -> LoraAdapters:
        return cls([], [])

    @classmethod
    def load(cls, model: Any, vocab: Vocab, specs: list[AdapterSpec],
             files: Mapping[str, Path]) -> LoraAdapters:
        """Load each adapter on `model` (a llama_model pointer) from its local file (`files`:
        worker/wires/model_source.py; a source not in it is a path); a file that fails stops the
        worker, as llama-server stops ("failed to load lora adapter"). The adapter's `path`
        is its source as given."""
        loaded = []
        for i, spec in enumerate(specs):
            local = str(files.get(spec.path, spec.path))
            handle = lc.llama_adapter_lora_init(model, local.encode())
            if not handle:
                raise LoraLoadError(f"failed to load lora adapter '{spec.path}'")
            tokens = invocation_tokens(handle)  # an aLoRA: worker/adapters/alora.py
            loaded.append(LoadedAdapter(handle, LoraAdapterInfo(
                id=i, path=spec.path, scale=spec.scale,
                task_name=_meta(handle, "adapter.lora.task_name"),
                prompt_prefix=_meta(handle, "adapter.lora.prompt_prefix"),
                alora_invocation_string="".join(vocab.piece(t, True).decode("utf-8", "replace")
                                                for t in tokens) if tokens else None,
                alora_invocation_tokens=tokens or None)))
            log.info("lora adapter %d loaded: %s (scale %g%s)", i, spec.path, spec.scale,
                     f", aLoRA with {len(tokens)} invocation tokens" if tokens else "")
        return cls(loaded, [s.scale for s in specs])

    @property
    def scales(self) -> list[float]:
        with self._lock:
            return list(self._scales)

    def set_scales(self, scales: list[float]) -> bool:
        """New global scales (any thread); False (and no change) unless one per adapter."""
        if len(scales) != len(self.adapters):
            return False
        with self._lock:
            self._scales = list(scales)
        return True

    def infos(self) -> list[LoraAdapterInfo]:
        """The adapters as the registry lists them, with the global scales."""
        scales = self.scales
        return [a.info.model_copy(update={"scale": s})
                for a, s in zip(self.adapters, scales, strict=True)]

    def apply(self, ctx: Any, scales: list[float]) -> None:
        """Set `scales` on the context unless it has them already (the engine thread, before
        a decode). Every adapter is passed, those at 0 too, as llama-server's
        common_set_adapter_lora does (the same graph)."""
        if scales == self._applied:
            return
        n = len(self.adapters)
        handles = (lc.llama_adapter_lora_p_ctypes * n)(*(a.handle for a in self.adapters))
        values = (ctypes.c_float * n)(*scales)
        if lc.llama_set_adapters_lora(ctx, handles, n, values) != 0:
            log.error("llama_set_adapters_lora failed for scales %s", scales)
        self._applied = list(scales)


def invocation_tokens(handle: Any) -> list[int]:
    """An aLoRA's invocation tokens (empty for a plain LoRA)."""
    n = lc.llama_adapter_get_alora_n_invocation_tokens(handle)
    if not n:
        return []
    tokens = lc.llama_adapter_get_alora_invocation_tokens(handle)
    return [int(tokens[i]) for i in range(n)] if tokens else []


def _meta(handle: Any, key: str) -> str:
    buf = ctypes.create_string_buffer(1024)
    if lc.llama_adapter_meta_val_str(handle, key.encode(), buf, len(buf)) < 0:
        return ""
    return buf.value.decode("utf-8", errors="replace")
