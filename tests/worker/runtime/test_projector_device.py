"""-mmdev/--mmproj-device (MTMD_BACKEND_DEVICE): where the projector runs, as llama-server reads
it (none, or one device by name), on the real mtmd path with the tiny gemma3 projector."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.process.startup import load_model
from worker.runtime.model import ModelLoadError
from worker.runtime.settings import WorkerSettings


def load(gemma: Path, projector: Path, *argv: str, environ: dict[str, str] | None = None) -> bool:
    settings = WorkerSettings.from_args(["-m", str(gemma), "-mm", str(projector), "-c", "1024",
                                         "-np", "1", "--no-warmup", *argv], environ=environ or {})
    model = load_model(settings, gemma)
    try:
        return model.projector is not None and model.projector.vision
    finally:
        model.close()


def test_the_projector_loads_without_offload(gemma_path: Path, tiny_mmproj_path: Path) -> None:
    assert load(gemma_path, tiny_mmproj_path, "-mmdev", "none")
    assert load(gemma_path, tiny_mmproj_path, environ={"MTMD_BACKEND_DEVICE": "none"})


def test_an_unknown_projector_device_stops_the_start(gemma_path: Path,
                                                     tiny_mmproj_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="invalid device: NOPE0"):
        load(gemma_path, tiny_mmproj_path, "-mmdev", "NOPE0")
