"""Every third-party module the service imports at module level is a declared dependency: an
image installs only what pyproject.toml names (the test venv has more, e.g. httpx via test).
Imports inside functions are the deliberate lazy ones (the weights package, workers only)."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions

from tests.paths import ROOT

OURS = {"api", "scheduler", "storage", "worker", "llamaq"}
PART_OF = {"botocore": "boto3"}
"""Distributions that come with a declared one by its own hard requirement."""


def declared(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower().replace("_", "-")
            for r in requirements}


def imported_distributions(package: str) -> dict[str, str]:
    """Third-party modules imported at module level by `package`, with the first file doing so."""
    found: dict[str, str] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in OURS and top not in sys.stdlib_module_names:
                    found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_imports_are_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = declared(project["dependencies"])
    allowed = {"api": base, "scheduler": base, "storage": base, "llamaq": base,
               "worker": base | declared(project["optional-dependencies"]["worker"])}
    distributions = packages_distributions()
    missing = []
    for package, names in allowed.items():
        for module, where in imported_distributions(package).items():
            dists = {PART_OF.get(d, d).lower().replace("_", "-")
                     for d in distributions.get(module, [module])}
            if not dists & names:
                missing.append(f"{where} imports {module} ({', '.join(sorted(dists))})")
    assert not missing, "undeclared dependencies:\n" + "\n".join(missing)
