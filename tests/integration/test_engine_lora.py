"""LoRA adapters in the engine, in-process on Gemma 3 270M with the adapter of
tests/tiny_lora.py: loaded from the flags with their metadata, applied before each step, the
global scales changed between requests (and the idle caches made under the old ones dropped).
No Redis, no worker process."""

from __future__ import annotations

import hashlib
import json
import queue
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler.contract.jobs import CompletionJob, SamplingParams
from scheduler.contract.results import CompletionResult, ErrorEvent, FinalEvent
from tests.tiny_lora import DEFAULT_SEED, write_lora
from worker.engine import Engine, JobEvent
from worker.model import LoadedModel, ModelLoadError
from worker.process.startup import engine_defaults, load_model
from worker.settings import WorkerSettings

GREEDY = SamplingParams(temperature=0.0)
PROMPT = "The capital of France is"
TIMEOUT_S = 120
EXPECTED = json.loads((Path(__file__).parent.parent / "data" / "lora_greedy.json").read_text())
"""llama-server's greedy tokens with the seed's adapter (how they were made: its `about`)."""


def worker_settings(model: Path, *argv: str, n_parallel: int = 2) -> WorkerSettings:
    return WorkerSettings.from_args(["-m", str(model), "-c", "1024", "-np", str(n_parallel),
                                     "-t", "2", "--no-warmup", *argv], environ={})


@pytest.fixture(scope="module")
def lora_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_lora(tmp_path_factory.mktemp("lora") / "lora-a.gguf", task_name="tiny-task",
                      prompt_prefix="Q: ")


@pytest.fixture(scope="module")
def with_lora(gemma_path: Path, lora_path: Path) -> Iterator[tuple[LoadedModel, WorkerSettings]]:
    settings = worker_settings(gemma_path, "--lora", str(lora_path))
    model = load_model(settings, gemma_path)
    yield model, settings
    model.close()


class Run:
    def __init__(self, model: LoadedModel, settings: WorkerSettings) -> None:
        self.events: queue.Queue[JobEvent] = queue.Queue()
        self.engine = Engine(model, engine_defaults(settings, "gemma", "w"), self.sink)

    def sink(self, events: list[JobEvent]) -> None:
        for event in events:
            self.events.put(event)

    def complete(self, prompt: str = PROMPT, n_predict: int = 16,
                 **fields: object) -> CompletionResult:
        job = CompletionJob(model="gemma", prompt=prompt, n_predict=n_predict, sampling=GREEDY,
                            **fields)  # type: ignore[arg-type]
        self.engine.submit(self.engine.prepare(job))
        while True:
            job_id, event = self.events.get(timeout=TIMEOUT_S)
            if job_id == job.job_id and isinstance(event, FinalEvent | ErrorEvent):
                assert isinstance(event, FinalEvent), event
                assert isinstance(event.result, CompletionResult)
                return event.result


@pytest.fixture
def run(with_lora: tuple[LoadedModel, WorkerSettings]) -> Iterator[Run]:
    model, settings = with_lora
    model.adapters.set_scales([1.0])
    runner = Run(model, settings)
    runner.engine.start()
    yield runner
    runner.engine.stop()


def base_text(gemma_path: Path) -> str:
    settings = worker_settings(gemma_path)
    model = load_model(settings, gemma_path)
    try:
        runner = Run(model, settings)
        runner.engine.start()
        try:
            return runner.complete().content
        finally:
            runner.engine.stop()
    finally:
        model.close()


def test_the_flags_adapter_is_loaded_with_its_metadata(
        with_lora: tuple[LoadedModel, WorkerSettings], lora_path: Path) -> None:
    infos = with_lora[0].adapters.infos()
    assert [i.model_dump() for i in infos] == [{
        "id": 0, "path": str(lora_path), "scale": 1.0, "task_name": "tiny-task",
        "prompt_prefix": "Q: ", "alora_invocation_string": None,
        "alora_invocation_tokens": None}]
    assert infos[0].wire() == {"id": 0, "path": str(lora_path), "scale": 1.0,
                               "task_name": "tiny-task", "prompt_prefix": "Q: "}


def test_the_adapter_changes_greedy_text_and_scale_0_is_the_base_model(
        run: Run, gemma_path: Path) -> None:
    """Scale 1 changes the text; the global scale set to 0 between two requests gives the base
    model's text again (the engine set it before the next step), token for token."""
    with_adapter = run.complete().content
    run.engine.model.adapters.set_scales([0.0])
    without = run.complete().content
    assert without == base_text(gemma_path)
    assert with_adapter != without


def test_new_scales_drop_the_idle_caches_made_under_the_old_ones(run: Run) -> None:
    first = run.complete()
    n_prompt = first.timings.prompt_n
    again = run.complete()
    assert again.timings.prompt_n < n_prompt  # same scales: the prompt's cache is reused
    assert again.content == first.content
    run.engine.model.adapters.set_scales([0.5])
    changed = run.complete()
    assert changed.timings.prompt_n == n_prompt  # evaluated again, under the new scale
    assert changed.content != first.content


def test_lora_init_without_apply_starts_at_scale_0(gemma_path: Path, lora_path: Path) -> None:
    settings = worker_settings(gemma_path, "--lora-scaled", f"{lora_path}:0.7",
                               "--lora-init-without-apply")
    model = load_model(settings, gemma_path)
    try:
        assert model.adapters.scales == [0.0]
    finally:
        model.close()


def test_scaled_flags_keep_their_order_and_a_bad_file_stops_the_load(
        gemma_path: Path, lora_path: Path, tmp_path: Path) -> None:
    settings = worker_settings(gemma_path, "--lora", str(lora_path),
                               "--lora-scaled", f"{lora_path}:0.25")
    model = load_model(settings, gemma_path)
    try:
        assert model.adapters.scales == [1.0, 0.25]
    finally:
        model.close()
    bad = tmp_path / "not-an-adapter.gguf"
    bad.write_bytes(b"GGUF junk")
    with pytest.raises(ModelLoadError, match="failed to load lora adapter"):
        load_model(worker_settings(gemma_path, "--lora", str(bad)), gemma_path)
    with pytest.raises(ModelLoadError, match="lora-scaled format"):
        load_model(worker_settings(gemma_path, "--lora-scaled", str(lora_path)), gemma_path)


def test_greedy_tokens_equal_llama_servers_with_the_same_adapter(
        gemma_path: Path, tmp_path: Path) -> None:
    """The stored expectation of the vendored llama-server (tests/data/lora_greedy.json), token
    for token, under the global scales 1 (--lora) and 0 (POST /lora-adapters []); the adapter
    is the same file (its SHA-256), written again from the stored seed."""
    assert EXPECTED["seed"] == DEFAULT_SEED
    path = write_lora(tmp_path / "lora.gguf", seed=EXPECTED["seed"])
    assert hashlib.sha256(path.read_bytes()).hexdigest() == EXPECTED["adapter_sha256"]
    settings = worker_settings(gemma_path, "--lora", str(path), n_parallel=1)  # as it ran
    model = load_model(settings, gemma_path)
    runner = Run(model, settings)
    runner.engine.start()
    try:
        for case in EXPECTED["cases"]:
            if case["scale"] not in (0.0, 1.0):
                continue  # a request's own scale: the per-request lora (not built yet)
            model.adapters.set_scales([case["scale"]])
            got = runner.complete(case["prompt"], EXPECTED["n_predict"], cache_prompt=False,
                                  return_tokens=True)
            assert got.tokens == case["tokens"], case
    finally:
        runner.engine.stop()
        model.close()
