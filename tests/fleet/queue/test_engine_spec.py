"""llama-server behaviours of the completion engine, on the tiny GGUF: ignore_eos's bans,
generation_settings as it ran (n_probs, logit_bias, n_discard), /completion's aliases, null as
the default, n_discard in a context shift, chat_template_caps in /props."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import make_fleet
from tests.processes import Fleet

EOS = 2  # </s> in tests/tiny_gguf.py
GREEDY = {"temperature": 0.0, "seed": 1}


@pytest.fixture(scope="module")
def api(tiny_fleet: Fleet) -> str:
    return tiny_fleet.api_urls[0]


def complete(api: str, body: dict[str, object]) -> dict[str, object]:
    response = httpx.post(f"{api}/completion", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def test_ignore_eos_bans_every_end_of_generation_token(api: str) -> None:
    body = {"prompt": "hello world", "n_predict": 8, **GREEDY, "return_tokens": True,
            "logit_bias": [[EOS, 50.0]]}
    assert complete(api, body)["stop_type"] == "eos"  # the bias makes EOS the likeliest
    body["ignore_eos"] = True
    result = complete(api, body)
    assert result["tokens_predicted"] == 8 and result["stop_type"] == "limit"
    assert EOS not in result["tokens"]  # type: ignore[operator]  # banned, not sampled
    biases = result["generation_settings"]["logit_bias"]  # type: ignore[index]
    assert {"bias": 50.0, "token": EOS} in biases
    assert {"bias": None, "token": EOS} in biases  # -inf, written as null like llama-server


def test_generation_settings_report_n_probs(api: str) -> None:
    result = complete(api, {"prompt": "hello", "n_predict": 2, "n_probs": 3})
    assert result["generation_settings"]["n_probs"] == 3  # type: ignore[index]


@pytest.mark.parametrize(("alias", "value", "field", "expected"), [
    ("max_tokens", 3, "n_predict", 3),
    ("max_completion_tokens", 4, "n_predict", 4),
    ("logprobs", 2, "n_probs", 2),
])
def test_completion_reads_llama_servers_aliases(api: str, alias: str, value: int, field: str,
                                                 expected: int) -> None:
    result = complete(api, {"prompt": "hello", "ignore_eos": True, alias: value})
    assert result["generation_settings"][field] == expected  # type: ignore[index]
    if field == "n_predict":
        assert result["tokens_predicted"] == expected
    else:
        assert all(len(p["top_logprobs"]) == expected  # type: ignore[index]
                   for p in result["completion_probabilities"])  # type: ignore[attr-defined]


def test_the_field_wins_over_its_alias(api: str) -> None:
    result = complete(api, {"prompt": "hello", "ignore_eos": True, "n_predict": 2,
                            "max_tokens": 5})
    assert result["tokens_predicted"] == 2


def test_n_is_n_cmpl(api: str) -> None:
    results = httpx.post(f"{api}/completion", json={"prompt": "hello", "n_predict": 2, "n": 2},
                         timeout=120).json()
    assert [r["index"] for r in results] == [0, 1]


def test_null_means_the_default(api: str) -> None:
    result = complete(api, {"prompt": "hello", "n_predict": None, "stream": None,
                            "temperature": None, "stop": None, "n_probs": None,
                            "samplers": None, "ignore_eos": True})
    settings = result["generation_settings"]
    assert settings["n_predict"] == 16  # type: ignore[index]  # the fleet's -n
    assert settings["temperature"] == 0.8  # type: ignore[index]
    tokens = httpx.post(f"{api}/tokenize", json={"content": "hello", "with_pieces": None},
                        timeout=30)
    assert tokens.status_code == 200


def test_n_discard_is_reported_and_range_checked(api: str) -> None:
    result = complete(api, {"prompt": "hello", "n_predict": 1, "n_discard": 5})
    assert result["generation_settings"]["n_discard"] == 5  # type: ignore[index]
    bad = httpx.post(f"{api}/completion", json={"prompt": "hello", "n_discard": -1}, timeout=30)
    assert bad.status_code == 400 and "n_discard" in bad.json()["error"]["message"]


@pytest.fixture(scope="module")
def shifting(redis_url: str, workdir: Path, tiny_model_path: Path) -> Iterator[str]:
    fleet = make_fleet(redis_url, workdir, tiny_model_path, "tiny-shift")
    fleet.add_worker("-c", "64", "-np", "1", "-t", "2", "--context-shift", "--ignore-eos")
    url = fleet.add_api()
    fleet.wait_healthy(url)
    yield url
    fleet.stop()


def test_n_discard_sets_how_much_a_context_shift_drops(shifting: str) -> None:
    first = complete(shifting, {"prompt": "hi", "n_predict": 1})
    assert first["tokens_predicted"] == 1
    n_ctx: int = httpx.get(f"{shifting}/props").json()["default_generation_settings"]["n_ctx"]
    body = {"prompt": "hello world", "n_predict": n_ctx * 2 - 20, "ignore_eos": True,
            **GREEDY, "n_keep": 0}
    halved = complete(shifting, body)
    one_by_one = complete(shifting, {**body, "n_discard": 1})
    assert halved["truncated"] is True and one_by_one["truncated"] is True
    assert one_by_one["tokens_cached"] >= n_ctx - 3  # type: ignore[operator]
    assert halved["tokens_cached"] < one_by_one["tokens_cached"]  # type: ignore[operator]


def test_ignore_eos_as_a_flag_shows_its_bans_in_the_defaults(shifting: str) -> None:
    props = httpx.get(f"{shifting}/props", timeout=30).json()
    params = props["default_generation_settings"]["params"]
    assert params["ignore_eos"] is True  # (its short form has no logit_bias, as llama-server's)
    ran = complete(shifting, {"prompt": "hello", "n_predict": 2})["generation_settings"]
    assert {"bias": None, "token": EOS} in ran["logit_bias"]  # type: ignore[index]


def test_props_report_the_templates_capabilities(api: str) -> None:
    caps = httpx.get(f"{api}/props", timeout=30).json()["chat_template_caps"]
    assert caps == {
        "supports_string_content": True, "supports_typed_content": False,
        "supports_tools": False, "supports_tool_calls": False,
        "supports_parallel_tool_calls": False, "supports_system_role": True,
        "supports_preserve_reasoning": False, "supports_reasoning_effort": False,
        "supports_object_arguments": False,
    }
