"""Speculative decoding through a real fleet (Redis, an api pod, a worker started with
--spec-type): what llama-server reports for it on the wire (timings.draft_n and
draft_n_accepted, `speculative` of /slots, `speculative.types` of generation_settings and of
/props, the llamacpp:spec_decode_* counters and the per-position series), and a worker whose
--spec-type names a draft type llamaq cannot load stops before it loads, naming it."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import make_fleet
from tests.fleet.speculative.test_lookup_share import flat_counts
from tests.paths import ROOT
from tests.processes import Fleet
from tests.worker.engine.test_engine_speculative import CODE
from worker.speculative import ngram_cache as nc


@pytest.fixture(scope="module")
def spec_fleet(redis_url: str, workdir: Path, gemma_path: Path) -> Iterator[Fleet]:
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma-spec")
    fleet.add_worker("-c", "4096", "-np", "2", "-t", "2", "--spec-type", "ngram-simple",
                     "--spec-ngram-simple-size-n", "4", "--spec-ngram-simple-size-m", "16")
    url = fleet.add_api("--metrics")
    fleet.wait_healthy(url)
    yield fleet
    fleet.stop()


def test_a_speculating_worker_reports_as_llama_server(spec_fleet: Fleet) -> None:
    url = spec_fleet.api_urls[0]
    body = {"model": "gemma-spec", "prompt": CODE, "n_predict": 48, "temperature": 0,
            "cache_prompt": False}
    answer = httpx.post(f"{url}/completion", json=body, timeout=120).json()
    timings = answer["timings"]
    assert timings["predicted_n"] == 48
    assert timings["draft_n"] > 0 and 0 < timings["draft_n_accepted"] <= timings["draft_n"]
    assert answer["generation_settings"]["speculative.types"] == "none,ngram-simple"
    slots = httpx.get(f"{url}/slots", params={"model": "gemma-spec"}, timeout=30).json()
    assert all(slot["speculative"] is True for slot in slots)
    props = httpx.get(f"{url}/props", params={"model": "gemma-spec"}, timeout=30).json()
    assert props["default_generation_settings"]["params"]["speculative.types"] == "none"

    def metric_lines() -> list[str]:
        return httpx.get(f"{url}/metrics", timeout=30).text.splitlines()

    def value(name: str) -> float:
        line = next(x for x in metric_lines() if x.startswith(f"llamacpp:{name} "))
        return float(line.split()[1])

    deadline = time.monotonic() + 15  # the worker's counters come with its next report
    while value("spec_decode_num_draft_tokens_total") < timings["draft_n"] \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    assert value("spec_decode_num_draft_tokens_total") >= timings["draft_n"]
    assert value("spec_decode_num_accepted_tokens_total") >= timings["draft_n_accepted"]
    assert value("spec_decode_num_drafts_total") > 0
    per_pos = [x for x in metric_lines()
               if x.startswith("llamacpp:spec_decode_num_accepted_tokens_per_pos_total{")]
    assert per_pos[0].startswith('llamacpp:spec_decode_num_accepted_tokens_per_pos_total'
                                 '{position="0"} ') and len(per_pos) == 16


@pytest.mark.process
@pytest.mark.parametrize(("argv", "words"), [
    (["--spec-type", "draft-eagle3"], "--spec-type draft-eagle3 is not supported by llamaq"),
    (["--spec-type", "ngram-nope"], "unknown speculative type: ngram-nope"),
    (["--spec-ngram-mod-n-match", "0"], "ngram size N must be between 1 and 1024 inclusive"),
    (["--draft-max", "8"], "the argument has been removed. use --spec-draft-n-max or "
                           "--spec-ngram-mod-n-max"),
])
def test_a_worker_refuses_what_it_cannot_draft_with(tmp_path: Path, argv: list[str],
                                                    words: str) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "llamaq", "worker", "-m", str(tmp_path / "absent.gguf"),
         "--redis-url", "redis://127.0.0.1:1", *argv],
        capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert run.returncode != 0
    assert words in " ".join(run.stderr.split()), run.stderr[-2000:]


@pytest.mark.process
def test_workers_of_a_model_grow_one_dynamic_lookup_cache(redis_url: str, tmp_path: Path,
                                                          gemma_path: Path) -> None:
    """-lcd with ngram-cache: worker A counts its requests into the dynamic lookup cache and
    saves it to the store as it stops; worker B, started after with an -lcd file of the same
    name that does not exist yet, starts from the stored cache and adds its own counts."""
    fleet = make_fleet(redis_url, tmp_path, gemma_path, "gemma-lcd")
    url = fleet.add_api()
    body = {"model": "gemma-lcd", "prompt": CODE, "n_predict": 24, "temperature": 0}
    stored: list[dict[tuple[nc.Ngram, int], int]] = []
    try:
        for worker in ("a", "b"):
            (tmp_path / worker).mkdir()
            lcd = tmp_path / worker / "dyn.bin"
            process = fleet.add_worker("-c", "2048", "-np", "1", "-t", "2", "--spec-type",
                                       "ngram-cache", "-lcd", str(lcd))
            fleet.wait_healthy(url)
            if stored:  # B: the stored cache fetched to its file before it served
                assert flat_counts(nc.load_file(str(lcd))) == stored[-1]
            for _ in range(2):
                answer = httpx.post(f"{url}/completion", json=body, timeout=120)
                assert answer.status_code == 200, answer.text
            fleet.stop_process(process)  # drains, then saves what it learned
            keys = list((tmp_path / "store" / "lookup-cache").glob("*/dyn.bin"))
            assert len(keys) == 1, keys
            stored.append(flat_counts(nc.loads(keys[0].read_bytes())))
            assert flat_counts(nc.load_file(str(lcd))) == stored[-1]  # written back to -lcd too
    finally:
        fleet.stop()
    first, second = stored
    assert first, "worker A saved nothing"
    assert all(second.get(key, 0) >= count for key, count in first.items())  # A's kept
    assert sum(second.values()) > sum(first.values())  # and B's added
