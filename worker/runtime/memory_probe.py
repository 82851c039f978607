"""What a model and context would take on each device, from llama.cpp itself: the model loaded
with `no_alloc` (metadata only, allocations simulated), a context created on it, and its memory
breakdown read through a small C shim (worker/runtime/memory_probe.cpp) around libllama's
llama_get_memory_breakdown, a C++ call (llama-ext.h) that ctypes cannot reach directly.

The shim is compiled once against the installed llama-cpp-python (`scripts/install` does it;
else the first worker that needs it, when a C++ compiler is there) into the environment, or the
user's cache when that is read-only. Without a compiler there is no probe, and `--fit` says so
and leaves the arguments as given (as `-fit off`).

Owns: building and loading the shim, and measuring (worker/runtime/fit.py's `Measure`).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import llama_cpp as lc

from worker.runtime.devices import Device, all_devices, cpu_device
from worker.runtime.fit import DeviceUse, Projection, Use
from worker.runtime.llama_logs import route_llama_logs

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_suffix(".cpp")
LIB_DIR = Path(lc.__file__).parent / "lib"
MAX_BUFFER_TYPES = 64


class MemoryEntry(ctypes.Structure):
    """struct llamaq_memory (worker/runtime/memory_probe.cpp)."""
    _fields_ = [("device", ctypes.c_void_p), ("model", ctypes.c_size_t),
                ("context", ctypes.c_size_t), ("compute", ctypes.c_size_t)]


def _tag() -> str:
    """The shim's name: changes with its source and with the llama.cpp build it links."""
    digest = hashlib.sha256(SOURCE.read_bytes())
    stat = (LIB_DIR / "libllama.so").stat()
    digest.update(f"{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def _places() -> list[Path]:
    name = f"libllamaq-probe-{_tag()}.so"
    return [Path(sys.prefix) / "lib" / "llamaq" / name,
            Path.home() / ".cache" / "llamaq" / "probe" / name]


def build(dest: Path) -> None:
    """Compile the shim into `dest` (raises when there is no compiler or it fails)."""
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        raise FileNotFoundError("no C++ compiler (c++ or g++) on PATH")
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_suffix(".tmp")
    subprocess.run([compiler, "-O2", "-std=c++17", "-shared", "-fPIC", str(SOURCE),
                    "-o", str(partial), f"-L{LIB_DIR}", "-lllama", "-lggml-base",
                    f"-Wl,-rpath,{LIB_DIR}"], check=True, capture_output=True, text=True)
    partial.replace(dest)


def load_probe() -> ctypes.CDLL | None:
    """The shim, built first when it is missing and a compiler is there; None without one."""
    places = _places()
    found = next((p for p in places if p.exists()), None)
    if found is None:
        for place in places:
            try:
                build(place)
            except PermissionError:
                continue
            except (OSError, subprocess.CalledProcessError) as error:
                detail = getattr(error, "stderr", "") or error
                log.warning("--fit: the memory probe cannot be built (%s)", detail)
                return None
            found = place
            break
    if found is None:
        return None
    lib = ctypes.CDLL(str(found))
    lib.llamaq_memory_breakdown.argtypes = [ctypes.c_void_p, ctypes.POINTER(MemoryEntry),
                                            ctypes.c_int]
    lib.llamaq_memory_breakdown.restype = ctypes.c_int
    lib.llamaq_model_n_devices.argtypes = [ctypes.c_void_p]
    lib.llamaq_model_n_devices.restype = ctypes.c_int
    lib.llamaq_model_device.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.llamaq_model_device.restype = ctypes.c_void_p
    return lib


@dataclass(frozen=True)
class ModelShape:
    n_layer: int
    n_ctx_train: int
    n_devices: int
    """The offload devices the model would use."""


class MemoryProbe:
    """Projections of one model file under the worker's own parameters."""

    def __init__(self, lib: ctypes.CDLL, path: Path,
                 model_params: Callable[[], lc.llama_model_params],
                 context_params: Callable[[int], lc.llama_context_params]) -> None:
        self._lib = lib
        self._path = path
        self._model_params = model_params
        self._context_params = context_params

    def shape(self) -> ModelShape:
        model = self._load(None)
        try:
            return ModelShape(n_layer=lc.llama_model_n_layer(model),
                              n_ctx_train=lc.llama_model_n_ctx_train(model),
                              n_devices=self._lib.llamaq_model_n_devices(model))
        finally:
            lc.llama_model_free(model)

    def measure(self, n_ctx: int, n_gpu_layers: int | None) -> Projection:
        model = self._load(n_gpu_layers)
        try:
            ctx = lc.llama_init_from_model(model, self._context_params(n_ctx))
            if not ctx:
                raise RuntimeError(f"failed to create a context of {n_ctx} tokens")
            try:
                return self._projection(model, ctx)
            finally:
                lc.llama_free(ctx)
        finally:
            lc.llama_model_free(model)

    def _load(self, n_gpu_layers: int | None) -> lc.llama_model_p:
        """The model's metadata only (LLAMA_LOAD_MODE_NONE; allocations simulated)."""
        route_llama_logs()
        mparams = self._model_params()
        mparams.no_alloc = True
        mparams.load_mode = 0
        if n_gpu_layers is not None:
            mparams.n_gpu_layers = n_gpu_layers
        model = lc.llama_model_load_from_file(str(self._path).encode(), mparams)
        if not model:
            raise RuntimeError(f"failed to load model from {self._path}")
        return model

    def _projection(self, model: lc.llama_model_p, ctx: lc.llama_context_p) -> Projection:
        lib = self._lib
        handles = [lib.llamaq_model_device(model, i)
                   for i in range(lib.llamaq_model_n_devices(model))]
        entries = (MemoryEntry * MAX_BUFFER_TYPES)()
        n = min(lib.llamaq_memory_breakdown(ctx, entries, MAX_BUFFER_TYPES), MAX_BUFFER_TYPES)
        per_device = {h: Use() for h in handles}
        host = Use()
        for entry in entries[:n]:
            if entry.device is None:
                host = _plus(host, entry)
            elif entry.device in per_device:  # other buffers (CPU repack) llama.cpp leaves out
                per_device[entry.device] = _plus(per_device[entry.device], entry)
        known: dict[int, Device] = {d.handle: d for d in all_devices()}
        cpu = cpu_device()
        return Projection(
            devices=[DeviceUse(known[h].name, known[h].free, known[h].total, per_device[h])
                     for h in handles],
            host=host, host_total=cpu.total)


def _plus(use: Use, entry: MemoryEntry) -> Use:
    return Use(use.model + entry.model, use.context + entry.context,
               use.compute + entry.compute)


def main() -> None:
    """`python -m worker.runtime.memory_probe`: build the shim (scripts/install runs it)."""
    lib = load_probe()
    if lib is None:
        sys.exit("llamaq: the memory probe for --fit was not built (see the warning above)")
    print(f"llamaq: memory probe ready ({next(p for p in _places() if p.exists())})")


if __name__ == "__main__":
    main()
