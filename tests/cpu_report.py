"""`--cpu-report PATH`: the CPU seconds each test and test file costs, the whole process tree's
(pytest, its fixtures' processes: Redis, api pods, workers, llama-server), appended to PATH as
`seconds<TAB>test id` lines, one per test and pytest process; the 25 costliest files and the 25
costliest tests are listed at the end (a file's cost is the sum of its tests'). On the 2-core
dev box the suite is CPU-bound, so CPU seconds, not wall time, say where it goes (wall time
says how loaded the box was).

A file's cost is the tree's CPU (utime + stime) counted around each of its tests (setup, call
and teardown: its module fixtures' start and stop included): this process's own, its reaped
children's, and every live descendant's read from /proc. A session fixture's start is counted
to the first file that asks for it; a process that outlives its parent and is reaped by init
is lost (none of ours is meant to)."""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

TOP = 25
_TICK = os.sysconf("SC_CLK_TCK")


def _descendants_cpu(root: int) -> float:
    """utime + stime + cutime + cstime of every live process below `root`, in seconds."""
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                text = stat.read()
        except OSError:
            continue
        fields = text[text.rindex(b")") + 2:].split()
        pid = int(entry)
        parent[pid] = int(fields[1])
        ticks[pid] = sum(int(f) for f in fields[11:15])
    children: dict[int, list[int]] = defaultdict(list)
    for pid, ppid in parent.items():
        children[ppid].append(pid)
    total, stack = 0, list(children[root])
    while stack:
        pid = stack.pop()
        total += ticks[pid]
        stack.extend(children[pid])
    return total / _TICK


def tree_cpu() -> float:
    """This process's CPU seconds, its reaped children's and its live descendants'."""
    times = os.times()
    return (times.user + times.system + times.children_user + times.children_system
            + _descendants_cpu(os.getpid()))


class CpuReport:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = defaultdict(float)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Iterator[None]:
        before = tree_cpu()
        yield
        self.seconds[item.nodeid] += tree_cpu() - before

    def pytest_sessionfinish(self) -> None:
        lines = "".join(f"{seconds:.1f}\t{name}\n" for name, seconds in self.seconds.items())
        with self.path.open("a") as out:  # one write per process: xdist workers append
            out.write(lines)


def read_report(path: Path, by_test: bool = False) -> dict[str, float]:
    """CPU seconds by test file (a line may name a test or a whole file), or by test."""
    totals: dict[str, float] = defaultdict(float)
    for line in path.read_text().splitlines():
        seconds, name = line.split("\t", 1)
        totals[name if by_test else name.split("::")[0]] += float(seconds)
    return dict(totals)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--cpu-report", type=Path, default=None, metavar="PATH",
                     help="append each test file's CPU seconds (its whole process tree) to "
                          "PATH and list the costliest (tests/cpu_report.py)")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("cpu_report")
    if path is not None:
        config.pluginmanager.register(CpuReport(path), "cpu-report")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter,
                            config: pytest.Config) -> None:
    path = config.getoption("cpu_report")
    if path is None or hasattr(config, "workerinput") or not path.exists():
        return
    totals = read_report(path)
    terminalreporter.section(f"CPU seconds by file, the {TOP} costliest ({path})")
    for name, seconds in sorted(totals.items(), key=lambda kv: -kv[1])[:TOP]:
        terminalreporter.write_line(f"{seconds:8.1f}  {name}")
    terminalreporter.write_line(f"{sum(totals.values()):8.1f}  in all ({len(totals)} files)")
    tests = read_report(path, by_test=True)
    terminalreporter.section(f"CPU seconds by test, the {TOP} costliest (setup and teardown "
                             "included)")
    for name, seconds in sorted(tests.items(), key=lambda kv: -kv[1])[:TOP]:
        terminalreporter.write_line(f"{seconds:8.1f}  {name}")
