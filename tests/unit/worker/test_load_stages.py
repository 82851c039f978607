"""The stages a worker's load reports in /models/sse (the spec's loading events), as the
vendored server-context.cpp lists them: text_model, then spec_model for any draft model (-md
or -hfd, even without --spec-type draft-simple: llama-server loads it), then mmproj_model."""

from __future__ import annotations

import pytest

from worker.process.side_models import load_stages
from worker.runtime.settings import WorkerSettings


@pytest.mark.parametrize(("argv", "stages"), [
    ([], ["text_model"]),
    (["-md", "draft.gguf"], ["text_model", "spec_model"]),
    (["-md", "draft.gguf", "--spec-type", "draft-simple", "-mm", "proj.gguf"],
     ["text_model", "spec_model", "mmproj_model"]),
    (["-mm", "proj.gguf"], ["text_model", "mmproj_model"]),
    (["--embedding", "-md", "draft.gguf"], ["text_model"]),
])
def test_load_stages_are_llama_servers(argv: list[str], stages: list[str]) -> None:
    assert load_stages(WorkerSettings.from_args(argv)) == stages
