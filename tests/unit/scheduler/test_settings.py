"""Settings: flag over env over default, llama-server's flag and environment names."""

from __future__ import annotations

from pathlib import Path

import pytest

from api.settings import ApiSettings
from scheduler.common_settings import CommonSettings
from scheduler.config.settings import ProcessSettings, flag
from worker.runtime.settings import WorkerSettings


def fails(capsys: pytest.CaptureFixture[str], argv: list[str], environ: dict[str, str]) -> str:
    """Parse expecting an argparse-style failure; return the error output."""
    with pytest.raises(SystemExit) as exit_info:
        WorkerSettings.from_args(argv, environ=environ)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_defaults_follow_the_spec() -> None:
    worker = WorkerSettings.from_args([], environ={})
    assert worker.ctx_size == 0
    assert worker.n_predict == -1
    assert worker.batch_size == 2048
    assert worker.ubatch_size == 512
    assert worker.n_parallel == -1
    assert worker.flash_attn == "auto"
    assert worker.cache_prompt is True
    assert worker.cont_batching is True
    assert worker.sampling.repeat_penalty == 1.0
    assert worker.sampling.samplers == [
        "penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc",
        "temperature",
    ]
    assert worker.poll_delay == 1.0
    assert worker.worker_id is None
    api = ApiSettings.from_args([], environ={})
    assert (api.host, api.port) == ("127.0.0.1", 9931)
    assert api.api_key == []
    assert (api.metrics, api.slots, api.props) == (False, True, False)
    assert api.store_url == ".llamaq/store"
    assert api.redis_url is None
    assert api.workers == 1


def test_flag_beats_env_beats_default() -> None:
    env = {"LLAMA_ARG_CTX_SIZE": "4096", "LLAMA_ARG_UBATCH": "256"}
    worker = WorkerSettings.from_args(["-c", "8192"], environ=env)
    assert worker.ctx_size == 8192  # flag over env
    assert worker.ubatch_size == 256  # env over default
    assert worker.batch_size == 2048  # default
    assert WorkerSettings.from_args(["--ctx-size", "16"], environ=env).ctx_size == 16


@pytest.mark.parametrize("raw", ["true", "1", "on", "enabled", "TRUE", "Yes"])
def test_bool_env_true_forms(raw: str) -> None:
    assert ApiSettings.from_args([], environ={"LLAMA_ARG_ENDPOINT_METRICS": raw}).metrics


@pytest.mark.parametrize("raw", ["false", "0", "off", "disabled", "OFF", "no"])
def test_bool_env_false_forms(raw: str) -> None:
    assert not ApiSettings.from_args([], environ={"LLAMA_ARG_ENDPOINT_SLOTS": raw}).slots


def test_bad_bool_env_names_the_variable(capsys: pytest.CaptureFixture[str]) -> None:
    err = fails(capsys, [], {"LLAMA_ARG_CACHE_PROMPT": "maybe"})
    assert "LLAMA_ARG_CACHE_PROMPT" in err
    assert "maybe" in err


def test_bad_values_name_the_flag_or_variable(capsys: pytest.CaptureFixture[str]) -> None:
    assert "-c/--ctx-size" in fails(capsys, ["-c", "big"], {})
    assert "LLAMA_ARG_BATCH" in fails(capsys, [], {"LLAMA_ARG_BATCH": "1.5"})
    assert "-fa/--flash-attn" in fails(capsys, ["-fa", "maybe"], {})
    assert "LLAMA_ARG_FLASH_ATTN" in fails(capsys, [], {"LLAMA_ARG_FLASH_ATTN": "yes"})
    assert "--no-such-flag" in fails(capsys, ["--no-such-flag"], {})


def test_negative_flags() -> None:
    env = {"LLAMA_ARG_CACHE_PROMPT": "1", "LLAMA_ARG_CONT_BATCHING": "on"}
    worker = WorkerSettings.from_args(["--no-cache-prompt", "-nocb"], environ=env)
    assert worker.cache_prompt is False
    assert worker.cont_batching is False
    worker = WorkerSettings.from_args(["--no-cont-batching", "-cb"], environ={})
    assert worker.cont_batching is True  # the last one given wins
    assert WorkerSettings.from_args(["-nkvo", "-no-kvu"], environ={}).kv_offload is False
    assert ApiSettings.from_args(["--no-slots"], environ={}).slots is False
    assert ApiSettings.from_args(["--slots"], environ={"LLAMA_ARG_ENDPOINT_SLOTS": "0"}).slots


def test_bool_flag_without_value_sets_true() -> None:
    env = {"LLAMA_ARG_SWA_FULL": "false", "LLAMA_ARG_CONTEXT_SHIFT": "false"}
    worker = WorkerSettings.from_args(["--swa-full", "--context-shift", "--check-tensors"],
                                      environ=env)
    assert (worker.swa_full, worker.context_shift, worker.check_tensors) == (True, True, True)
    assert WorkerSettings.from_args([], environ={}).kv_unified is None


def test_list_values_are_comma_separated() -> None:
    api = ApiSettings.from_args(["--api-key", "a,b"], environ={"LLAMA_API_KEY": "x"})
    assert api.api_key == ["a", "b"]
    assert ApiSettings.from_args([], environ={"LLAMA_API_KEY": "a, b,"}).api_key == ["a", "b"]
    repeated = ApiSettings.from_args(["--api-key", "a", "--api-key", "b,c"], environ={})
    assert repeated.api_key == ["a", "b", "c"]
    worker = WorkerSettings.from_args(
        ["-ts", "3,1", "--samplers", "top_k;temperature", "-a", "m1,m2"],
        environ={"LLAMA_ARG_TENSOR_SPLIT": "0.5,0.25"},
    )
    assert worker.tensor_split == [3.0, 1.0]
    assert worker.sampling.samplers == ["top_k", "temperature"]
    assert worker.alias == ["m1", "m2"]
    assert WorkerSettings.from_args([], environ={"LLAMA_ARG_TENSOR_SPLIT": "0.5,0.25"}
                                    ).tensor_split == [0.5, 0.25]


def test_dry_sequence_breakers_are_not_split() -> None:
    argv = ["--dry-sequence-breaker", ",", "--dry-sequence-breaker", "a,b"]
    assert WorkerSettings.from_args(argv, environ={}).sampling.dry_sequence_breakers == [",", "a,b"]


def test_env_names_that_do_not_follow_the_flag() -> None:
    environ = {
        "LLAMA_ARG_N_PARALLEL": "4",
        "LLAMA_ARG_BATCH": "1024",
        "LLAMA_ARG_UBATCH": "256",
        "LLAMA_ARG_TEMPERATURE": "0.5",
        "HF_TOKEN": "hf_secret",
        "LLAMAQ_POLL_DELAY": "0.05",
    }
    worker = WorkerSettings.from_args([], environ=environ)
    assert (worker.n_parallel, worker.batch_size, worker.ubatch_size) == (4, 1024, 256)
    assert worker.sampling.temperature == 0.5
    assert worker.hf_token == "hf_secret"
    assert worker.poll_delay == 0.05
    api = ApiSettings.from_args(
        [],
        environ={
            "LLAMA_API_KEY": "k1,k2",
            "LLAMA_ARG_ENDPOINT_METRICS": "1",
            "LLAMA_ARG_THINK": "deepseek",
            "LLAMA_ARG_THINK_BUDGET": "0",
            "LLAMAQ_REDIS_URL": "redis://r:6379/0",
            "LLAMAQ_STORE_URL": "s3://bucket/prefix",
            "LLAMAQ_API_WORKERS": "4",
        },
    )
    assert api.api_key == ["k1", "k2"]
    assert api.metrics is True
    assert (api.reasoning_format, api.reasoning_budget) == ("deepseek", 0)
    assert api.redis_url == "redis://r:6379/0"
    assert api.store_url == "s3://bucket/prefix"
    assert api.workers == 4


def test_short_and_alias_flags() -> None:
    argv = ["-hf", "org/repo:Q4_K_M", "-hff", "m.gguf", "-hft", "tok", "-lv", "4", "-l", "15043+1",
            "-s", "-1", "-n", "-1", "-np", "2", "-ngl", "all", "--typical", "0.9", "--temperature",
            "0.1", "--yarn-ext-factor", "-0.5", "-ctk", "q8_0", "--predict", "7"]
    worker = WorkerSettings.from_args(argv, environ={})
    assert (worker.hf_repo, worker.hf_file, worker.hf_token) == ("org/repo:Q4_K_M", "m.gguf", "tok")
    assert worker.log_verbosity == 4
    assert worker.logit_bias == ["15043+1"]
    assert (worker.sampling.seed, worker.n_predict, worker.n_parallel) == (-1, 7, 2)
    assert (worker.n_gpu_layers, worker.sampling.typical_p, worker.sampling.temperature) == (
        "all", 0.9, 0.1)
    assert (worker.yarn_ext_factor, worker.cache_type_k) == (-0.5, "q8_0")


def test_settings_are_frozen() -> None:
    worker = WorkerSettings.from_args([], environ={})
    with pytest.raises(ValueError):
        worker.ctx_size = 1  # type: ignore[misc]


def test_help_lists_flags_with_env_and_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        WorkerSettings.from_args(["--help"], environ={})
    assert exit_info.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # undo argparse's line wrapping
    assert "-np, --parallel N_PARALLEL" in out
    assert "(default: -1) (env: LLAMA_ARG_N_PARALLEL)" in out
    assert "--cache-prompt, --no-cache-prompt" in out
    assert "(default: enabled) (env: LLAMA_ARG_CACHE_PROMPT)" in out
    with pytest.raises(SystemExit):
        ApiSettings.from_args(["-h"], environ={})
    out = " ".join(capsys.readouterr().out.split())
    assert "--port PORT port to listen (default: 9931) (env: LLAMA_ARG_PORT)" in out
    assert "--api-key API_KEY" in out and "(env: LLAMA_API_KEY)" in out


def test_every_field_has_a_flag_and_a_description() -> None:
    for settings in (CommonSettings, ApiSettings, WorkerSettings):
        for option in settings.options():
            assert option.flags, option.name
            assert option.help, option.name


def test_a_custom_settings_class() -> None:
    class Demo(ProcessSettings):
        level: int | None = flag(None, "--level", env="DEMO_LEVEL", help="a level")
        names: list[str] = flag(["x"], "--names", help="names")

    assert Demo.from_args([], environ={"DEMO_LEVEL": "3"}).level == 3
    assert Demo.from_args([], environ={}).names == ["x"]
    assert Demo.from_args(["--names", "a,b"], environ={}).names == ["a", "b"]


def test_router_mode_is_no_model_and_no_default_model_opt_in() -> None:
    assert ApiSettings.from_args([], environ={}).router_mode()
    assert not ApiSettings.from_args(["--default-model"], environ={}).router_mode()
    assert not ApiSettings.from_args([], environ={"LLAMAQ_DEFAULT_MODEL": "1"}).router_mode()
    assert not ApiSettings.from_args(["-m", "x.gguf"], environ={}).router_mode()
    assert ApiSettings.from_args(["--default-model", "--models-dir", "d"],
                                 environ={}).router_mode()
    assert WorkerSettings.from_args([], environ={}).router_mode()
    assert not WorkerSettings.from_args(["--default-model"], environ={}).router_mode()
    assert not WorkerSettings.from_args(["-hf", "a/b"], environ={}).router_mode()


def test_the_sampling_flags_are_sampling_settings_fields() -> None:
    """One declaration: each SamplingSettings field declared with a flag is a worker flag,
    with that field's default (llama.cpp's common_params_sampling), env and aliases."""
    from scheduler.contract.jobs import SamplingSettings

    options = {o.name: o for o in WorkerSettings.options()}
    for name, info in SamplingSettings.model_fields.items():
        option = options.get(f"sampling.{name}")
        if name == "min_keep":  # no flag in llama-server either
            assert option is None
            continue
        assert option is not None, name
        assert option.default == info.get_default(call_default_factory=True), name
    assert options["sampling.temperature"].flags == ("--temp", "--temperature")
    assert options["sampling.temperature"].env == "LLAMA_ARG_TEMPERATURE"
    assert WorkerSettings.from_args([], environ={}).sampling == SamplingSettings()
    assert SamplingSettings().dry_penalty_last_n == 64  # common.h: dry_penalty_last_n = 64
    worker = WorkerSettings.from_args(["--dry-penalty-last-n", "32", "--mirostat-lr", "0.2"],
                                      environ={"LLAMA_ARG_TOP_K": "9"})
    assert (worker.sampling.dry_penalty_last_n, worker.sampling.mirostat_eta,
            worker.sampling.top_k) == (32, 0.2, 9)


def test_the_model_id_is_the_alphabetically_first_alias() -> None:
    """llama-server keeps --alias in a sorted set: `--alias zeta,alpha` serves as `alpha`."""
    for role in (ApiSettings, WorkerSettings):
        assert role.from_args(["--alias", "zeta,alpha,mid"], environ={}).model_id() == "alpha"


def test_a_key_setting_that_names_no_key_stops_the_start(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    """An empty --api-key-file or LLAMA_API_KEY="," would serve everyone: refused."""
    empty = tmp_path / "keys"
    empty.write_text("\n# no key here\n  \n")
    for argv, environ in (([], {"LLAMA_API_KEY": ","}), (["--api-key", ""], {}),
                          (["--api-key-file", str(empty)], {}),
                          (["--api-key-file", str(tmp_path / "missing")], {})):
        with pytest.raises(SystemExit) as exit_info:
            ApiSettings.from_args(argv, environ=environ)
        assert exit_info.value.code == 2
        assert "key" in capsys.readouterr().err
    empty.write_text("# one key\nsekrit\n")
    assert ApiSettings.from_args(["--api-key-file", str(empty)], environ={}).api_key_file
