"""The draft model's own placement flags on a real load (worker/process/side_models.py
load_draft, worker/runtime/flags.py tune_draft_model): -otd, -cmoed and -ncmoed reach
llama.cpp's loader for the draft model alone (its debug line `tensor ... buffer type overridden
to CPU` names each tensor moved), and --spec-draft-n-ubatch is the draft context's physical
batch, as llama-server's common_base_params_to_speculative hands them over. Gemma 3 270M drafts
for itself; a tiny Mixture of Experts (tests/tiny_gguf.py) for itself, for the MoE flags."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import llama_cpp as lc
import pytest

from tests.tiny_gguf import write_tiny_llama
from worker.process.startup import load_model
from worker.runtime.model import ModelLoadError
from worker.runtime.settings import WorkerSettings

OVERRIDDEN = re.compile(r"tensor (\S+) \(.*\) buffer type overridden to (\S+)")


@pytest.fixture(scope="module")
def tiny_moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("moe") / "tiny-moe.gguf", n_layer=3,
                            n_expert=4)


def load(path: Path, caplog: pytest.LogCaptureFixture, *argv: str
         ) -> tuple[dict[str, str], int, int]:
    """The tensors llama.cpp moved while loading (name → buffer type), the target's and the
    draft's physical batch."""
    settings = WorkerSettings.from_args(
        ["-m", str(path), "--no-warmup", "-c", "512", "-np", "1", "-fit", "off",
         "--spec-type", "draft-simple", "-md", str(path), *argv], environ={})
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="llama_cpp"):
        model = load_model(settings, path)
    try:
        assert model.draft is not None and model.ctx is not None
        moved = {m[1]: m[2] for m in map(OVERRIDDEN.search, caplog.messages) if m}
        return moved, lc.llama_n_ubatch(model.ctx), lc.llama_n_ubatch(model.draft.ctx)
    finally:
        model.close()


def test_otd_moves_the_draft_models_tensor_and_n_ubatch_is_the_drafts(
        gemma_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    moved, n_ubatch, draft_n_ubatch = load(gemma_path, caplog)
    assert moved == {} and n_ubatch == draft_n_ubatch == 512  # the draft takes -ub
    moved, n_ubatch, draft_n_ubatch = load(
        gemma_path, caplog, "-otd", r"blk\.0\.attn_q\.weight=CPU", "--spec-draft-n-ubatch", "64")
    assert moved == {"blk.0.attn_q.weight": "CPU"}  # the draft's alone: -ot is not given
    assert (n_ubatch, draft_n_ubatch) == (512, 64)


def test_the_draft_moe_flags_move_the_draft_models_experts(
        tiny_moe: Path, caplog: pytest.LogCaptureFixture) -> None:
    experts = {f"blk.{i}.ffn_{part}_exps.weight" for i in range(3)
               for part in ("gate", "up", "down")}
    assert load(tiny_moe, caplog)[0] == {}
    moved, _, _ = load(tiny_moe, caplog, "-ncmoed", "2")
    assert set(moved) == {name for name in experts if not name.startswith("blk.2.")}
    moved, _, _ = load(tiny_moe, caplog, "-cmoed")
    assert set(moved) == experts and set(moved.values()) == {"CPU"}


def test_a_bad_draft_override_stops_the_load_before_the_model_loads(
        gemma_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="llama_cpp"), \
            pytest.raises(ModelLoadError, match="unknown buffer type: NOPE"):
        load(gemma_path, caplog, "-otd", "token_embd=NOPE")
    assert not any("loaded meta data" in line for line in caplog.messages)
