"""The contract is the lowest floor: scheduler/contract/ imports the standard library, pydantic
and itself, nothing else (docs/architecture.md). Read from the code (ast, every `import`
wherever it is: at the top, under TYPE_CHECKING, inside a function), as test_import_layers.py
reads the layers; a library's errors (Redis's) are translated by the layer that uses it."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from tests.paths import ROOT

CONTRACT = ROOT / "scheduler" / "contract"
ALLOWED = frozenset({"pydantic", "pydantic_core", "typing_extensions"}) | sys.stdlib_module_names
OWN = "scheduler.contract"


def _imported(path: Path) -> list[str]:
    """Every module `path` imports, absolute (a relative import counts as the contract's own)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.append(OWN if node.level else node.module or "")
    return found


def _allowed(module: str) -> bool:
    return module.split(".")[0] in ALLOWED or module == OWN or module.startswith(OWN + ".")


def test_the_contract_imports_only_the_standard_library_pydantic_and_itself() -> None:
    paths = sorted(CONTRACT.rglob("*.py"))
    assert len(paths) > 5  # the checker reads the contract's modules
    outside = [f"{path.relative_to(ROOT)} imports {module}"
               for path in paths for module in _imported(path) if not _allowed(module)]
    assert not outside, "the contract imports outside its floor:\n" + "\n".join(outside)


def test_the_checker_sees_a_forbidden_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("import json\nfrom pydantic import BaseModel\n"
                      "def f():\n    from redis.exceptions import RedisError\n"
                      "from scheduler.config.settings import flag\nfrom .keys import x\n")
    assert sorted(m for m in _imported(module) if not _allowed(m)) == [
        "redis.exceptions", "scheduler.config.settings"]


def test_the_roles_translate_errors_with_redis_s_included() -> None:
    """The api's error edge and the worker's job runner call scheduler/redis_errors.py's
    translate (the contract's knows no Redis)."""
    for path in (ROOT / "api" / "errors.py", ROOT / "worker" / "process" / "jobrun.py"):
        tree = ast.parse(path.read_text())
        assert any(isinstance(node, ast.ImportFrom) and node.module == "scheduler.redis_errors"
                   and any(alias.name == "translate" for alias in node.names)
                   for node in ast.walk(tree)), path
