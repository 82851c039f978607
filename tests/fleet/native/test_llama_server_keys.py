"""The shapes of llamaq's answers beside llama-server's (the same llama.cpp, the same flags,
tests/key_probe.py): every key llama-server's `/props`, `/slots`, `/completion` and
`/v1/chat/completions` answers have, llamaq's have, with the same type; llamaq's own extra keys
come only from the allow-list below (docs/endpoints.md lists them). llama-server's shapes are
recorded in tests/data/llama_server_keys.json by bench/record_llama_server_keys.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import make_fleet
from tests.key_probe import FLAGS, probe
from tests.paths import DATA

RECORDED = DATA / "llama_server_keys.json"
FIT_KEYS = {"fit", *(f"fit.{k}" for k in ("enabled", "fits", "n_ctx", "n_gpu_layers", "note",
                                          "memory")),
            *(f"fit.memory[].{k}" for k in ("device", "free_mib", "total_mib", "model_mib",
                                            "context_mib", "compute_mib"))}
OURS = {
    "GET /props": {"capabilities", "decisions", "decisions.mode", "llamaq_version",
                   *FIT_KEYS},
    "GET /slots": set(),
    "POST /completion": set(),
    "POST /v1/chat/completions": set(),
}
"""llamaq's own keys (docs/endpoints.md, "Keys of our own"): what a model serves
(`capabilities`), how it serves /v1/systemone (`decisions`), its version, what --fit decided
(`fit`)."""


@pytest.fixture(scope="module")
def answers(redis_url: str, workdir: Path, gemma_path: Path) -> Iterator[dict[str, dict[str, str]]]:
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma-keys")
    worker_flags = [f for f in FLAGS if f != "--metrics"]
    try:
        fleet.add_worker(*worker_flags)
        url = fleet.add_api("--metrics")
        fleet.wait_healthy(url)
        yield probe(url)
    finally:
        fleet.stop()


@pytest.mark.parametrize("endpoint", list(OURS))
def test_every_key_of_llama_server_with_its_type_and_only_our_listed_extras(
        answers: dict[str, dict[str, str]], endpoint: str) -> None:
    theirs = json.loads(RECORDED.read_text())[endpoint]
    ours = answers[endpoint]
    missing = {key: kind for key, kind in theirs.items() if key not in ours}
    assert not missing, f"{endpoint}: llama-server has {missing}"
    other = {key: (kind, ours[key]) for key, kind in theirs.items() if ours[key] != kind}
    assert not other, f"{endpoint}: types differ (llama-server, llamaq): {other}"
    extra = set(ours) - set(theirs) - OURS[endpoint]
    assert not extra, f"{endpoint}: keys llama-server does not have: {sorted(extra)}"
