"""Where the model's tensors go: `-ot/--override-tensor`, `-cmoe/--cpu-moe`,
`-ncmoe/--n-cpu-moe`, `-ncffn/--n-cpu-ffn` (tensor buffer overrides) and `-dev/--device`, as
NULL-terminated arrays in llama_model_params (fields llama-cpp-python declares as bare pointers).

Owns: parsing those flags as llama-server does (common/arg.cpp, common.h's LLM_FFN_* patterns)
and the ctypes memory the arrays live in (kept by the Placement until the model is loaded).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import llama_cpp as lc

from worker.runtime.devices import Device, DeviceError, buffer_types

FFN_EXPERTS = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
"""llama.cpp's LLM_FFN_EXPS_REGEX: the MoE expert weights."""
FFN_DENSE = r"\.ffn_(up|down|gate)\."
"""llama.cpp's LLM_FFN_DENSE_REGEX: the dense FFN weights."""
CPU_BUFFER = "CPU"


class TensorOverride(ctypes.Structure):
    """struct llama_model_tensor_buft_override."""
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


@dataclass(frozen=True)
class Override:
    pattern: str
    buffer_type: str


def parse_overrides(values: list[str], flag: str = "--override-tensor") -> list[Override]:
    """-ot (or -otd, named `flag`) `<tensor name pattern>=<buffer type>,...` (the flag may
    repeat)."""
    overrides = []
    for value in values:
        for item in value.split(","):
            pattern, found, buffer_type = item.partition("=")
            if not found:
                raise DeviceError(f"invalid value for {flag}: {item!r}")
            overrides.append(Override(pattern, buffer_type))
    return overrides


def cpu_ffn_overrides(n_layers: int, ffn_pattern: str) -> list[Override]:
    """-ncmoe / -ncffn N: that part of the first N layers' weights stays in the CPU."""
    if n_layers < 0:
        raise DeviceError("invalid value")
    return [Override(f"blk\\.{i}{ffn_pattern}", CPU_BUFFER) for i in range(n_layers)]


@dataclass
class Placement:
    """The arrays handed to llama_model_params; alive as long as this object."""

    overrides: list[Override] = field(default_factory=list)
    devices: list[Device] | None = None
    """-dev: None (every device llama.cpp finds), [] (none), or those named."""
    _keep: list[object] = field(default_factory=list)

    def __post_init__(self) -> None:
        known = buffer_types() if self.overrides else {}
        unknown = [o.buffer_type for o in self.overrides if o.buffer_type not in known]
        if unknown:
            raise DeviceError(f"unknown buffer type: {unknown[0]} (available: "
                              f"{', '.join(sorted(known))})")

    def apply(self, params: lc.llama_model_params) -> None:
        if self.overrides:
            known = buffer_types()
            patterns = [o.pattern.encode() for o in self.overrides]
            array = (TensorOverride * (len(patterns) + 1))(
                *(TensorOverride(p, known[o.buffer_type])
                  for p, o in zip(patterns, self.overrides, strict=True)),
                TensorOverride(None, None))
            self._keep += [patterns, array]
            params.tensor_buft_overrides = ctypes.cast(array, ctypes.c_void_p)  # type: ignore[assignment]
        if self.devices is not None:
            handles = (ctypes.c_void_p * (len(self.devices) + 1))(
                *(d.handle for d in self.devices), None)
            self._keep.append(handles)
            params.devices = ctypes.cast(handles, ctypes.c_void_p)  # type: ignore[assignment]
