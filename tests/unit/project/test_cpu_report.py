"""tests/cpu_report.py counts a test's whole process tree: a child's CPU while it runs
(from /proc) and once it is reaped (os.times), and sums the lines the xdist workers append, by
file and by test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.cpu_report import read_report, tree_cpu

BUSY = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass\n" \
       "print('done', flush=True)\ntime.sleep(30)\n"


@pytest.mark.process
def test_a_childs_cpu_counts_alive_and_reaped() -> None:
    before = tree_cpu()
    child = subprocess.Popen([sys.executable, "-c", BUSY], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "done\n"
        assert tree_cpu() - before >= 0.5  # alive: read from /proc
    finally:
        child.kill()
        child.wait()
    assert tree_cpu() - before >= 0.5  # reaped: os.times' children count it now
    assert tree_cpu() - before < 5


def test_the_workers_lines_add_up(tmp_path: Path) -> None:
    report = tmp_path / "cpu.txt"
    report.write_text("1.5\ttests/a.py\n2.0\ttests/b.py\n0.5\ttests/a.py\n")
    assert read_report(report) == {"tests/a.py": 2.0, "tests/b.py": 2.0}


def test_a_tests_lines_count_to_its_file_and_to_itself(tmp_path: Path) -> None:
    report = tmp_path / "cpu.txt"
    report.write_text("1.5\ttests/a.py::test_x\n2.0\ttests/b.py::test_y[1]\n"
                      "0.5\ttests/a.py::test_z\n0.25\ttests/a.py::test_x\n")
    assert read_report(report) == {"tests/a.py": 2.25, "tests/b.py": 2.0}
    assert read_report(report, by_test=True) == {
        "tests/a.py::test_x": 1.75, "tests/a.py::test_z": 0.5, "tests/b.py::test_y[1]": 2.0}
