"""The draft model's flags (--spec-type draft-simple, -md, --spec-draft-*) as the worker reads
them: llama-server's defaults, its checks, and llamaq's refusal of draft-simple without a
draft model (llama-server logs that and serves without speculation)."""

from __future__ import annotations

import ctypes

import llama_cpp as lc
import pytest

from scheduler.config.spec_flags import SPEC_FLAGS, FlagStatus, SpecFlag
from worker.runtime import flags
from worker.runtime.devices import DeviceError, buffer_types
from worker.runtime.flags import UnsupportedFlag
from worker.runtime.settings import WorkerSettings
from worker.runtime.tensor_overrides import FFN_EXPERTS, TensorOverride
from worker.speculative.config import refusal


def _worker(*argv: str) -> WorkerSettings:
    return WorkerSettings.from_args(list(argv), environ={})


def test_draft_simple_is_built_and_its_defaults_are_llama_servers() -> None:
    assert refusal(["none", "draft-simple"]) is None
    config = flags.speculative(_worker("--spec-type", "draft-simple", "-md", "d.gguf"))
    assert config.drafting == ["draft-simple"] and config.draft_model == "d.gguf"
    assert (config.draft.n_max, config.draft.n_min, config.draft.p_min) == (3, 0, 0.0)
    assert config.n_max() == 3 and config.name_str() == "none,draft-simple"


def test_the_draft_flags_and_their_environment_variables() -> None:
    s = WorkerSettings.from_args(
        ["--spec-type", "ngram-mod,draft-simple", "--spec-draft-n-max", "8",
         "--spec-draft-n-min", "2", "--draft-p-min", "0.5", "-ngld", "0", "-ctkd", "q8_0",
         "-ctvd", "q8_0", "-td", "1", "-tbd", "2"],
        environ={"LLAMA_ARG_SPEC_DRAFT_MODEL": "draft.gguf"})
    config = flags.speculative(s)
    assert config.drafting == ["ngram-mod", "draft-simple"]  # llama.cpp's order of preference
    assert (config.draft.n_max, config.draft.n_min, config.draft.p_min) == (8, 2, 0.5)
    assert config.draft_model == "draft.gguf" and config.n_max() == 64
    assert (s.spec_draft_type_k, s.spec_draft_type_v) == ("q8_0", "q8_0")
    assert (s.spec_draft_threads, s.spec_draft_threads_batch) == (1, 2)
    params = lc.llama_model_default_params()
    flags.tune_draft_model(params, s)
    assert params.n_gpu_layers == 0


def _overrides(params: lc.llama_model_params) -> list[tuple[str, str]]:
    """The NULL-terminated tensor_buft_overrides array handed to llama.cpp, read back."""
    if not params.tensor_buft_overrides:
        return []
    array = ctypes.cast(params.tensor_buft_overrides, ctypes.POINTER(TensorOverride))
    names = {v: k for k, v in buffer_types().items()}
    found, i = [], 0
    while array[i].pattern is not None:
        found.append((array[i].pattern.decode(), names[array[i].buft]))
        i += 1
    return found


def test_the_draft_tensor_placement_reaches_its_model_params() -> None:
    """-otd (repeated, comma lists), -cmoed and -ncmoed push the draft model's own overrides
    in that order (llama-server's arguments), and the target's -ot/-cmoe/-ncmoe/-ncffn stay
    the target's (common_base_params_to_speculative)."""
    s = _worker("-ot", "token_embd=CPU", "-cmoe", "-ncmoe", "1", "-ncffn", "1",
                "-otd", r"blk\.0\.attn_q=CPU,output=CPU", "--override-tensor-draft",
                "token_embd=CPU", "-cmoed", "-ncmoed", "2")
    params = lc.llama_model_default_params()
    kept = flags.tune_draft_model(params, s)
    assert _overrides(params) == [
        (r"blk\.0\.attn_q", "CPU"), ("output", "CPU"), ("token_embd", "CPU"),
        (FFN_EXPERTS, "CPU"), (r"blk\.0" + FFN_EXPERTS, "CPU"), (r"blk\.1" + FFN_EXPERTS, "CPU")]
    assert kept.overrides and len(kept.overrides) == 6
    plain = lc.llama_model_default_params()
    flags.tune_draft_model(plain, _worker("-ot", "token_embd=CPU", "-cmoe"))
    assert _overrides(plain) == []


def test_the_draft_placement_and_ubatch_environment_variables() -> None:
    s = WorkerSettings.from_args([], environ={"LLAMA_ARG_SPEC_DRAFT_CPU_MOE": "1",
                                              "LLAMA_ARG_SPEC_DRAFT_N_CPU_MOE": "3",
                                              "LLAMA_ARG_SPEC_DRAFT_N_UBATCH": "64"})
    assert (s.spec_draft_cpu_moe, s.spec_draft_n_cpu_moe, s.spec_draft_n_ubatch) == (True, 3, 64)
    assert _worker("--spec-draft-cpu-moe", "--spec-draft-ncmoe", "1", "--n-cpu-moe-draft", "4",
                   "--spec-draft-n-ubatch", "32").spec_draft_n_ubatch == 32
    assert _worker().spec_draft_n_ubatch == 0  # llama-server's: 0, the same as -ub


@pytest.mark.parametrize(("argv", "message"), [
    (["-otd", "no-equals-sign"], "invalid value for --spec-draft-override-tensor"),
    (["-otd", "token_embd=NOPE"], "unknown buffer type: NOPE"),
])
def test_a_bad_draft_override_is_refused_by_name(argv: list[str], message: str) -> None:
    with pytest.raises(DeviceError, match=message):
        flags.tune_draft_model(lc.llama_model_default_params(), _worker(*argv))


def test_draft_simple_without_a_draft_model_is_refused() -> None:
    with pytest.raises(UnsupportedFlag, match="draft-simple needs a draft model: give "
                       "-md/--spec-draft-model"):
        flags.speculative(_worker("--spec-type", "draft-simple"))


def test_a_draft_model_without_draft_simple_drafts_nothing() -> None:
    config = flags.speculative(_worker("-md", "d.gguf"))
    assert not config.enabled and config.draft_model is None


@pytest.mark.parametrize(("argv", "message"), [
    (["--spec-draft-n-max", "-1"], "--spec-draft-n-max: invalid value"),
    (["-ngld", "many"], "-ngld/--spec-draft-ngl: invalid value: many"),
    (["--spec-draft-n-ubatch", "-1"], "--spec-draft-n-ubatch: invalid value"),
    (["-ncmoed", "-2"], "-ncmoed/--spec-draft-n-cpu-moe: invalid value"),
])
def test_bad_draft_values_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(UnsupportedFlag, match=message):
        flags.speculative(_worker("--spec-type", "draft-simple", "-md", "d.gguf", *argv))


def lookup(name: str) -> SpecFlag | None:
    return next((row for row in SPEC_FLAGS if name in row.names), None)


def test_the_flag_table_says_what_works() -> None:
    for name in ("-md", "-hfd", "--spec-draft-n-max", "--spec-draft-n-min", "--spec-draft-p-min",
                 "-ngld", "-ctkd", "-ctvd", "-devd", "-td", "-tbd"):
        row = lookup(name)
        assert row is not None and row.status == FlagStatus.WORKS, name
    for name in ("-otd", "-cmoed", "-ncmoed", "--spec-draft-n-ubatch"):
        row = lookup(name)
        assert row is not None and row.status == FlagStatus.WORKS, name
    for name in ("-Cd",):
        row = lookup(name)
        assert row is not None and row.status == FlagStatus.REFUSED and row.why, name
