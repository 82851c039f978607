"""Images through the slot engine in-process: Gemma 3 270M with the tiny gemma3 projector
(tests/tiny_mmproj.py), llama.cpp's real mtmd path (decode, preprocess, encode, embed into the
slot's KV cache). No Redis, no api. What the model says means nothing (random projector);
what is checked is the path: token counts with the media chunks, the prompt cache by media
hash, media beside text-only slots, and bad bytes as the request's 400, never a dead engine."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from scheduler.contract.errors import InvalidRequest
from scheduler.contract.jobs import CompletionJob, SamplingParams, SamplingSettings
from scheduler.contract.media import MediaRef
from scheduler.contract.results import CompletionResult, FinalEvent, TokenEvent
from tests.media_files import png
from tests.worker.engine.test_engine_tiny import Events
from worker.engine.loop import Engine
from worker.engine.requests import EngineDefaults
from worker.runtime.media import LOAD_FAILED, Projector, ProjectorOptions, media_marker
from worker.runtime.model import ContextPlan, LoadedModel

MARKER = "<__media_test__>"
IMAGE_TOKENS = 16  # the tiny projector: (224 / 14 / 4)²
GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def model(gemma_path: Path, tiny_mmproj_path: Path) -> Iterator[LoadedModel]:
    plan = ContextPlan(n_ctx=4096, n_slots=2, kv_unified=False, n_batch=512, n_ubatch=512,
                       n_threads=1, n_threads_batch=1, swa_full=True, flash_attn="auto",
                       cache_type_k="f16", cache_type_v="f16")
    loaded = LoadedModel(gemma_path, plan)
    assert loaded.model is not None
    loaded.projector = Projector(str(tiny_mmproj_path), loaded.model,
                                 ProjectorOptions(offload=False, n_threads=1),
                                 media_marker({}))
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def engine(model: LoadedModel) -> Iterator[tuple[Engine, Events]]:
    events = Events()
    defaults = EngineDefaults(sampling=SamplingSettings(seed=1), n_predict=-1, n_keep=0,
                              cache_prompt=True, special=False, model_alias="gemma",
                              worker_id="w-media")
    engine = Engine(model, defaults, events.sink)
    engine.start()
    yield engine, events
    engine.stop()


def chat_prompt(*turns: str) -> str:
    return "".join(f"<start_of_turn>user\n{t}<end_of_turn>\n<start_of_turn>model\n"
                   for t in turns)


def media_job(prompt: str, images: list[bytes], n_predict: int = 4,
              **fields: object) -> CompletionJob:
    return CompletionJob(model="gemma", prompt=prompt, n_predict=n_predict, sampling=GREEDY,
                         media=[MediaRef.inline(i) for i in images], media_marker=MARKER,
                         **fields)  # type: ignore[arg-type]


def run(engine: tuple[Engine, Events], job: CompletionJob,
        images: list[bytes]) -> CompletionResult:
    eng, events = engine
    eng.submit(eng.prepare(job, media=images))
    final = events.until_done([job.job_id])[job.job_id][-1]
    assert isinstance(final, FinalEvent), final
    assert isinstance(final.result, CompletionResult)
    return final.result


def test_the_projector_loads_and_reports_vision(model: LoadedModel) -> None:
    assert model.projector is not None
    assert model.projector.modalities() == {"vision": True, "audio": False, "video": True}
    marker = model.projector.marker
    assert marker.startswith("<__media_") and marker.endswith("__>") and len(marker) == 44
    assert media_marker({"LLAMA_MEDIA_MARKER": "<img>"}) == "<img>"
    meta = model.meta()
    assert meta.modalities["vision"] and meta.media_marker == marker


def test_an_image_is_encoded_into_the_prompt(engine: tuple[Engine, Events],
                                             model: LoadedModel) -> None:
    image = png(64, 48, seed=1)
    text_only = run(engine, CompletionJob(model="gemma", prompt=chat_prompt("Look:  what?"),
                                          n_predict=4, sampling=GREEDY), [])
    assert model.projector is not None
    before = model.projector.n_encoded
    result = run(engine, media_job(chat_prompt(f"Look: {MARKER} what?"), [image]), [image])
    assert model.projector.n_encoded == before + 1
    # the image's tokens and <start_of_image>/<end_of_image> around them count as prompt
    assert result.tokens_evaluated >= text_only.tokens_evaluated + IMAGE_TOKENS
    assert result.tokens_predicted == 4


def test_a_repeated_image_is_not_encoded_again(engine: tuple[Engine, Events],
                                               model: LoadedModel) -> None:
    """The second turn of a chat repeating the image: the slot's cache holds the image's
    chunk (matched by its SHA-256), so only the new text is evaluated."""
    assert model.projector is not None
    image = png(300, 200, seed=2)
    first_prompt = chat_prompt(f"{MARKER} describe")
    first = run(engine, media_job(first_prompt, [image], id_slot=1), [image])
    encoded, decoded = model.projector.n_encoded, model.projector.n_decoded
    second_prompt = first_prompt + "a picture<end_of_turn>\n" + chat_prompt("and the colours?")
    t0 = time.perf_counter()
    second = run(engine, media_job(second_prompt, [image], id_slot=1), [image])
    assert (model.projector.n_encoded, model.projector.n_decoded) == (encoded, decoded)
    assert second.timings.cache_n >= first.tokens_evaluated - 1
    assert second.timings.prompt_n < second.tokens_evaluated - IMAGE_TOKENS
    other = png(300, 200, seed=3)  # another image at the same place is evaluated
    third = run(engine, media_job(second_prompt, [other], id_slot=1), [other])
    assert (model.projector.n_encoded, model.projector.n_decoded) == (encoded + 1, decoded + 1)
    assert third.timings.cache_n < first.tokens_evaluated - IMAGE_TOKENS
    print(f"second turn: {time.perf_counter() - t0:.3f} s, prompt_ms "
          f"{second.timings.prompt_ms:.1f} (first {first.timings.prompt_ms:.1f})")


def test_an_image_seen_on_another_slot_is_decoded_not_encoded(
        engine: tuple[Engine, Events], model: LoadedModel) -> None:
    """The embeddings are kept by media hash: another slot decodes them without the encoder."""
    assert model.projector is not None
    image = png(50, 70, seed=21)
    run(engine, media_job(chat_prompt(f"{MARKER} one"), [image], id_slot=0), [image])
    encoded, decoded = model.projector.n_encoded, model.projector.n_decoded
    run(engine, media_job(chat_prompt(f"other words first {MARKER} two"), [image], id_slot=1),
        [image])
    assert (model.projector.n_encoded, model.projector.n_decoded) == (encoded, decoded + 1)


def test_media_beside_a_text_slot(engine: tuple[Engine, Events]) -> None:
    """A request with 4 images while another slot generates: both end, the text one with all
    its tokens."""
    eng, events = engine
    text = CompletionJob(model="gemma", prompt=chat_prompt("count to ten"), n_predict=32,
                         sampling=GREEDY, stream=True)
    eng.submit(eng.prepare(text))
    images = [png(96, 96, seed=10 + i) for i in range(4)]
    four = media_job(chat_prompt(" ".join([MARKER] * 4) + " compare"), images)
    eng.submit(eng.prepare(four, media=images))
    done = events.until_done([text.job_id, four.job_id])
    tokens = [t for e in done[text.job_id] if isinstance(e, TokenEvent) for t in e.tokens]
    assert len(tokens) == 32
    final = done[four.job_id][-1]
    assert isinstance(final, FinalEvent) and isinstance(final.result, CompletionResult)
    assert final.result.tokens_evaluated > 4 * IMAGE_TOKENS


def test_markers_and_media_must_match(engine: tuple[Engine, Events]) -> None:
    eng, _ = engine
    image = png(16, 16)
    with pytest.raises(InvalidRequest, match="number of media markers"):
        eng.prepare(media_job(chat_prompt("no marker"), [image]), media=[image])


FUZZ_CASES = int(os.environ.get("LLAMAQ_MEDIA_FUZZ_CASES", "200"))


def test_bad_bytes_are_the_requests_error_and_the_engine_lives(
        engine: tuple[Engine, Events]) -> None:
    """200 truncated, bit-flipped and random buffers through the decoders: each one a 400
    "Failed to load image or audio file" (or, rarely, an image that still decodes), and the
    engine answers afterwards."""
    eng, _ = engine
    rng = np.random.default_rng(28)
    good = png(40, 30, seed=4)
    cases: list[bytes] = [b"", b"\x89PNG", b"RIFF\x00\x00\x00\x00WAVEfmt ", b"ID3\x03"]
    while len(cases) < FUZZ_CASES:
        kind = len(cases) % 3
        if kind == 0:
            cases.append(good[: int(rng.integers(1, len(good)))])
        elif kind == 1:
            flipped = bytearray(good)
            for at in rng.integers(0, len(good), 8):
                flipped[at] ^= int(rng.integers(1, 256))
            cases.append(bytes(flipped))
        else:
            cases.append(rng.integers(0, 256, int(rng.integers(1, 2048)),
                                      dtype=np.uint8).tobytes())
    refused = 0
    for data in cases:
        try:
            request = eng.prepare(media_job(chat_prompt(f"{MARKER} ?"), [data]), media=[data])
        except InvalidRequest as error:
            assert str(error) in (LOAD_FAILED, "video input is not supported")
            refused += 1
        else:
            request.sampler.free()
    assert refused >= len(cases) * 0.6
    image = png(32, 32, seed=5)
    assert run(engine, media_job(chat_prompt(f"{MARKER} ok"), [image]), [image]) \
        .tokens_predicted == 4
