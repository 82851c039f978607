"""The plain rules behind issue 14's points: Vertex AI request formats, --host lists, model
cards with aliases and tags, --verbose."""

from __future__ import annotations

import pytest

from api.endpoints.native.render import model_card, verbose_partial_json
from api.endpoints.vertex.api_router import VertexSettings, request_format
from api.settings import ApiSettings
from llamaq.processes import listen_hosts
from scheduler.contract.results import PromptProgress, Timings, TokenEvent


@pytest.mark.parametrize(("path", "alias"), [
    ("/v1/chat/completions", "chatCompletions"),
    ("/chat/completions", "chatCompletions"),
    ("/apply-template", "applyTemplate"),
    ("/v1/messages/count_tokens", "messagesCountTokens"),
    ("/completion", "completion"),
    ("/slots/<id_slot>", "slots"),
    ("/v1", "v1"),
])
def test_request_format_aliases(path: str, alias: str) -> None:
    assert request_format(path) == alias


def test_vertex_settings_from_the_environment() -> None:
    assert not VertexSettings.from_env({}).enabled
    assert not VertexSettings.from_env({"AIP_MODE": "TRAINING"}).enabled
    vertex = VertexSettings.from_env({"AIP_MODE": "PREDICTION", "AIP_PREDICT_ROUTE": "run",
                                      "AIP_HEALTH_ROUTE": "/ok", "AIP_HTTP_PORT": "9000"})
    assert vertex == VertexSettings(enabled=True, health_route="/ok", predict_route="/run",
                                    port=9000)
    defaults = VertexSettings.from_env({"AIP_MODE": "PREDICTION", "AIP_PREDICT_ROUTE": ""})
    assert (defaults.predict_route, defaults.port, defaults.health_route) == ("/predict",
                                                                              8080, "")


def test_host_lists() -> None:
    assert listen_hosts("127.0.0.1") == ["127.0.0.1"]
    assert listen_hosts("127.0.0.1, ::1,/run/x.sock") == ["127.0.0.1", "::1", "/run/x.sock"]
    with pytest.raises(SystemExit):
        listen_hosts(" , ")


def test_model_card_aliases_and_tags_are_sorted_sets() -> None:
    card = model_card("b", 1, None, None, aliases=["b", "a", "b"], tags=["y", "x"])
    assert card["aliases"] == ["a", "b"] and card["tags"] == ["x", "y"]
    assert model_card("m", 1, None, None)["aliases"] == []


def test_verbose_and_tags_flags() -> None:
    settings = ApiSettings.from_args(["-v", "--tags", "b,a"], environ={})
    assert settings.verbose and settings.tags == ["b", "a"]
    assert settings.debug_responses() and settings.verbosity() > 9
    quiet = ApiSettings.from_args([], environ={"LLAMA_ARG_TAGS": "t"})
    assert not quiet.debug_responses() and quiet.tags == ["t"]
    assert ApiSettings.from_args(["-lv", "10"], environ={}).debug_responses()


def test_verbose_partial_is_the_native_partial() -> None:
    event = TokenEvent(content="a", tokens=[5], n_decoded=3, n_prompt_tokens=7,
                       timings=Timings(predicted_n=3),
                       progress=PromptProgress(total=7, cache=0, processed=7, time_ms=1))
    data = verbose_partial_json(event, 2)
    assert data["index"] == 2 and data["stop"] is False and data["id_slot"] == -1
    assert (data["tokens_predicted"], data["tokens_evaluated"]) == (3, 7)
    assert data["timings"]["predicted_n"] == 3 and data["prompt_progress"]["total"] == 7
