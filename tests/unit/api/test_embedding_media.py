"""Embedding inputs with media read as llama-server reads them (api/media/embeddings.py): the
two forms, the order of its checks and its codes on this path (500 for what its handler does
not catch, 400 for its invalid_argument), small media inline and large ones by store key."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path
from typing import Any

import pytest

from api.endpoints.embeddings.protocol import EmbeddingsRequest
from api.media.embeddings import PendingMedia, resolve_inputs
from api.media.sources import MediaAccess
from api.net.policy import FetchPolicy
from scheduler.contract.errors import InvalidRequest, LlamaqError, ServerError
from scheduler.contract.jobs import MediaPromptInput
from scheduler.contract.media import MEDIA_INLINE_MAX
from scheduler.registry import ModelMeta
from storage.local import LocalStore

MARKER = "<__media_test__>"
PNG = b"\x89PNG\r\n\x1a\n" + b"x" * 100
B64 = base64.b64encode(PNG).decode()


def meta(vision: bool = True, audio: bool = False) -> ModelMeta:
    return ModelMeta(vocab_type=1, n_vocab=10, n_ctx_train=10, n_embd=4, n_params=1, size=1,
                     modalities={"vision": vision, "audio": audio, "video": False},
                     media_marker=MARKER if vision or audio else "")


def resolve(body: dict[str, Any], model: ModelMeta | None, tmp_path: Path) -> list[Any]:
    inputs = EmbeddingsRequest.model_validate(body).inputs
    return asyncio.run(resolve_inputs(inputs, model, LocalStore(tmp_path),
                                     MediaAccess(None, FetchPolicy())))


def error_of(body: dict[str, Any], model: ModelMeta | None, tmp_path: Path) -> LlamaqError:
    with pytest.raises(LlamaqError) as caught:
        resolve(body, model, tmp_path)
    return caught.value


def test_both_forms_become_a_prompt_with_the_models_marker(tmp_path: Path) -> None:
    body = {"input": [
        {"prompt_string": f"a {MARKER} b", "multimodal_data": [B64]},
        {"content": [{"type": "text", "text": "a "},
                     {"type": "image_url", "image_url": {"url": "data:image/png;base64," + B64}},
                     {"type": "text", "text": " b"}]},
        {"content": [{"type": "text", "text": "only "}, {"type": "text", "text": "text"}]},
        "plain"]}
    first, second, text, plain = resolve(body, meta(), tmp_path)
    assert isinstance(first, MediaPromptInput) and isinstance(second, MediaPromptInput)
    assert first == second
    assert first.prompt == f"a {MARKER} b" and first.marker == MARKER
    assert base64.b64decode(first.media[0].data or "") == PNG
    assert (text, plain) == ("only text", "plain")


def test_a_single_value_is_one_item_and_large_media_go_by_store_key(tmp_path: Path) -> None:
    big = PNG + b"y" * MEDIA_INLINE_MAX
    body = {"input": [{"prompt_string": f"{MARKER}", "multimodal_data": B64},
                      {"prompt_string": f"{MARKER}",
                       "multimodal_data": [base64.b64encode(big).decode()]}]}
    small, large = resolve(body, meta(), tmp_path)
    assert len(small.media) == 1 and small.media[0].data is not None
    assert large.media[0].data is None and large.media[0].store_key is not None
    assert (tmp_path / large.media[0].store_key).read_bytes() == big


@pytest.mark.parametrize(("body", "model", "kind", "message"), [
    ({"input": {"prompt_string": "x", "multimodal_data": [B64]}}, meta(False), ServerError,
     "Multimodal data provided, but model does not support multimodal requests."),
    ({"input": {"prompt_string": "x", "multimodal_data": []}}, None, ServerError,
     "Multimodal data provided, but model does not support multimodal requests."),
    ({"input": [{"content": [{"type": "image_url", "image_url": {"url": B64}}]}]}, meta(False),
     ServerError, "image input is not supported - hint: if this is unexpected, you may need "
                  "to provide the mmproj"),
    ({"input": [{"content": [{"type": "input_audio", "input_audio": {"data": B64}}]}]},
     meta(), ServerError, "audio input is not supported - hint: if this is unexpected, you "
                          "may need to provide the mmproj"),
    ({"input": [{"content": [{"type": "video_url", "video_url": {"url": B64}}]}]}, meta(),
     ServerError, "video input is not supported - hint: if this is unexpected, you may need "
                  "to provide the mmproj"),
    ({"input": {"prompt_string": [1, 2], "multimodal_data": [B64]}}, meta(), ServerError,
     "[json.exception.type_error.302] type must be string, but is array"),
    ({"input": {"prompt_string": "x", "multimodal_data": [3]}}, meta(), ServerError,
     "[json.exception.type_error.302] type must be string, but is number"),
    ({"input": {"prompt_string": f"x {MARKER}", "multimodal_data": []}}, meta(), ServerError,
     "Failed to tokenize prompt"),
    ({"input": [{"content": [{"type": "image_url", "image_url": {"url": "data:x,AA"}}]}]},
     meta(), InvalidRequest, "Invalid uri format: data:x"),
    ({"input": [{"content": [{"type": "image_url", "image_url": {"url": "file://a.png"}}]}]},
     meta(), InvalidRequest, "file:// URLs are not allowed unless --media-path is specified"),
])
def test_refusals_are_llama_servers(body: dict[str, Any], model: ModelMeta | None,
                                    kind: type[LlamaqError], message: str,
                                    tmp_path: Path) -> None:
    error = error_of(body, model, tmp_path)
    assert type(error) is kind
    assert error.message == message


def test_a_part_of_another_type_is_refused_while_the_body_is_read() -> None:
    for part in ({"type": "image"}, {"text": "no type"}, "text"):
        with pytest.raises(InvalidRequest, match=r"unsupported content\[\]\.type"):
            EmbeddingsRequest.model_validate({"input": [{"content": [part]}]})
    pending = EmbeddingsRequest.model_validate(
        {"input": {"prompt_string": "x", "multimodal_data": 1}}).inputs
    assert pending == [PendingMedia(prompt="x", multimodal_data=[1])]


def test_media_items_are_bounded_per_request(tmp_path: Path) -> None:
    from scheduler.contract.media import MAX_MEDIA_ITEMS

    item = {"prompt_string": MARKER * 4, "multimodal_data": [B64] * 4}
    body = {"input": [item] * (MAX_MEDIA_ITEMS // 4) + [{"content": [
        {"type": "image_url", "image_url": {"url": B64}}]}]}
    error = error_of(body, meta(), tmp_path)
    assert type(error) is InvalidRequest
    assert error.message == f"too many media items: {MAX_MEDIA_ITEMS + 1} (at most " \
                            f"{MAX_MEDIA_ITEMS})"
    assert len(resolve({"input": [item] * (MAX_MEDIA_ITEMS // 4)}, meta(), tmp_path)) \
        == MAX_MEDIA_ITEMS // 4
