"""The fast lane: `pytest --fast` (`scripts/test --fast`) runs every test that starts no
process and runs no model; the full suite (no option) runs them all.

A test runs a model when it lives in tests/worker/ (the worker's rooms in-process: real
llama.cpp on real GGUF files, seconds a test) or carries `@pytest.mark.model`.

A test starts a process when it asks for a fixture that starts one (PROCESS_FIXTURES: every
fleet fixture stands on `redis_url`) or carries `@pytest.mark.process` (a module's `pytestmark`
for the ones that run `llamaq` or redis-server themselves). Under --fast a guard fails any
selected test that starts a process anyway, so a test that forgets its mark is told so, not
silently slow.

The whole suite runs in two passes (scripts/test): `--lane parallel` on pytest-xdist workers
(`-n`, `--dist loadfile`: a file's tests share one worker, so its module fleets start once),
then `--lane serial`, one test at a time, for the tests that carry `@pytest.mark.serial`: those
that measure wall-clock time (a stream's longest gap, how soon an answer came) and must not run
beside other fleets to mean something."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

PROCESS_FIXTURES = frozenset({"redis_url", "browser"})
"""Fixtures that start a process (redis-server, chromium); fixtures built on them count too
(pytest lists a test's whole fixture closure)."""
MARK = "process"
MODEL_MARK = "model"
SERIAL_MARK = "serial"
LANES = ("all", "parallel", "serial")
"""`--lane`: every test (the default), the ones not marked serial, or only those."""
MODEL_FOLDER = "worker"
"""tests/<MODEL_FOLDER>/: the worker's rooms in-process, on real GGUF files."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--fast", action="store_true",
                     help="only the tests that start no process (tests/lanes.py)")
    parser.addoption("--lane", choices=LANES, default="all",
                     help="all tests, or those that may run beside others (parallel), or "
                          f"only those marked {SERIAL_MARK} (tests/lanes.py)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARK}: the test starts a process (not in --fast)")
    config.addinivalue_line("markers", f"{MODEL_MARK}: the test runs a model (not in --fast)")
    config.addinivalue_line("markers", f"{SERIAL_MARK}: the test measures wall-clock time and "
                                       "runs alone (--lane serial, after the parallel pass)")


def starts_process(item: pytest.Item) -> bool:
    names = set(getattr(item, "fixturenames", ()))
    return bool(PROCESS_FIXTURES & names) or item.get_closest_marker(MARK) is not None


def runs_model(item: pytest.Item, tests: Path) -> bool:
    in_folder = item.path.is_relative_to(tests / MODEL_FOLDER)
    return in_folder or item.get_closest_marker(MODEL_MARK) is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tests = Path(__file__).resolve().parent
    for item in items:
        if starts_process(item) and item.get_closest_marker(MARK) is None:
            item.add_marker(MARK)
    fast, lane = config.getoption("fast"), config.getoption("lane")
    if not fast and lane == "all":
        return
    dropped_ids = set()
    if fast:
        dropped_ids |= {id(item) for item in items
                        if starts_process(item) or runs_model(item, tests)}
    if lane != "all":
        wanted = lane == "serial"
        dropped_ids |= {id(item) for item in items
                        if (item.get_closest_marker(SERIAL_MARK) is not None) != wanted}
    kept = [item for item in items if id(item) not in dropped_ids]
    dropped = [item for item in items if id(item) in dropped_ids]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept


class ProcessStarted(Exception):
    pass


LOOKUPS = frozenset({"ldconfig", "uname", "gcc", "cc", "ld", "objdump"})
"""What the standard library runs to look something up (ctypes.util.find_library, platform):
not a process a test starts."""


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise ProcessStarted(f"a test of the fast lane starts a process: mark it "
                         f"@pytest.mark.{MARK} (tests/lanes.py)")


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Under --fast, starting a process fails whatever starts it (a test, or a fixture of any
    scope): mark the test, or keep it in-process."""
    if not session.config.getoption("fast"):
        return
    execute_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]

    def guarded(popen: subprocess.Popen[Any], args: Any, *rest: Any) -> Any:
        program = args if isinstance(args, str | bytes) else args[0]
        if os.path.basename(os.fsdecode(program)).split()[0] in LOOKUPS:
            return execute_child(popen, args, *rest)
        return _refuse()

    subprocess.Popen._execute_child = guarded  # type: ignore[attr-defined]
    os.fork = _refuse
    os.posix_spawn = _refuse
