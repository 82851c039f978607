"""select_args: one `llamaq up` command line split between the api and the worker."""

from __future__ import annotations

from api.settings import ApiSettings
from scheduler.config.command_line import select_args
from worker.runtime.settings import WorkerSettings

ROLES = (ApiSettings, WorkerSettings)
ARGV = ["-m", "x", "--port", "1234", "-c", "2048", "--api-key", "k", "--no-cache-prompt",
        "--seed", "-1", "--temp=0.5"]


def test_api_gets_common_and_api_flags() -> None:
    assert select_args(ARGV, ApiSettings, ROLES) == ["-m", "x", "--port", "1234",
                                                     "--api-key", "k"]


def test_worker_gets_common_and_worker_flags() -> None:
    assert select_args(ARGV, WorkerSettings, ROLES) == [
        "-m", "x", "-c", "2048", "--no-cache-prompt", "--seed", "-1", "--temp=0.5",
    ]


def test_selected_lines_parse() -> None:
    api = ApiSettings.from_args(select_args(ARGV, ApiSettings, ROLES), environ={})
    assert (api.model, api.port, api.api_key) == ("x", 1234, ["k"])
    worker = WorkerSettings.from_args(select_args(ARGV, WorkerSettings, ROLES), environ={})
    assert (worker.model, worker.ctx_size, worker.cache_prompt) == ("x", 2048, False)
    assert (worker.sampling.seed, worker.sampling.temperature) == (-1, 0.5)


def test_negative_values_are_values_not_flags() -> None:
    argv = ["-n", "-1", "--yarn-ext-factor", "-0.5", "--reasoning-budget", "-1", "-np", "2"]
    assert select_args(argv, WorkerSettings, ROLES) == ["-n", "-1", "--yarn-ext-factor",
                                                        "-0.5", "-np", "2"]
    assert select_args(argv, ApiSettings, ROLES) == ["--reasoning-budget", "-1"]


def test_value_that_looks_like_a_flag_of_the_other_role_stays_a_value() -> None:
    argv = ["--alias", "--port", "-c", "16"]
    assert select_args(argv, ApiSettings, ROLES) == ["--alias", "--port"]
    assert select_args(argv, WorkerSettings, ROLES) == ["--alias", "--port", "-c", "16"]


def test_switches_take_no_value() -> None:
    argv = ["--metrics", "--no-slots", "--swa-full", "-cb", "-m", "x"]
    assert select_args(argv, ApiSettings, ROLES) == ["--metrics", "--no-slots", "-m", "x"]
    assert select_args(argv, WorkerSettings, ROLES) == ["--swa-full", "-cb", "-m", "x"]


def test_equals_form_keeps_one_argument() -> None:
    argv = ["--port=8080", "--ctx-size=64", "--model=m.gguf"]
    assert select_args(argv, ApiSettings, ROLES) == ["--port=8080", "--model=m.gguf"]
    assert select_args(argv, WorkerSettings, ROLES) == ["--ctx-size=64", "--model=m.gguf"]


def test_repeated_list_flags_are_all_kept() -> None:
    argv = ["--api-key", "a", "--dry-sequence-breaker", ",", "--api-key", "b"]
    assert select_args(argv, ApiSettings, ROLES) == ["--api-key", "a", "--api-key", "b"]
    assert select_args(argv, WorkerSettings, ROLES) == ["--dry-sequence-breaker", ","]


def test_empty_command_line() -> None:
    assert select_args([], ApiSettings, ROLES) == []
    assert select_args([], WorkerSettings, ROLES) == []
