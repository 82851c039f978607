"""The CPU placement flags' parsing (llama.cpp's parse_cpu_mask, parse_cpu_range,
postprocess_cpu_params) and the pools they plan (worker/runtime/cpu_pools.py)."""

from __future__ import annotations

import pytest

from worker.runtime.cpu_pools import cpu_plan
from worker.runtime.cpu_settings import MAX_CPUS, parse_cpu_mask, parse_cpu_range
from worker.runtime.settings import WorkerSettings


def cpus(mask: list[bool] | tuple[bool, ...] | None) -> list[int]:
    assert mask is not None and len(mask) == MAX_CPUS
    return [i for i, on in enumerate(mask) if on]


def test_masks_and_ranges() -> None:
    assert cpus(parse_cpu_mask("0x5")) == [0, 2]
    assert cpus(parse_cpu_mask("F0")) == [4, 5, 6, 7]
    assert cpus(parse_cpu_mask("100")) == [8]
    assert cpus(parse_cpu_range("2-4")) == [2, 3, 4]
    assert cpus(parse_cpu_range("-1")) == [0, 1]
    assert cpus(parse_cpu_range("510-")) == [510, 511]
    for bad in ("0xg", "z"):
        with pytest.raises(ValueError, match="invalid cpumask"):
            parse_cpu_mask(bad)
    for bad in ("3", "1-512", "a-b"):
        with pytest.raises(ValueError, match="invalid range"):
            parse_cpu_range(bad)


def settings(*argv: str) -> WorkerSettings:
    return WorkerSettings.from_args(list(argv), environ={})


def test_no_placement_flag_no_pool() -> None:
    plan = cpu_plan(settings("-t", "2"), 2, 2)
    assert plan.main is None and plan.batch is None and plan.numa == 0
    assert cpu_plan(settings("--numa", "isolate"), 2, 2).numa == 2
    assert cpu_plan(settings("--poll", "0"), 2, 2).main is None  # a no-op with OpenMP


def test_the_batch_threads_take_the_main_placement_without_tb() -> None:
    plan = cpu_plan(settings("-C", "3", "-Cr", "4-5", "--cpu-strict", "1", "--prio", "1",
                             "-Cb", "1"), 2, 2)
    assert plan.main is not None and plan.batch is not None
    assert cpus(plan.main.mask) == [0, 1, 4, 5] and plan.main.strict and plan.main.prio == 1
    assert plan.batch == plan.main  # -Cb without -tb: llama.cpp copies the main params
    plan = cpu_plan(settings("-C", "3", "-tb", "4", "-Cb", "c", "--prio-batch", "2"), 2, 4)
    assert plan.batch is not None and plan.main is not None
    assert cpus(plan.batch.mask) == [2, 3] and plan.batch.prio == 2
    assert plan.batch.n_threads == 4 and not plan.batch.strict and plan.main.n_threads == 2


@pytest.mark.parametrize("argv", [["-C", "xyz"], ["-Cr", "5"], ["--numa", "everywhere"],
                                  ["--prio-batch", "4"], ["--cpu-strict", "-1"]])
def test_bad_values_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        settings(*argv)
    assert exited.value.code == 2
