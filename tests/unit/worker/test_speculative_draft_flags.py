"""The draft model's flags (--spec-type draft-simple, -md, --spec-draft-*) as the worker reads
them: llama-server's defaults, its checks, and llamaq's refusal of draft-simple without a
draft model (llama-server logs that and serves without speculation)."""

from __future__ import annotations

import llama_cpp as lc
import pytest

from scheduler.config.spec_flags import SPEC_FLAGS, FlagStatus, SpecFlag
from worker.runtime import flags
from worker.runtime.flags import UnsupportedFlag
from worker.runtime.settings import WorkerSettings
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
    for name in ("-otd", "-cmoed", "--spec-draft-n-ubatch", "-Cd"):
        row = lookup(name)
        assert row is not None and row.status == FlagStatus.REFUSED and row.why, name
