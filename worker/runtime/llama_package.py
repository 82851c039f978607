"""llama-cpp-python's package without its high-level half, for the worker process.

The worker calls llama.cpp's C API only (`llama_cpp.llama_cpp`, `mtmd_cpp`, and
`llama_grammar`'s JSON-schema converter), but the package's `__init__` also imports
`llama_cpp.llama` (the `Llama` class), which brings numpy, jinja2, diskcache (sqlite3) and
multiprocessing: about 25 MiB of resident memory in every worker that never uses them.
`bindings_only()` registers the package as `__init__` would after its first line (`from
.llama_cpp import *`) and leaves the rest for later: the first attribute the bindings do not
have (`llama_cpp.Llama`, `__version__`) runs the real `__init__`, so every use of the package
keeps working, in any order; submodules (`from llama_cpp import mtmd_cpp`) import as usual.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import threading
from types import ModuleType
from typing import Any

PACKAGE = "llama_cpp"


def bindings_only() -> None:
    """Make `import llama_cpp` in this process load the C bindings only (see above). Does
    nothing when the package is already imported, is not installed or its library does not
    load (the import that needs it then fails as it would have)."""
    if PACKAGE in sys.modules:
        return
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        return
    package = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = package
    try:
        bindings = importlib.import_module(f"{PACKAGE}.llama_cpp")
    except (ImportError, OSError):
        del sys.modules[PACKAGE]
        return
    package.__dict__.update(_public(bindings))
    package.__dict__["__getattr__"] = _completing(package)


def _public(module: ModuleType) -> dict[str, Any]:
    """What `from module import *` binds."""
    names = getattr(module, "__all__", None)
    if names is None:
        names = [name for name in vars(module) if not name.startswith("_")]
    return {name: getattr(module, name) for name in names}


def _completing(package: ModuleType) -> Any:
    """The package's module `__getattr__` (PEP 562): a submodule's name imports that
    submodule; any other missing name runs the package's real `__init__` once (other threads
    wait for it; a lookup from inside it sees a partly initialized module, as an import
    would), then is looked up again."""
    lock = threading.RLock()
    ran = running = False

    def __getattr__(name: str) -> Any:
        nonlocal ran, running
        if name.startswith("__") and name != "__version__":
            raise AttributeError(name)  # __path__, __spec__ ... are set; others never were
        if importlib.util.find_spec(f"{PACKAGE}.{name}") is not None:
            return importlib.import_module(f"{PACKAGE}.{name}")
        with lock:
            if not ran and not running:
                running = True
                try:
                    assert package.__spec__ is not None and package.__spec__.loader is not None
                    package.__spec__.loader.exec_module(package)
                    ran = True
                finally:
                    running = False
        try:
            return package.__dict__[name]
        except KeyError:
            raise AttributeError(f"module {PACKAGE!r} has no attribute {name!r}") from None

    return __getattr__
