"""/health, /models, /tokenize and /detokenize through the real fleet."""

from __future__ import annotations

import re

import httpx
import pytest


def test_health_ok(api: str) -> None:
    for path in ("/health", "/v1/health"):
        response = httpx.get(f"{api}{path}")
        assert response.status_code == 200 and response.json() == {"status": "ok"}


@pytest.mark.parametrize("path", ["/v1/models", "/models"])
def test_models_list_the_model_with_its_metadata(api: str, path: str) -> None:
    body = httpx.get(f"{api}{path}").json()
    assert body["object"] == "list"
    (card,) = body["data"]
    assert card["id"] == "gemma" and card["object"] == "model"
    assert card["owned_by"] == "llamacpp" and isinstance(card["created"], int)
    assert card["architecture"] == {"input_modalities": ["text"], "output_modalities": ["text"]}
    meta = card["meta"]
    assert meta["n_vocab"] == 262144 and meta["n_ctx_train"] == 32768
    assert meta["n_params"] > 0 and meta["size"] > 0 and meta["n_embd"] == 640
    assert meta["ftype"] == "Q4_K - Medium"  # as llama-server (it was missing)


def test_props_chat_template_is_the_one_in_use(api: str) -> None:
    """Gemma 3 270M's GGUF has no template: llama-server shows llama.cpp's chatml source that
    it uses (it was "": llama.cpp's web UI reads it for thinking and the model's info)."""
    template = httpx.get(f"{api}/props").json()["chat_template"]
    assert template.startswith("{%- for message in messages -%}\n")
    assert "'<|im_start|>assistant\n' -}}" in template


def test_props_media_marker_of_a_text_only_model(api: str) -> None:
    """llama-server answers its media marker (random per process, or LLAMA_MEDIA_MARKER)
    whether or not a projector is loaded; a text-only model's was "" here."""
    props = httpx.get(f"{api}/props").json()
    assert props["modalities"] == {"vision": False, "video": False, "audio": False}
    assert re.fullmatch(r"<__media_[A-Za-z0-9]{32}__>", props["media_marker"]), props


def test_tokenize_detokenize_round_trip(api: str) -> None:
    text = "Hello world, ça va? 你好"
    tokens = httpx.post(f"{api}/tokenize", json={"content": text}).json()["tokens"]
    assert tokens and all(isinstance(t, int) for t in tokens)
    assert httpx.post(f"{api}/detokenize", json={"tokens": tokens}).json() == {"content": text}


def test_tokenize_add_special_adds_bos(api: str) -> None:
    plain = httpx.post(f"{api}/tokenize", json={"content": "Hi"}).json()["tokens"]
    special = httpx.post(f"{api}/tokenize", json={"content": "Hi", "add_special": True}).json()
    assert special["tokens"] == [2, *plain]  # Gemma's <bos> is token 2


def test_tokenize_parse_special(api: str) -> None:
    parsed = httpx.post(f"{api}/tokenize", json={"content": "<bos>"}).json()["tokens"]
    literal = httpx.post(f"{api}/tokenize",
                         json={"content": "<bos>", "parse_special": False}).json()["tokens"]
    assert parsed == [2] and literal != [2]


def test_tokenize_with_pieces(api: str) -> None:
    body = httpx.post(f"{api}/tokenize", json={"content": "Hello world",
                                               "with_pieces": True}).json()
    assert body["tokens"] == [{"id": 9259, "piece": "Hello"}, {"id": 1902, "piece": " world"}]


def test_pieces_that_are_not_valid_utf8_are_byte_lists(api: str) -> None:
    # A character outside Gemma's vocabulary falls back to one token per UTF-8 byte.
    text = "\U0001fae8"
    body = httpx.post(f"{api}/tokenize", json={"content": text, "with_pieces": True}).json()
    pieces = [t["piece"] for t in body["tokens"]]
    byte_pieces = [p for p in pieces if isinstance(p, list)]
    assert byte_pieces, pieces
    assert bytes(b for p in byte_pieces for b in p) == text.encode()


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/tokenize", {}),
        ("/tokenize", {"content": 5}),
        ("/tokenize", {"content": "x", "with_pieces": "yes"}),
        ("/detokenize", {"tokens": "abc"}),
        ("/detokenize", {"tokens": [1, "a"]}),
    ],
)
def test_bad_tokenize_bodies_are_400(api: str, path: str, body: dict[str, object]) -> None:
    response = httpx.post(f"{api}{path}", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("path", ["/embedding", "/v1/embeddings", "/rerank", "/v1/rerank"])
def test_features_not_built_answer_501(api: str, path: str) -> None:
    """/v1/systemone checks its body first (400), then answers 501: see test_bad_input."""
    response = httpx.post(f"{api}{path}", json={"input": "x"})
    assert response.status_code == 501
    assert response.json()["error"]["type"] == "not_supported_error"


def test_lora_adapters_and_props_post(api: str) -> None:
    """No adapter loaded: an empty list, and ids that are not loaded are ignored (llama-server);
    the LoRA fleet is tests/fleet/adapters/test_lora_fleet.py."""
    assert httpx.get(f"{api}/lora-adapters").json() == []
    response = httpx.post(f"{api}/lora-adapters", json=[{"id": 0, "scale": 1}])
    assert response.status_code == 200 and response.json() == {"success": True}
    assert httpx.post(f"{api}/props", json={}).status_code == 501


def test_stopping_a_stream_frees_its_slot_at_once(api: str) -> None:
    """DELETE /v1/streams/{id} (ours) with an event id of the stream: its job ends now, not
    after the grace a dropped client gets for a resume; an unknown id is a 404."""
    body = {"prompt": "Count: 1, 2,", "n_predict": 2000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{api}/completion", json=body, timeout=60) as response:
        n_data = 0
        for line in response.iter_lines():  # the stream ends well before 2000 tokens
            n_data += line.startswith("data:")
            if line.startswith("id:") and n_data == 1:
                stopped = httpx.delete(f"{api}/v1/streams/{line[3:].strip()}", timeout=10)
                assert stopped.status_code == 200, stopped.text
                assert stopped.json()["stopped"] == 1
    assert 1 <= n_data < 1000
    missing = httpx.delete(f"{api}/v1/streams/nosuchstream", timeout=10)
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "not_found_error"


def test_a_tiny_sse_ping_interval_is_a_400(api: str) -> None:
    body = {"prompt": "Hi", "n_predict": 2, "stream": True, "sse_ping_interval": 1e-9}
    response = httpx.post(f"{api}/completion", json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and "sse_ping_interval" in error["message"]
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "stream": True,
            "sse_ping_interval": -5}
    response = httpx.post(f"{api}/v1/chat/completions", json=chat, timeout=60)
    assert response.status_code == 400 and "sse_ping_interval" in response.text
