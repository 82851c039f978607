"""The spec's decision families through real api and worker processes: tiny llama GGUFs that
name a family as llama.cpp reads it (`llama.decision.type`, with the systemone template and
fitted temperatures their published files carry): lfm2-d1, a label-logit family that llamaq's
engine answers, and clef, a decision-head family that serves only /v1/systemone."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import make_fleet

SYSTEMONE = "{{ state }}|{{ instructions }}|{% for o in options %}{{ o.key }};{% endfor %}"
QUESTIONS = {
    "route": {"type": "choice", "instructions": "Which team?",
              "criteria": {"billing": None, "shipping": None, "technical": None}},
    "angry": {"type": "noul", "instructions": "Is the customer angry?"},
}


@pytest.fixture(scope="module")
def families(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    from tests.tiny_gguf import write_tiny_llama

    folder = tmp_path_factory.mktemp("families")
    urls: dict[str, str] = {}
    fleets = []
    for name in ("lfm2-d1", "clef"):
        path = write_tiny_llama(folder / f"{name}.gguf", metadata={
            "llama.decision.type": name, "tokenizer.chat_template.systemone": SYSTEMONE,
            "llama.decision.temperature.choice.3_5": "1.15"})
        fleet = make_fleet(redis_url, folder, path, f"tiny-{name}")
        url = fleet.add_api()
        for route in ("/v1/models", "/models"):  # before any worker: read from the file
            card = httpx.get(f"{url}{route}", timeout=30).json()["data"][0]
            urls[f"{name}-offline{route}"] = json.dumps(card["architecture"])
        fleet.add_worker("-c", "2048", "-np", "2", "-t", "1", "-ub", "512")
        fleets.append(fleet)
        urls[name] = url
    for fleet, name in zip(fleets, ("lfm2-d1", "clef"), strict=True):
        fleet.wait_healthy(urls[name])
    yield urls
    for fleet in fleets:
        fleet.stop()


def ask(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}/v1/systemone", json=body, timeout=120)


@pytest.mark.parametrize("name", ["lfm2-d1", "clef"])
def test_a_family_is_a_decision_model_offline_and_loaded(families: dict[str, str],
                                                         name: str) -> None:
    expected = {"input_modalities": ["text"], "output_modalities": ["decisions"]}
    for route in ("/v1/models", "/models"):
        assert json.loads(families[f"{name}-offline{route}"]) == expected
        card = httpx.get(f"{families[name]}{route}", timeout=30).json()["data"][0]
        assert card["architecture"] == expected
    props = httpx.get(f"{families[name]}/props", timeout=30).json()["decisions"]
    assert props["mode"] == "native" and props["family"]["name"] == name
    assert props["max_options"] == 255 and props["temperatures"] == {"choice.3_5": 1.15}


def test_lfm2_d1_answers_with_a_null_state_and_serves_text(families: dict[str, str]) -> None:
    url = families["lfm2-d1"]
    response = ask(url, {"state": None, "questions": QUESTIONS})
    assert response.status_code == 200, response.text
    answers = response.json()["answers"]
    assert abs(sum(answers["route"]["probabilities"].values()) - 1) < 1e-6
    assert 0 <= answers["angry"]["noul"] <= 1
    completion = httpx.post(f"{url}/completion", json={"prompt": "the sky", "n_predict": 4},
                            timeout=60)
    assert completion.status_code == 200, completion.text


def test_clef_serves_only_systemone(families: dict[str, str]) -> None:
    url = families["clef"]
    for path, body in (("/completion", {"prompt": "the sky", "n_predict": 4}),
                       ("/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "hi"}]})):
        response = httpx.post(f"{url}{path}", json=body, timeout=60)
        assert response.status_code == 501, response.text
        assert "clef decision model, text generation is not available" in response.text


def test_clef_checks_a_request_then_says_why_it_cannot_answer(families: dict[str, str]) -> None:
    url = families["clef"]
    null = ask(url, {"state": None, "questions": QUESTIONS})
    assert null.status_code == 400 and '\\"state\\" must be provided' in null.text
    # all the questions in one batch: more than -ub 512 tokens is a 400 that says so
    long = ask(url, {"state": "the cat " * 300, "questions": QUESTIONS})
    assert long.status_code == 400 and "--ubatch-size (512)" in long.text, long.text
    short = ask(url, {"state": "a", "questions": {"angry": QUESTIONS["angry"]}})
    assert short.status_code == 501 and "clef answers from a decision head" in short.text
