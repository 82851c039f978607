"""llama-server's --*-default model presets (scheduler/config/model_presets.py): each role takes
the preset's flags it knows, under what its command line and environment gave."""

from __future__ import annotations

from api.settings import ApiSettings
from scheduler.config.command_line import split_args
from worker.runtime.settings import WorkerSettings


def test_gpt_oss_20b_default_on_the_worker_and_the_api() -> None:
    worker = WorkerSettings.from_args(["--gpt-oss-20b-default"], environ={})
    assert (worker.hf_repo, worker.hf_file) == ("ggml-org/gpt-oss-20b-GGUF",
                                                "gpt-oss-20b-mxfp4.gguf")
    assert (worker.batch_size, worker.ubatch_size, worker.n_parallel, worker.ctx_size) == (
        32768, 2048, 2, 262144)
    assert (worker.sampling.temperature, worker.sampling.top_p, worker.sampling.top_k,
            worker.sampling.min_p) == (1.0, 1.0, 0, 0.01)
    api = ApiSettings.from_args(["--gpt-oss-20b-default"], environ={})
    assert api.port == 8013 and api.jinja and api.hf_repo == "ggml-org/gpt-oss-20b-GGUF"


def test_what_is_given_wins_wherever_it_stands() -> None:
    worker = WorkerSettings.from_args(["-c", "4096", "--embd-gemma-default", "--temp", "0"],
                                      environ={"LLAMA_ARG_N_PARALLEL": "3"})
    assert worker.ctx_size == 4096 and worker.n_parallel == 3 and worker.embedding
    assert worker.hf_file == "embeddinggemma-300M-qat-Q4_0.gguf"
    assert worker.sampling.temperature == 0


def test_up_hands_the_preset_to_every_role() -> None:
    parts = split_args(["--vision-gemma-4b-default"], [ApiSettings, WorkerSettings])
    assert parts[ApiSettings] == parts[WorkerSettings] == ["--vision-gemma-4b-default"]


def test_the_spec_presets_name_their_hub_draft() -> None:
    worker = WorkerSettings.from_args(["--fim-qwen-14b-spec"], environ={})
    assert (worker.hf_repo, worker.hf_file) == ("ggml-org/Qwen2.5-Coder-14B-Q8_0-GGUF",
                                                "qwen2.5-coder-14b-q8_0.gguf")
    assert (worker.spec_draft_hf, worker.spec_draft_model) == (
        "ggml-org/Qwen2.5-Coder-0.5B-Q8_0-GGUF", "qwen2.5-coder-0.5b-q8_0.gguf")
    assert (worker.batch_size, worker.ubatch_size, worker.cache_reuse) == (1024, 1024, 256)
    api = ApiSettings.from_args(["--fim-qwen-7b-spec"], environ={})
    assert api.port == 8012 and api.hf_repo == "ggml-org/Qwen2.5-Coder-7B-Q8_0-GGUF"
