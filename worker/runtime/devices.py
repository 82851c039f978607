"""llama.cpp's compute devices, reached through ggml's backend registry (exported by the wheel's
libggml but not bound by llama-cpp-python): `--list-devices`, `-dev/--device`, and the buffer
types that `-ot/--override-tensor` names.

Owns: the ctypes declarations of the ggml_backend_dev_* / ggml_backend_buft_* calls, and the
device list as llama-server reads it (common/arg.cpp: parse_device_list,
common_print_available_devices, parse_tensor_buffer_overrides).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import llama_cpp

MiB = 1024 * 1024

DEVICE_TYPES = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel", 4: "meta"}
"""enum ggml_backend_dev_type."""
CPU_TYPE = 0


class DeviceError(ValueError):
    """A device or buffer type that llama.cpp does not have (llama-server's words)."""


@dataclass(frozen=True)
class Device:
    handle: int
    """ggml_backend_dev_t"""
    name: str
    description: str
    type: str
    free: int
    total: int


@cache
def ggml() -> ctypes.CDLL:
    """libggml of the installed llama-cpp-python (already loaded by it: the same handle)."""
    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml.so"))
    p, s = ctypes.c_void_p, ctypes.c_char_p
    for name, args, result in (
            ("ggml_backend_dev_count", [], ctypes.c_size_t),
            ("ggml_backend_dev_get", [ctypes.c_size_t], p),
            ("ggml_backend_dev_name", [p], s),
            ("ggml_backend_dev_description", [p], s),
            ("ggml_backend_dev_type", [p], ctypes.c_int),
            ("ggml_backend_dev_memory", [p, ctypes.POINTER(ctypes.c_size_t),
                                         ctypes.POINTER(ctypes.c_size_t)], None),
            ("ggml_backend_dev_buffer_type", [p], p),
            ("ggml_backend_buft_name", [p], s)):
        function = getattr(lib, name)
        function.argtypes, function.restype = args, result
    return lib


def _device(handle: int) -> Device:
    lib = ggml()
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    lib.ggml_backend_dev_memory(handle, ctypes.byref(free), ctypes.byref(total))
    return Device(handle=handle, name=lib.ggml_backend_dev_name(handle).decode(),
                  description=lib.ggml_backend_dev_description(handle).decode(),
                  type=DEVICE_TYPES.get(lib.ggml_backend_dev_type(handle), "other"),
                  free=free.value, total=total.value)


def all_devices() -> list[Device]:
    """Every device of the backend registry, the CPU included."""
    lib = ggml()
    return [_device(lib.ggml_backend_dev_get(i)) for i in range(lib.ggml_backend_dev_count())]


def offload_devices() -> list[Device]:
    """The devices a model can be offloaded to (all but the CPU's): --list-devices."""
    return [d for d in all_devices() if d.type != "cpu"]


def cpu_device() -> Device:
    return next(d for d in all_devices() if d.type == "cpu")


def device_list_text() -> str:
    """--list-devices, as llama-server prints it."""
    devices = offload_devices()
    lines = ["Available devices:"]
    if not devices:
        lines.append("  (none)")
    lines += [f"  {d.name}: {d.description} ({d.total // MiB} MiB, {d.free // MiB} MiB free)"
              for d in devices]
    return "\n".join(lines) + "\n"


def parse_devices(value: str) -> list[Device]:
    """-dev/--device: `none` (no offloading: an empty list) or device names (the CPU is not
    one); llama-server's errors."""
    names = [n for n in value.split(",") if n]
    if not names:
        raise DeviceError("no devices specified")
    if names == ["none"]:
        return []
    by_name = {d.name: d for d in offload_devices()}
    for name in names:
        if name not in by_name:
            raise DeviceError(f"invalid device: {name}")
    return [by_name[n] for n in names]


def buffer_types() -> dict[str, int]:
    """Buffer type name → ggml_backend_buffer_type_t, of every device (what -ot may name)."""
    lib = ggml()
    types = {}
    for device in all_devices():
        buft = lib.ggml_backend_dev_buffer_type(device.handle)
        if buft:
            types[lib.ggml_backend_buft_name(buft).decode()] = buft
    return types
