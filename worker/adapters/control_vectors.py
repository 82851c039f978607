"""Control vectors (--control-vector, --control-vector-scaled, --control-vector-layer-range):
global only, as llama-server has them. Each file's `direction.N` tensors (one float per
embedding dimension, layer N >= 1) are scaled by the file's strength and summed across files,
then set on the context once with llama_set_adapter_cvec over the layer range (default: every
layer), as llama.cpp's common_control_vector_load and common_init_from_params do.

Owns: the flags' vector files and strengths, reading and summing them (the `gguf` package), and
setting the sum on a context. A file that is not a valid control vector stops the worker.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import llama_cpp as lc

if TYPE_CHECKING:
    import numpy as np  # for annotations: imported where used, ~19 MiB a worker may never need

log = logging.getLogger(__name__)


class ControlVectorError(RuntimeError):
    """A control vector file could not be read or applied (a start-up failure)."""


@dataclass(frozen=True)
class VectorSpec:
    path: str
    strength: float


def vector_specs(plain: list[str], scaled: list[str]) -> list[VectorSpec]:
    """The flags' vectors in llama-server's order: every --control-vector (strength 1), then
    every --control-vector-scaled FNAME:SCALE."""
    specs = [VectorSpec(path, 1.0) for path in plain]
    for item in scaled:
        parts = item.split(":")
        if len(parts) != 2:
            raise ValueError("control-vector-scaled format: FNAME:SCALE")
        try:
            specs.append(VectorSpec(parts[0], float(parts[1])))
        except ValueError:
            raise ValueError("control-vector-scaled format: FNAME:SCALE "
                             f"(bad scale {parts[1]!r})") from None
    return specs


def load_one(spec: VectorSpec) -> tuple[int, np.ndarray]:
    """(n_embd, data): layer 1's direction first, each scaled by the file's strength."""
    import gguf  # (and PyYAML): only on a worker given control vectors
    import numpy as np

    try:
        reader = gguf.GGUFReader(spec.path)
    except (OSError, ValueError) as error:
        raise ControlVectorError(f"failed to load control vector file from {spec.path}: "
                                 f"{error}") from None
    n_embd = -1
    data = np.zeros(0, dtype=np.float32)
    for tensor in reader.tensors:
        prefix, _, index = tensor.name.partition(".")
        layer = int(index) if prefix == "direction" and index.isdigit() else -1
        if layer <= 0:
            raise ControlVectorError(f"invalid direction tensor layer index in {spec.path}")
        if tensor.tensor_type != gguf.GGMLQuantizationType.F32:
            raise ControlVectorError(f"invalid (non-F32) direction tensor type in {spec.path}")
        values = np.asarray(tensor.data, dtype=np.float32).reshape(-1)
        if len(tensor.shape) != 1:
            raise ControlVectorError(f"invalid (non-1D) direction tensor shape in {spec.path}")
        if n_embd == -1:
            n_embd = values.size
        elif values.size != n_embd:
            raise ControlVectorError(f"direction tensor in {spec.path} does not match previous "
                                     "dimensions")
        if data.size < n_embd * layer:
            data = np.concatenate([data, np.zeros(n_embd * layer - data.size, np.float32)])
        data[n_embd * (layer - 1):n_embd * layer] += values * np.float32(spec.strength)
    if n_embd == -1:
        raise ControlVectorError(f"no direction tensors found in {spec.path}")
    return n_embd, data


def load_vectors(specs: list[VectorSpec],
                 files: Mapping[str, Path]) -> tuple[int, np.ndarray] | None:
    """The files' sum (None: no control vector given); `files`: each source's local file
    (worker/wires/model_source.py; a source not in it is a path)."""
    if not specs:
        return None
    import numpy as np

    local = [VectorSpec(str(files.get(s.path, s.path)), s.strength) for s in specs]
    n_embd, total = load_one(local[0])
    for spec in local[1:]:
        n, data = load_one(spec)
        if n != n_embd:
            raise ControlVectorError(f"control vectors in {spec.path} does not match previous "
                                     "dimensions")
        if data.size > total.size:
            total = np.concatenate([total, np.zeros(data.size - total.size, np.float32)])
        total[:data.size] += data
    return n_embd, total


def apply_vectors(ctx: Any, n_layer: int, vectors: tuple[int, np.ndarray],
                  layer_range: list[int]) -> None:
    """Set the summed vector on the context over the layer range (start, end inclusive; a
    bound <= 0: layer 1, the last layer)."""
    import numpy as np

    start, end = layer_range if layer_range else (-1, -1)
    start = start if start > 0 else 1
    end = end if end > 0 else n_layer
    n_embd, data = vectors
    buffer = np.ascontiguousarray(data, dtype=np.float32)
    pointer = buffer.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    if lc.llama_set_adapter_cvec(ctx, pointer, buffer.size, n_embd, start, end) != 0:
        raise ControlVectorError(f"the control vector (n_embd {n_embd}) does not fit the model")
    log.info("control vector applied to layers %d..%d (n_embd %d)", start, end, n_embd)
