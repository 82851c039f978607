"""Every import points down, and no module imports itself back through others.

Read from the code itself (ast, every `import` wherever it is: at the top, under
TYPE_CHECKING, inside a function), as test_import_api_without_llama_cpp.py reads what the
api loads. The layer order is declared here, bottom first; a module belongs to the longest
prefix that names it. A module may import modules of its own group or of a lower layer; the two
roles (api, worker) never import each other; nothing imports the command (llamaq). The rooms
inside api/ (its packages, and the top-level modules as `api`) are layers of their own.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.paths import ROOT

PACKAGES = ("scheduler", "storage", "api", "worker", "llamaq")

LAYERS: list[tuple[str, ...]] = [
    ("scheduler.contract",),  # kinds, jobs, sampling, results and events, errors, limits, keys
    ("scheduler.config",),    # the settings framework and the spec's flag table
    ("storage",),             # object storage, model files, slot snapshots
    ("scheduler",),           # Redis services both roles use: client, hub, leases, registry...
    ("api.net",),             # the api's fetches of callers' URLs: the address policy
    ("api.tenants", "api.tools"),  # the api's self-contained services: tenants, server tools
    ("api", "worker"),        # the api pods' ground (settings, bodies, fleet, services); worker/
    ("api.chat",),            # chat templates, tool-call formats, output parsers
    ("api.media",),           # images and audio of requests
    ("api.endpoints",),       # the endpoint families (HTTP)
    ("api.batch",),           # the batch driver: runs lines through the endpoints' serving
    ("api.app",),             # create_app: middleware, lifecycle, routes
    ("worker.speculative",),  # the drafters: nothing of the engine
    ("worker.runtime",),      # llama.cpp: model, vocab, projector, LoRA loading, fit, flags
    ("worker.kv",),           # slots, KV moves, checkpoints, prompt cache, tier, snapshots
    ("worker.adapters",),     # aLoRA, adapter sets, control vectors
    ("worker.decisions",),    # decision plans and runs
    ("worker.engine",),       # the slot engine
    ("worker.embed",),        # the embedder, on the engine's parts
    ("worker.wires",),        # publisher, result offload, media fetch, model sources
    ("worker.simulate",),     # the simulated engine: a timing model on the engine's parts
    ("worker.jobs",),         # the worker's job bodies, one module per kind
    ("worker.process",),      # the worker process: serve, drain, loops, arq wiring, sleep
    ("llamaq",),              # the command: imports everything, imported by nothing
]
ROLES = ("api", "worker")


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The module of ours that `name` (a module, or a name inside one) is."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> set[str]:
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            names = [f"{base}.{alias.name}" for alias in node.names] or [base]
        else:
            continue
        found.update(r for r in map(_resolve, names) if r is not None and r != module)
    return found


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def _group(module: str) -> tuple[int, str]:
    """(layer, prefix) of the longest declared prefix naming `module`."""
    best: tuple[int, str] | None = None
    for layer, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and \
                    (best is None or len(prefix) > len(best[1])):
                best = (layer, prefix)
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best


def _role(module: str) -> str | None:
    top = module.split(".")[0]
    return top if top in ROLES else None


def test_every_import_points_down() -> None:
    upward = []
    for module, targets in sorted(GRAPH.items()):
        layer, prefix = _group(module)
        for target in sorted(targets):
            target_layer, target_prefix = _group(target)
            across_roles = None not in (_role(module), _role(target)) and \
                _role(module) != _role(target)
            if across_roles or target_layer > layer or \
                    (target_layer == layer and target_prefix != prefix):
                upward.append(f"{module} ({prefix}) imports {target} ({target_prefix})")
    assert not upward, "imports that do not point down:\n" + "\n".join(upward)


def _circles() -> list[list[str]]:
    """Strongly connected sets of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in GRAPH[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            members = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                members.append(member)
                if member == node:
                    break
            if len(members) > 1:
                circles.append(sorted(members))

    for node in sorted(GRAPH):
        if node not in index:
            visit(node)
    return circles


def test_no_import_circle() -> None:
    assert not _circles(), f"import circles: {_circles()}"


def test_the_layers_name_every_module_and_the_checker_sees_imports() -> None:
    for module in MODULES:
        _group(module)
    assert "scheduler.contract.errors" in GRAPH["storage.errors"]
    assert "worker.jobs.parts" in GRAPH["worker.process.serve"]
    assert not any(t.startswith("llamaq") for m, ts in GRAPH.items()
                   if not m.startswith("llamaq") for t in ts)


def test_every_worker_module_is_in_a_room() -> None:
    """A worker module's room is in its name: nothing lies loose in worker/ but the package."""
    loose = [m for m in MODULES if m.startswith("worker.") and m.count(".") == 1
             and not (ROOT / "worker" / m.split(".")[1]).is_dir()]
    assert not loose, f"worker modules outside a room: {loose}"


MAX_MODULE_LINES = 400


def test_no_module_is_over_400_lines() -> None:
    """A module over 400 lines holds more than one concern: split it by concern."""
    long = {module: n for module, path in MODULES.items()
            if (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"
