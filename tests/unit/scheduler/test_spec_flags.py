"""Honest flags: every llama-server flag works, is refused by name with a reason, or is a
documented no-op -- for every role, `llamaq up` included."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from api.settings import ApiSettings
from llamaq.flag_lists import declared_names, render
from scheduler.common_settings import CommonSettings
from scheduler.config.command_line import FlagError, split_args
from scheduler.config.settings import ProcessSettings
from scheduler.config.spec_flags import (
    BUILT_IN_PARSER,
    SPEC_FLAGS,
    FlagStatus,
    by_status,
    refused_envs,
    refused_names,
)
from tests.paths import ROOT
from worker.runtime.settings import WorkerSettings

ROLES: tuple[type[ProcessSettings], ...] = (ApiSettings, WorkerSettings, CommonSettings)
UP_ROLES = (ApiSettings, WorkerSettings)
SPEC_README = Path(os.environ.get("LLAMAQ_SPEC_README",
                                  "/work/shared/spec/llama-server-README.txt"))


def every_declared() -> set[str]:
    return set().union(*(declared_names(role) for role in ROLES))


def spec_rows(text: str) -> list[tuple[tuple[str, ...], str | None]]:
    """The rows of the spec's `Argument / Explanation` tables: (names, env variable)."""
    rows, inside = [], False
    for line in text.splitlines():
        if line.startswith("Argument\tExplanation"):
            inside = True
        elif inside and line.strip() and "\t" not in line:
            inside = False
        elif inside and line.strip():
            first, explanation = line.split("\t", 1)
            names = tuple(part.split(" ")[0] for part in first.split(", ")
                          if part.startswith("-"))
            env = re.search(r"\(env: ([A-Z_0-9]+)\)", explanation)
            rows.append((names, env.group(1) if env else None))
    return rows


def test_each_name_is_in_exactly_one_row() -> None:
    names = [name for flag in SPEC_FLAGS for name in flag.names]
    assert len(names) == len(set(names))
    for flag in SPEC_FLAGS:
        if flag.status is not FlagStatus.WORKS:
            assert flag.why, flag.label


@pytest.mark.skipif(not SPEC_README.is_file(), reason="the spec README is not on this machine")
def test_the_table_is_the_spec_row_by_row() -> None:
    rows = spec_rows(SPEC_README.read_text())
    assert len(rows) > 250
    assert len(SPEC_FLAGS) == len(rows)
    assert {flag.names for flag in SPEC_FLAGS} == {names for names, _ in rows}
    envs = dict(rows)
    for flag in SPEC_FLAGS:
        assert flag.env == envs[flag.names], flag.label


def test_a_working_flags_environment_variable_is_read() -> None:
    """The spec's environment name of a working flag is read by the role that takes it."""
    for flag in by_status(FlagStatus.WORKS):
        if flag.env is None:
            continue
        takers = [option for role in ROLES for option in role.options()
                  if set(option.flags) & set(flag.names)]
        assert takers, flag.label
        assert any(option.env == flag.env for option in takers), (flag.label, flag.env)


def test_working_flags_are_declared_by_a_role() -> None:
    declared = every_declared()
    for flag in [*by_status(FlagStatus.WORKS), *by_status(FlagStatus.NOOP)]:
        if set(flag.names) & BUILT_IN_PARSER:
            continue
        missing = set(flag.names) - declared
        assert not missing, f"{flag.label}: {missing} not declared"


def test_refused_flags_are_declared_by_no_role() -> None:
    assert not set(refused_names()) & every_declared()


def test_llamaqs_own_flags_are_llamaq_variables() -> None:
    spec = {name for flag in SPEC_FLAGS for name in flag.names}
    for role in ROLES:
        for option in role.options():
            if not set(option.flags) & spec:
                assert option.env and option.env.startswith("LLAMAQ_"), option.flags


def test_the_noop_list_is_short() -> None:
    assert len(by_status(FlagStatus.NOOP)) <= 5


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.__name__)
def test_every_refused_flag_exits_2_with_its_reason(role: type[ProcessSettings],
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    for name, flag in refused_names().items():
        if name in flag.off_names:
            continue  # an off switch: a no-op (below)
        with pytest.raises(SystemExit) as exit_info:
            role.from_args([name, "1"], environ={})
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert f"{name} is not supported by llamaq: {flag.why}" in " ".join(err.split()), name


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.__name__)
def test_refused_environment_variables_exit_2(role: type[ProcessSettings],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    for env in ("LLAMA_ARG_BACKEND_SAMPLING", "LLAMA_ARG_MOE_CACHE_MIB",
                "LLAMA_ARG_RPC"):
        with pytest.raises(SystemExit) as exit_info:
            role.from_args([], environ={env: "1"})
        assert exit_info.value.code == 2
        assert env in capsys.readouterr().err
    assert set(refused_envs()) >= {"LLAMA_ARG_RPC", "LLAMA_ARG_BACKEND_SAMPLING"}
    assert "LLAMA_ARG_SPEC_DRAFT_MODEL" not in refused_envs()  # -md works (draft-simple)


OFF_FORMS = [["--moe-cache-mib", "0"]]
OFF_ENVS = [{"LLAMA_ARG_MOE_CACHE_MIB": "0"}]


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.__name__)
def test_off_forms_of_unbuilt_features_are_no_ops(role: type[ProcessSettings]) -> None:
    for argv in OFF_FORMS:
        assert role.from_args(argv, environ={}) == role.from_args([], environ={}), argv
    for environ in OFF_ENVS:
        assert role.from_args([], environ=environ) == role.from_args([], environ={}), environ


@pytest.mark.parametrize("role", ROLES, ids=lambda r: r.__name__)
def test_on_forms_stay_refused(role: type[ProcessSettings],
                               capsys: pytest.CaptureFixture[str]) -> None:
    for argv, environ in ((["--moe-cache-mib", "512"], {}),
                          ([], {"LLAMA_ARG_MOE_CACHE_MIB": "512"}),
                          ([], {"LLAMA_ARG_BACKEND_SAMPLING": "1"}),
                          (["--spec-draft-sampling", "probabilistic"], {})):
        with pytest.raises(SystemExit) as exit_info:
            role.from_args(argv, environ=environ)
        assert exit_info.value.code == 2
        assert "is not supported by llamaq" in capsys.readouterr().err


def test_up_drops_off_forms() -> None:
    parts = split_args(["--moe-cache-mib", "0", "-c", "64", "--port", "1",
                        "--no-mmproj"], UP_ROLES)
    assert parts[ApiSettings] == ["--port", "1"]
    assert parts[WorkerSettings] == ["-c", "64", "--no-mmproj"]  # works since issue 28


def test_cache_flags_work_on_the_worker() -> None:
    """Issue 24: --cache-ram, --cache-idle-slots and the checkpoint flags are the worker's,
    read from their llama-server names and environment variables."""
    parts = split_args(["--no-cache-idle-slots", "-c", "64", "--cache-ram", "0", "-ctxcp", "4",
                        "--port", "1"], UP_ROLES)
    assert parts[WorkerSettings] == ["--no-cache-idle-slots", "-c", "64", "--cache-ram", "0",
                                     "-ctxcp", "4"]
    worker = WorkerSettings.from_args(["-cram", "512", "--swa-checkpoints", "3", "-cms", "0"],
                                      environ={})
    assert (worker.cache_ram, worker.ctx_checkpoints, worker.checkpoint_min_step) == (512, 3, 0)
    assert worker.cache_idle_slots
    by_env = WorkerSettings.from_args([], environ={
        "LLAMA_ARG_CACHE_RAM": "-1", "LLAMA_ARG_CTX_CHECKPOINTS": "0",
        "LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT": "16", "LLAMA_ARG_NO_CACHE_IDLE_SLOTS": "1"})
    assert (by_env.cache_ram, by_env.ctx_checkpoints, by_env.checkpoint_min_step,
            by_env.cache_idle_slots) == (-1, 0, 16, False)
    defaults = WorkerSettings.from_args([], environ={})
    assert (defaults.cache_ram, defaults.ctx_checkpoints, defaults.checkpoint_min_step) == (
        8192, 32, 8192)


def test_a_negative_checkpoint_step_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        WorkerSettings.from_args(["-cms", "-1"], environ={})
    assert exit_info.value.code == 2
    assert "checkpoint-min-step must be non-negative" in capsys.readouterr().err


def test_mmproj_auto_is_a_worker_switch() -> None:
    """--mmproj-auto works (issue 28): its off forms and env names turn it off."""
    assert WorkerSettings.from_args([], environ={}).mmproj_auto
    for argv in (["--no-mmproj"], ["--no-mmproj-auto"]):
        assert not WorkerSettings.from_args(argv, environ={}).mmproj_auto
    for environ in ({"LLAMA_ARG_MMPROJ_AUTO": "0"}, {"LLAMA_ARG_NO_MMPROJ_AUTO": "1"}):
        assert not WorkerSettings.from_args([], environ=environ).mmproj_auto


def test_a_negative_environment_variable_turns_a_switch_off() -> None:
    assert WorkerSettings.from_args([], environ={"LLAMA_ARG_CONT_BATCHING": "1"}).cont_batching
    assert not WorkerSettings.from_args([], environ={"LLAMA_ARG_NO_CONT_BATCHING": "1"}
                                        ).cont_batching


def test_split_mode_tensor_is_a_mode() -> None:
    assert WorkerSettings.from_args(["-sm", "tensor"], environ={}).split_mode == "tensor"


def test_new_working_flags_parse() -> None:
    worker = WorkerSettings.from_args(
        ["-v", "--prio", "2", "-r", "User:", "-r", "a,b", "--no-warmup", "--offline",
         "--log-disable", "--no-log-prefix", "--no-log-timestamps", "-lzm", "on", "-lm", "dio",
         "--no-repack", "--no-host", "--perf"], environ={})
    assert (worker.verbose, worker.prio, worker.reverse_prompt) == (True, 2, ["User:", "a,b"])
    assert (worker.warmup, worker.offline, worker.log_disable) == (False, True, True)
    assert (worker.log_prefix, worker.log_timestamps) == (False, False)
    assert (worker.lazy_mode, worker.load_mode, worker.repack, worker.no_host, worker.perf) == (
        "on", "dio", False, True, True)


def test_up_splits_every_flag_to_the_roles_that_take_it() -> None:
    parts = split_args(["-v", "--prio", "2", "-r", "User:", "--port", "1", "-c", "64"], UP_ROLES)
    assert parts[ApiSettings] == ["-v", "--prio", "2", "--port", "1"]
    assert parts[WorkerSettings] == ["-v", "--prio", "2", "-r", "User:", "-c", "64"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--no-such-flag"], "unknown flag '--no-such-flag'"),
    (["-m", "x", "stray"], "unknown argument 'stray'"),
    (["--rpc", "host:50052"], "--rpc is not supported by llamaq: RPC offloading"),
    (["--moe-cache-mib", "512"], "--moe-cache-mib is not supported"),
    (["-Cd", "0x3"], "-Cd is not supported"),
    (["-c"], "-c expects a value"),
])
def test_up_refuses_what_no_role_takes(argv: list[str], message: str) -> None:
    with pytest.raises(FlagError, match=re.escape(message)):
        split_args(argv, UP_ROLES)


def run_llamaq(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_", "LLAMAQ_"))}
    return subprocess.run([sys.executable, "-m", "llamaq", *argv], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=env)


@pytest.mark.parametrize("argv", [
    ["up", "-v", "--prio", "2", "--frobnicate"],
    ["up", "--rpc", "host:50052"],
    ["up", "--ssl-key-file", "k.pem"],
    ["api", "--mmproj", "m"],
    ["worker", "--moe-cache-mib", "512"],
    ["scheduler", "--models-preset", "p.ini"],
    ["api", "-c", "4096"],
    ["worker", "--api-key", "k"],
])
@pytest.mark.process
def test_every_role_exits_2_before_loading_anything(argv: list[str]) -> None:
    done = run_llamaq(*argv)
    assert done.returncode == 2, done.stderr
    assert "serving on" not in done.stdout
    flag = next(a for a in argv[1:] if a not in ("-v", "--prio", "2"))
    assert flag in done.stderr


@pytest.mark.process
def test_a_flag_of_another_role_is_named_as_such() -> None:
    done = run_llamaq("api", "-c", "4096")
    assert "-c is a flag of `llamaq worker`" in done.stderr


def test_short_flags_are_not_prefixes(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        ApiSettings.from_args(["-c", "4096"], environ={})
    err = capsys.readouterr().err
    assert "unrecognized arguments: -c 4096" in err and "ambiguous" not in err


@pytest.mark.process
def test_llamaq_flags_prints_the_three_lists() -> None:
    done = run_llamaq("flags")
    assert done.returncode == 0
    out = done.stdout
    counts = [int(m) for m in re.findall(r"^(?:works|refused \(exit 2\)|no-op \(accepted, does "
                                         r"nothing\)): (\d+) flags$", out, re.M)]
    assert sum(counts) == len(SPEC_FLAGS)
    assert re.search(r"^  --rpc +RPC offloading is not built", out, re.M)
    assert re.search(r"^  -dr, --docker-repo +every role$", out, re.M)
    assert re.search(r"^  -mu, --model-url +every role$", out, re.M)
    assert re.search(r"^  -c, --ctx-size +worker$", out, re.M)
    assert re.search(r"^  --api-key +api$", out, re.M)
    assert re.search(r"^  --redis-url +api, worker, scheduler: ", out, re.M)
    assert render() == out.rstrip("\n")


@pytest.mark.process
def test_version_and_usage() -> None:
    done = run_llamaq("api", "--version")
    assert done.returncode == 0 and done.stdout.startswith("llamaq ")
    assert run_llamaq("worker", "--usage").returncode == 0


@pytest.mark.process
def test_priority_and_log_flags_take_effect() -> None:
    script = ("import logging, os, sys\n"
              "from llamaq.logs import prepare_process\n"
              "from worker.runtime.settings import WorkerSettings\n"
              "s = WorkerSettings.from_args(sys.argv[1:], environ={})\n"
              "before = os.getpriority(os.PRIO_PROCESS, 0)\n"
              "prepare_process(s, 'worker')\n"
              "print(os.getpriority(os.PRIO_PROCESS, 0) - before, flush=True)\n"
              "logging.getLogger('x').info('hello')\n"
              "logging.getLogger('x').debug('details')\n")

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-c", script, *argv], capture_output=True,
                              text=True, timeout=60, cwd=ROOT)

    low = run("--prio", "-1")
    assert low.stdout.strip() == "5" or os.getpriority(os.PRIO_PROCESS, 0) >= 5  # niced already
    assert re.search(r"^\S+ \S+ worker INFO x: hello$", low.stderr, re.M)
    assert "details" not in low.stderr
    assert run("-v").stderr.count("details") == 1
    assert run("--log-disable").stderr == ""
    assert run("--no-log-prefix", "--no-log-timestamps").stderr.strip() == "hello"
