"""LoRA adapters in the engine, in-process on Gemma 3 270M with the adapter of
tests/tiny_lora.py: loaded from the flags with their metadata, applied before each step, the
global scales changed between requests (and the idle caches made under the old ones dropped).
No Redis, no worker process."""

from __future__ import annotations

import hashlib
import itertools
import json
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler.contract.errors import InvalidRequest
from scheduler.contract.jobs import CompletionJob, LoraScale, SamplingParams
from scheduler.contract.results import CompletionResult, ErrorEvent, FinalEvent, TokenEvent
from tests.paths import DATA
from tests.tiny_lora import DEFAULT_SEED, write_control_vector, write_lora
from worker.engine.loop import Engine, JobEvent
from worker.process.startup import engine_defaults, load_model
from worker.runtime.model import LoadedModel, ModelLoadError
from worker.runtime.settings import WorkerSettings

GREEDY = SamplingParams(temperature=0.0)
PROMPT = "The capital of France is"
TIMEOUT_S = 120
EXPECTED = json.loads((DATA / "lora_greedy.json").read_text())
"""llama-server's greedy tokens with the seed's adapter (how they were made: its `about`)."""


def worker_settings(model: Path, *argv: str, n_parallel: int = 2) -> WorkerSettings:
    """1024 tokens a slot, as the stored expectation ran (the KV layout changes greedy ties)."""
    return WorkerSettings.from_args(["-m", str(model), "-c", str(1024 * n_parallel),
                                     "-np", str(n_parallel),
                                     "-t", "2", "--no-warmup", "--swa-full", *argv],
                                    environ={})  # the reference was made with --swa-full


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

    def run_all(self, jobs: list[CompletionJob]) -> tuple[dict[str, CompletionResult],
                                                          list[tuple[str, list[int]]]]:
        """Submit the jobs together; their results, and (job id, tokens) of every token event
        in the order the engine sent them (streamed jobs)."""
        for job in jobs:
            self.engine.submit(self.engine.prepare(job))
        results: dict[str, CompletionResult] = {}
        order: list[tuple[str, list[int]]] = []
        while len(results) < len(jobs):
            job_id, event = self.events.get(timeout=TIMEOUT_S)
            if isinstance(event, TokenEvent):
                order.append((job_id, list(event.tokens)))
            if isinstance(event, FinalEvent | ErrorEvent):
                assert isinstance(event, FinalEvent), event
                assert isinstance(event.result, CompletionResult)
                results[job_id] = event.result
        return results, order

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
                continue  # a request's own scale: test_a_requests_own_lora_...
            model.adapters.set_scales([case["scale"]])
            got = runner.complete(case["prompt"], EXPECTED["n_predict"], cache_prompt=False,
                                  return_tokens=True)
            assert got.tokens == case["tokens"], case
    finally:
        runner.engine.stop()
        model.close()


def lora_job(case: dict[str, Any], **fields: Any) -> CompletionJob:
    return CompletionJob(model="gemma", prompt=case["prompt"], n_predict=EXPECTED["n_predict"],
                         sampling=GREEDY, return_tokens=True,
                         lora=[LoraScale(id=0, scale=case["scale"])], **fields)


@pytest.fixture(scope="module")
def seeded(gemma_path: Path, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[tuple[LoadedModel, WorkerSettings]]:
    """Two slots of 1024 tokens with the seed's adapter, global scale 1 (the flag)."""
    path = write_lora(tmp_path_factory.mktemp("seeded") / "lora.gguf", seed=EXPECTED["seed"])
    settings = worker_settings(gemma_path, "--lora", str(path), n_parallel=2)
    model = load_model(settings, gemma_path)
    yield model, settings
    model.close()


@pytest.fixture
def seeded_run(seeded: tuple[LoadedModel, WorkerSettings]) -> Iterator[Run]:
    runner = Run(*seeded)
    runner.engine.start()
    yield runner
    runner.engine.stop()


def test_a_requests_own_lora_gives_llama_servers_tokens(seeded_run: Run) -> None:
    """Each stored case as a request's `lora` [{id 0, scale}] under the global scale 1, one
    at a time: llama-server's tokens (its per-request scale 0.5 too)."""
    for case in EXPECTED["cases"]:
        results, _ = seeded_run.run_all([lora_job(case, cache_prompt=False)])
        (result,) = results.values()
        assert result.tokens == case["tokens"], case
        assert result.generation_settings.lora == [LoraScale(id=0, scale=case["scale"])]


def test_runs_under_different_sets_decode_in_turns_and_both_progress(seeded_run: Run) -> None:
    """Two requests at once under different adapter sets (scale 1 and 0.5): each step decodes
    one set's group, the groups alternate (neither waits for the other to end), and each gets
    llama-server's tokens for its own scale, as if it had run alone."""
    cases = [c for c in EXPECTED["cases"] if c["prompt"] == PROMPT and c["scale"] in (1.0, 0.5)]
    jobs = [lora_job(case, cache_prompt=False, stream=True) for case in cases]
    _, order = seeded_run.run_all(jobs)
    for job, case in zip(jobs, cases, strict=True):
        assert [t for j, tokens in order if j == job.job_id for t in tokens] == case["tokens"]
    ids = [job_id for job_id, _ in order]
    half = ids[:len(ids) // 2]
    assert jobs[0].job_id in half and jobs[1].job_id in half  # both progress from the start
    switches = sum(a != b for a, b in itertools.pairwise(ids))
    assert switches >= len(ids) - 4  # they take turns, token by token


def test_a_prompt_cached_under_one_set_never_serves_another(seeded_run: Run) -> None:
    """The prefix cache is keyed by adapter set: the same prompt under scale 1 (cached), then
    under 0.5: evaluated again in full (and llama-server's tokens for 0.5), then under 1 again:
    the cache of its own set is reused."""
    case_1, case_05 = (next(c for c in EXPECTED["cases"]
                            if c["prompt"] == PROMPT and c["scale"] == s) for s in (1.0, 0.5))
    (a,) = seeded_run.run_all([lora_job(case_1)])[0].values()
    n_prompt = a.timings.prompt_n
    (b,) = seeded_run.run_all([lora_job(case_05)])[0].values()
    assert b.timings.prompt_n == n_prompt
    assert b.tokens == case_05["tokens"]
    (c,) = seeded_run.run_all([lora_job(case_1)])[0].values()
    assert c.timings.prompt_n < n_prompt


def test_a_control_vector_gives_llama_servers_tokens(gemma_path: Path, tmp_path: Path) -> None:
    """--control-vector-scaled FNAME:0.8 --control-vector-layer-range 2 12: llama-server's
    greedy tokens (stored with the vector's seed and SHA-256)."""
    stored = EXPECTED["control_vector"]
    path = write_control_vector(tmp_path / "cvec.gguf", seed=stored["seed"])
    assert hashlib.sha256(path.read_bytes()).hexdigest() == stored["sha256"]
    start, end = stored["layer_range"]
    settings = worker_settings(gemma_path, "--control-vector-scaled",
                               f"{path}:{stored['strength']}", "--control-vector-layer-range",
                               str(start), str(end), n_parallel=1)
    model = load_model(settings, gemma_path)
    runner = Run(model, settings)
    runner.engine.start()
    try:
        for case in stored["cases"]:
            got = runner.complete(case["prompt"], EXPECTED["n_predict"], cache_prompt=False,
                                  return_tokens=True)
            assert got.tokens == case["tokens"], case
    finally:
        runner.engine.stop()
        model.close()


def test_a_bad_control_vector_stops_the_load(gemma_path: Path, lora_path: Path,
                                             tmp_path: Path) -> None:
    """A LoRA file is no control vector (its tensors are not direction.N); a bad scale is
    llama-server's format error."""
    with pytest.raises(ModelLoadError, match="invalid direction tensor layer index"):
        load_model(worker_settings(gemma_path, "--control-vector", str(lora_path)), gemma_path)
    with pytest.raises(ModelLoadError, match="control-vector-scaled format"):
        load_model(worker_settings(gemma_path, "--control-vector-scaled", "x.gguf"), gemma_path)
    with pytest.raises(ModelLoadError, match="failed to load control vector"):
        load_model(worker_settings(gemma_path, "--control-vector", str(tmp_path / "none")),
                   gemma_path)


ALORA = json.loads((DATA / "alora_greedy.json").read_text())
"""llama-server's greedy tokens with two aLoRA adapters (how they were made: its `about`)."""


def alora_job(prompt: str, *scales: float, **fields: Any) -> CompletionJob:
    return CompletionJob(model="gemma", prompt=prompt, n_predict=ALORA["n_predict"],
                         sampling=GREEDY, return_tokens=True,
                         lora=[LoraScale(id=i, scale=s) for i, s in enumerate(scales)], **fields)


@pytest.fixture(scope="module")
def with_aloras(gemma_path: Path, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[tuple[LoadedModel, WorkerSettings]]:
    folder = tmp_path_factory.mktemp("alora")
    tokens = tuple(ALORA["invocation_tokens"])
    first = write_lora(folder / "alora-a.gguf", seed=ALORA["seed"], invocation_tokens=tokens)
    assert hashlib.sha256(first.read_bytes()).hexdigest() == ALORA["adapter_sha256"]
    second = write_lora(folder / "alora-b.gguf", seed=ALORA["second_seed"],
                        invocation_tokens=tokens)
    settings = worker_settings(gemma_path, "--lora", str(first), "--lora", str(second),
                               n_parallel=1)
    model = load_model(settings, gemma_path)
    yield model, settings
    model.close()


@pytest.fixture
def alora_run(with_aloras: tuple[LoadedModel, WorkerSettings]) -> Iterator[Run]:
    runner = Run(*with_aloras)
    runner.engine.start()
    yield runner
    runner.engine.stop()


def test_an_alora_applies_from_its_invocation_as_llama_server(alora_run: Run) -> None:
    """llama-server's tokens (tests/data/alora_greedy.json): with the invocation the adapter
    applies from one token before it (the prompt before it decoded without), without it the
    aLoRA is off; the adapter's info carries its invocation."""
    info = alora_run.engine.model.adapters.infos()[0]
    assert info.alora_invocation_tokens == ALORA["invocation_tokens"]
    assert info.alora_invocation_string == "Answer:"
    for case in ALORA["cases"]:
        results, _ = alora_run.run_all([alora_job(case["prompt"], 1.0, 0.0,
                                                  cache_prompt=False)])
        (result,) = results.values()
        assert result.tokens == case["tokens"], case
    assert ALORA["cases"][0]["tokens"] != ALORA["base_tokens_with_invocation"]


def test_the_base_prefix_before_the_invocation_is_shared(alora_run: Run) -> None:
    """The prompt before the invocation is the base model's: a plain request after an aLoRA
    one reuses it (and only it), and gets the base tokens; the aLoRA request again reuses the
    base prefix and gets its own tokens."""
    case = ALORA["cases"][0]
    first, _ = alora_run.run_all([alora_job(case["prompt"], 1.0, 0.0)])
    plain, _ = alora_run.run_all([alora_job(case["prompt"], 0.0, 0.0)])
    again, _ = alora_run.run_all([alora_job(case["prompt"], 1.0, 0.0)])
    n_prompt = first[next(iter(first))].tokens_evaluated
    invocation = n_prompt - 2  # "Answer:" ends the prompt
    (plain_result,), (again_result,) = plain.values(), again.values()
    assert plain_result.tokens == ALORA["base_tokens_with_invocation"]
    assert plain_result.timings.cache_n == invocation - 1
    assert again_result.tokens == case["tokens"]
    assert again_result.timings.cache_n == invocation - 1


def test_two_enabled_aloras_are_refused_as_llama_server_refuses(alora_run: Run) -> None:
    job = alora_job("x Answer:", 1.0, 1.0)
    with pytest.raises(InvalidRequest, match=ALORA["both_enabled_error"]["message"]):
        alora_run.engine.prepare(job)
