"""--fit on a real model load (worker/process/startup.py, worker/runtime/memory_probe.py):
llama.cpp's own projections, read through the memory probe, decide the context as llama-server's
fit does."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.registry import FitReport
from tests.tiny_gguf import write_tiny_llama
from worker.process.startup import context_plan, fit_to_memory, load_model
from worker.runtime.devices import cpu_device, offload_devices
from worker.runtime.fit import MiB
from worker.runtime.flags import placement
from worker.runtime.model import ModelLoadError
from worker.runtime.settings import WorkerSettings


@pytest.fixture(scope="module")
def long_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("fit") / "tiny-64k.gguf", n_ctx=65536)


def loaded(path: Path, *argv: str) -> tuple[int, int, FitReport]:
    model = load_model(WorkerSettings.from_args(["-m", str(path), "--no-warmup", *argv],
                                                environ={}), path)
    try:
        assert model.fitted is not None
        return model.n_ctx, model.n_ctx_slot, model.fitted
    finally:
        model.close()


def test_an_unset_context_is_the_training_context_per_slot(long_tiny: Path) -> None:
    n_ctx, n_ctx_slot, report = loaded(long_tiny, "-np", "2")
    assert (n_ctx, n_ctx_slot) == (131072, 65536)  # llama-server's: fit sizes every stream
    assert report.fits and report.memory[-1].device == "host"
    model = load_model(WorkerSettings.from_args(["-m", str(long_tiny), "--no-warmup", "-np", "2",
                                                 "-fit", "off"], environ={}), long_tiny)
    assert (model.n_ctx, model.n_ctx_slot, model.fitted) == (65536, 32768, None)
    model.close()


def test_a_margin_that_leaves_too_little_room_cuts_the_context(long_tiny: Path) -> None:
    _, _, report = loaded(long_tiny, "-np", "1")
    host = report.memory[-1]
    margin = host.free_mib + host.context_mib // 2  # half the KV cache must go
    n_ctx, _, cut = loaded(long_tiny, "-np", "1", "-fitt", str(margin), "-fitc", "256")
    assert cut.fits and 256 <= n_ctx < 65536 and n_ctx % 256 == 0
    n_ctx, _, failed = loaded(long_tiny, "-np", "1", "-fitt", str(host.total_mib), "-fitc", "512")
    assert (n_ctx, failed.fits) == (512, False)
    assert loaded(long_tiny, "-np", "1", "-c", "0", "-fitt", str(host.total_mib))[0] == 65536


def test_placement_flags_load_and_bad_ones_stop_the_load(long_tiny: Path) -> None:
    assert loaded(long_tiny, "-c", "512", "-ot", r"blk\.0\.ffn_.*=CPU", "-cmoe", "-ncffn", "1",
                  "-dev", "none")[0] == 512
    with pytest.raises(ModelLoadError, match="unknown buffer type: NOPE"):
        loaded(long_tiny, "-c", "512", "-ot", "token_embd=NOPE")
    with pytest.raises(ModelLoadError, match="invalid device: NOPE0"):
        loaded(long_tiny, "-c", "512", "-dev", "NOPE0")


@pytest.mark.skipif(bool(offload_devices()), reason="a machine with an offload device")
def test_a_set_context_on_a_cpu_machine_reads_no_metadata(tmp_path: Path) -> None:
    """Nothing could change, so the probe does not read the model (its metadata load was
    ~0.6 s of every worker's start with Gemma 3): a file that is not there is never opened."""
    settings = WorkerSettings.from_args(["-m", "unread.gguf", "-c", "4096"], environ={})
    plan = context_plan(settings, False)
    outcome = fit_to_memory(settings, tmp_path / "unread.gguf", plan, placement(settings),
                            lambda _: None)
    assert outcome.n_gpu_layers is None and outcome.plan == plan
    assert outcome.report is not None and outcome.report.note == \
        "nothing to fit: -c is set, and there is no offload device"


LLAMA_SERVER_FITS = {1100: 23040, 1000: 20224}
"""n_ctx per slot that llama-server (the vendored llama.cpp, as it ships) chose for Gemma 3 270M
with `-np 2 --swa-full -fitt <host total MiB - room>`, per room (MiB): recorded with
`llama-server -m gemma-3-270m-Q4_K_M.gguf -np 2 --swa-full -fitt N` and its /props."""


@pytest.mark.parametrize("room", sorted(LLAMA_SERVER_FITS))
def test_the_fitted_context_is_llama_servers(gemma_path: Path, room: int) -> None:
    total_mib = cpu_device().total // MiB
    _, n_ctx_slot, report = loaded(gemma_path, "-np", "2", "--swa-full", "-fitt",
                                   str(total_mib - room))
    assert n_ctx_slot == LLAMA_SERVER_FITS[room] and report.fits
