"""M-RoPE media (Qwen2-VL and kin) through the slot engine in-process: the tiny `qwen2vl`
text model and `qwen2vl_merger` projector (tests/tiny_qwen2vl.py), llama.cpp's real mtmd path.
An image's chunk holds nx × ny tokens but takes max(nx, ny) positions; what is checked is that
the text after it goes on from there (the KV cache's positions), that prompt token counts
hold the image's tokens, that a second turn repeating the image reuses the slot's cache and
gives what a fresh evaluation gives, and that what llama-server disables with media stays
off (context shift)."""

from __future__ import annotations

from collections.abc import Iterator

import llama_cpp as lc
import numpy as np
import pytest

from scheduler.contract.errors import ExceedContextSize, InvalidRequest
from scheduler.contract.jobs import CompletionJob, SamplingParams, SamplingSettings
from scheduler.contract.media import MediaRef
from scheduler.contract.results import CompletionResult, FinalEvent
from tests.media_files import mp4, png
from tests.tiny_qwen2vl import write_tiny_qwen2vl, write_tiny_qwen2vl_mmproj
from tests.worker.engine.test_engine_tiny import Events
from worker.engine.loop import Engine
from worker.engine.requests import EngineDefaults
from worker.process.startup import load_model
from worker.runtime.media import LOAD_FAILED, Projector, ProjectorOptions, media_marker
from worker.runtime.model import ContextPlan, LoadedModel
from worker.runtime.settings import WorkerSettings

MARKER = "<__media_test__>"
GREEDY = SamplingParams(temperature=0.0, ignore_eos=True)
VIDEO = pytest.mark.process
"""The video tests start ffmpeg (to write the video, and mtmd's helper to read it): not in
the fast lane (tests/lanes.py)."""


@pytest.fixture(scope="module", params=[False, True], ids=["qwen2vl", "qwen25vl"])
def model(request: pytest.FixtureRequest,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoadedModel]:
    folder = tmp_path_factory.mktemp("qwen2vl")
    text = write_tiny_qwen2vl(folder / "model.gguf")
    mmproj = write_tiny_qwen2vl_mmproj(folder / "mmproj.gguf", qwen25=request.param)
    plan = ContextPlan(n_ctx=4096, n_slots=2, kv_unified=False, n_batch=512, n_ubatch=512,
                       n_threads=1, n_threads_batch=1, swa_full=True, flash_attn="auto",
                       cache_type_k="f16", cache_type_v="f16")
    loaded = LoadedModel(text, plan)
    assert loaded.model is not None
    loaded.projector = Projector(str(mmproj), loaded.model,
                                 ProjectorOptions(offload=False, n_threads=1), media_marker({}))
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def engine(model: LoadedModel) -> Iterator[tuple[Engine, Events]]:
    events = Events()
    defaults = EngineDefaults(sampling=SamplingSettings(seed=1), n_predict=-1, n_keep=0,
                              cache_prompt=True, special=False, model_alias="qwen",
                              worker_id="w-mrope")
    engine = Engine(model, defaults, events.sink)
    engine.start()
    yield engine, events
    engine.stop()


def chat_prompt(*turns: str) -> str:
    return "".join(f"<|im_start|>user\n{t}<|im_end|>\n<|im_start|>assistant\n" for t in turns)


def media_job(prompt: str, images: list[bytes], n_predict: int = 6,
              **fields: object) -> CompletionJob:
    return CompletionJob(model="qwen", prompt=prompt, n_predict=n_predict, sampling=GREEDY,
                         return_tokens=True, media=[MediaRef.inline(i) for i in images],
                         media_marker=MARKER,
                         **fields)  # type: ignore[arg-type]


def run(engine: tuple[Engine, Events], job: CompletionJob,
        images: list[bytes]) -> CompletionResult:
    eng, events = engine
    eng.submit(eng.prepare(job, media=images))
    final = events.until_done([job.job_id])[job.job_id][-1]
    assert isinstance(final, FinalEvent), final
    assert isinstance(final.result, CompletionResult)
    return final.result


def pos_max(model: LoadedModel, slot: int) -> int:
    return int(lc.llama_memory_seq_pos_max(model.memory, slot))


def test_an_image_chunk_takes_fewer_positions_than_tokens(model: LoadedModel) -> None:
    assert model.projector is not None
    assert model.projector.modalities()["vision"]
    image = png(100, 60, seed=1)
    prompt = model.projector.tokenize(chat_prompt(f"Look: {MARKER} what?"), MARKER, [image],
                                      add_special=False)
    (span,) = prompt.spans
    assert prompt.mrope and 0 < span.n_pos < span.n_tokens
    assert span.pos == span.start  # text only before it
    end = len(prompt.tokens)
    assert prompt.pos_of(end) == end - (span.n_tokens - span.n_pos)
    assert prompt.pos_of(span.start) == span.start


def test_text_after_an_image_goes_on_from_its_positions(
        engine: tuple[Engine, Events], model: LoadedModel) -> None:
    """The KV cache's last position is the prompt's and the generated tokens' positions
    counted as llama-server counts them (n_pos per chunk), not their token count."""
    assert model.projector is not None
    image = png(300, 120, seed=2)
    prompt = chat_prompt(f"Look: {MARKER} what?")
    text_only = run(engine, CompletionJob(model="qwen", prompt=chat_prompt("Look:  what?"),
                                          n_predict=6, sampling=GREEDY, id_slot=0), [])
    before = model.projector.n_encoded
    result = run(engine, media_job(prompt, [image], id_slot=0), [image])
    assert model.projector.n_encoded == before + 1
    tokenized = model.projector.tokenize(prompt, MARKER, [image], add_special=False)
    (span,) = tokenized.spans
    n_all = len(tokenized.tokens) + result.tokens_predicted
    # the prompt's count holds the image's tokens (usage, timings, tokens_evaluated)
    assert result.tokens_evaluated == len(tokenized.tokens)
    assert result.tokens_evaluated >= text_only.tokens_evaluated + span.n_tokens
    assert result.timings.prompt_n + result.timings.cache_n == len(tokenized.tokens)
    # the last generated token is not decoded: its position would be the next one
    assert pos_max(model, 0) == tokenized.pos_of(n_all - 1) - 1
    assert pos_max(model, 0) < n_all - 2


def test_a_second_turn_reuses_the_image_and_answers_as_a_fresh_prompt(
        engine: tuple[Engine, Events], model: LoadedModel) -> None:
    assert model.projector is not None
    image = png(90, 120, seed=3)
    first_prompt = chat_prompt(f"{MARKER} describe")
    first = run(engine, media_job(first_prompt, [image], id_slot=1), [image])
    encoded, decoded = model.projector.n_encoded, model.projector.n_decoded
    second_prompt = first_prompt + first.content + "<|im_end|>\n" + chat_prompt("and colours?")
    second = run(engine, media_job(second_prompt, [image], id_slot=1), [image])
    assert (model.projector.n_encoded, model.projector.n_decoded) == (encoded, decoded)
    assert second.timings.cache_n >= first.tokens_evaluated
    assert second.timings.prompt_n == second.tokens_evaluated - second.timings.cache_n
    tokenized = model.projector.tokenize(second_prompt, MARKER, [image], add_special=False)
    assert pos_max(model, 1) == tokenized.pos_of(len(tokenized.tokens)
                                                 + second.tokens_predicted - 1) - 1
    # the same prompt evaluated whole on the other slot gives the same tokens
    fresh = run(engine, media_job(second_prompt, [image], id_slot=0, cache_prompt=False),
                [image])
    assert fresh.timings.cache_n == 0
    assert fresh.tokens == second.tokens and fresh.content == second.content
    # a cut of the cache inside the text after the image keeps the image (positions by pos)
    third_prompt = first_prompt + "something else<|im_end|>\n" + chat_prompt("more?")
    third = run(engine, media_job(third_prompt, [image], id_slot=1), [image])
    assert model.projector.n_decoded == decoded + 1  # the fresh one only
    again = run(engine, media_job(third_prompt, [image], id_slot=0, cache_prompt=False),
                [image])
    assert third.tokens == again.tokens
    assert third.timings.cache_n > 0


def test_two_images_and_an_image_beside_a_text_slot(
        engine: tuple[Engine, Events], model: LoadedModel) -> None:
    eng, events = engine
    text = CompletionJob(model="qwen", prompt=chat_prompt("count to ten"), n_predict=24,
                         sampling=GREEDY, stream=True, id_slot=0)
    eng.submit(eng.prepare(text))
    images = [png(60, 60, seed=10), png(120, 40, seed=11)]
    prompt = chat_prompt(f"{MARKER} and {MARKER} compare")
    two = media_job(prompt, images, id_slot=1)
    eng.submit(eng.prepare(two, media=images))
    done = events.until_done([text.job_id, two.job_id])
    text_final, two_final = done[text.job_id][-1], done[two.job_id][-1]
    assert isinstance(text_final, FinalEvent) and isinstance(two_final, FinalEvent)
    assert isinstance(two_final.result, CompletionResult)
    assert model.projector is not None
    tokenized = model.projector.tokenize(prompt, MARKER, images, add_special=False)
    first, second = tokenized.spans
    assert second.pos == first.pos + first.n_pos + (second.start - first.end)
    n_all = len(tokenized.tokens) + two_final.result.tokens_predicted
    assert pos_max(model, 1) == tokenized.pos_of(n_all - 1) - 1
    alone = run(engine, media_job(prompt, images, id_slot=1, cache_prompt=False), images)
    assert alone.tokens == two_final.result.tokens


def test_an_image_prompt_comes_back_from_the_host_cache(model: LoadedModel) -> None:
    """--cache-ram with M-RoPE slots: an image prompt that a text prompt pushed out of its slot
    is saved to host memory, and its second turn restores it (the image neither encoded nor
    decoded again), goes on from the image's positions, and answers as a fresh evaluation."""
    assert model.projector is not None
    events = Events()
    defaults = EngineDefaults(sampling=SamplingSettings(seed=1), n_predict=-1, n_keep=0,
                              cache_prompt=True, special=False, model_alias="qwen",
                              worker_id="w-mrope-ram", cache_ram_mib=64)
    eng = Engine(model, defaults, events.sink)
    eng.start()
    try:
        engine = (eng, events)
        image = png(100, 80, seed=21)
        first_prompt = chat_prompt(f"{MARKER} what is it?")
        first = run(engine, media_job(first_prompt, [image], id_slot=1), [image])
        pushed = run(engine, CompletionJob(
            model="qwen", prompt=chat_prompt("a long text prompt " * 12), n_predict=4,
            sampling=GREEDY, id_slot=1), [])
        assert pushed.timings.cache_n < 10  # the chat head only
        cache = eng.prompt_cache
        assert cache is not None and len(cache.states) == 1  # the image prompt, saved
        encoded, decoded = model.projector.n_encoded, model.projector.n_decoded
        second_prompt = first_prompt + first.content + "<|im_end|>\n" + chat_prompt("why?")
        second = run(engine, media_job(second_prompt, [image], id_slot=1), [image])
        assert cache.hits == 1
        assert (model.projector.n_encoded, model.projector.n_decoded) == (encoded, decoded)
        assert second.timings.cache_n >= first.tokens_evaluated
        tokenized = model.projector.tokenize(second_prompt, MARKER, [image], add_special=False)
        assert pos_max(model, 1) == tokenized.pos_of(len(tokenized.tokens)
                                                     + second.tokens_predicted - 1) - 1
        fresh = run(engine, media_job(second_prompt, [image], id_slot=0, cache_prompt=False),
                    [image])
        assert fresh.tokens == second.tokens
    finally:
        eng.stop()
        for slot in eng.slots:  # the module's other engine starts from nothing
            slot.forget_tokens()


@VIDEO
def test_a_video_over_the_context_is_refused_before_any_frame_is_encoded(
        engine: tuple[Engine, Events], model: LoadedModel) -> None:
    """A long low-bitrate video (~40 frames of 224x224, 64 tokens each, in a slot of 2048)
    answers llama-server's 400 exceed_context_size_error from its frames' token count, with
    no frame encoded (the projector's encoder is the slow part, frame by frame)."""
    assert model.projector is not None
    video = mp4(seconds=20.0, size="224x224", rate=4, pattern="color")
    job = media_job(chat_prompt(f"{MARKER} what happens?"), [video])
    encoded = model.projector.n_encoded
    with pytest.raises(ExceedContextSize) as raised:
        engine[0].prepare(job, None, [video])
    assert model.projector.n_encoded == encoded
    info = raised.value.to_info()
    assert (info.code, info.type) == (400, "exceed_context_size_error")
    assert "exceeds the available context size" in info.message
    assert raised.value.extra["n_ctx"] == model.n_ctx_slot < raised.value.extra[
        "n_prompt_tokens"]


@VIDEO
def test_a_video_becomes_frames_and_a_second_turn_reuses_them(
        engine: tuple[Engine, Events], model: LoadedModel) -> None:
    """A video through ffmpeg (mtmd's helper, --video-fps 4 by default): its frames are image
    chunks (each with its own id, `<sha256>+<frame>`), the prompt counts them all, and a second
    turn repeating the video reuses the slot's cache and answers as a fresh evaluation."""
    assert model.projector is not None and model.projector.video
    video = mp4(seconds=1.0)
    prompt = chat_prompt(f"{MARKER} what happens?")
    encoded = model.projector.n_encoded
    tokenized = model.projector.tokenize(prompt, MARKER, [video], add_special=False)
    n_frames = len(tokenized.spans)
    assert n_frames >= 3  # 1 s at 4 frames a second (ffmpeg's frame times: 3 or 4)
    assert len({s.media_id for s in tokenized.spans}) == n_frames
    assert len({tokenized.tokens[s.start] for s in tokenized.spans}) == n_frames
    assert model.projector.n_encoded == encoded + n_frames  # each frame, once (by its id)
    first = run(engine, media_job(prompt, [video], id_slot=1), [video])
    assert model.projector.n_encoded == encoded + n_frames
    assert first.tokens_evaluated == len(tokenized.tokens)
    assert first.tokens_evaluated >= sum(s.n_tokens for s in tokenized.spans)
    second_prompt = prompt + first.content + "<|im_end|>\n" + chat_prompt("and then?")
    decoded = model.projector.n_decoded
    second = run(engine, media_job(second_prompt, [video], id_slot=1), [video])
    assert model.projector.n_decoded == decoded
    assert second.timings.cache_n >= first.tokens_evaluated
    fresh = run(engine, media_job(second_prompt, [video], id_slot=0, cache_prompt=False),
                [video])
    assert fresh.tokens == second.tokens


@VIDEO
def test_video_flags_reach_the_frames(model: LoadedModel) -> None:
    """--video-fps and --video-timestamp-interval (ProjectorOptions): fewer frames at a lower
    rate; a timestamp text between frames when the interval is short."""
    assert model.model is not None
    video = mp4(seconds=1.0)

    def frames(**options: object) -> tuple[int, int]:
        projector = Projector(str(model.path.parent / "mmproj.gguf"), model.model,
                              ProjectorOptions(offload=False, n_threads=1,
                                               **options),  # type: ignore[arg-type]
                              media_marker({}))
        try:
            tokenized = projector.tokenize(f"see {MARKER} now", MARKER, [video], False)
            return len(tokenized.spans), len(tokenized.tokens) - tokenized.n_media_tokens
        finally:
            projector.close()

    four, text_four = frames(video_fps=4.0, video_timestamp_interval_ms=0)
    two, _ = frames(video_fps=2.0, video_timestamp_interval_ms=0)
    assert four > two >= 1
    stamped, text_stamped = frames(video_fps=4.0, video_timestamp_interval_ms=250)
    assert stamped >= four - 1 and text_stamped > text_four
    with pytest.raises(InvalidRequest, match=LOAD_FAILED):  # ffmpeg cannot find them
        frames(video_ffmpeg_dir="/nonexistent")


@VIDEO
def test_a_corrupt_video_is_the_requests_400(engine: tuple[Engine, Events]) -> None:
    eng, _ = engine
    video = mp4(seconds=1.0)
    rng = np.random.default_rng(5)
    for bad in (video[:200], video[:32] + rng.integers(0, 256, 4000, dtype=np.uint8).tobytes()):
        job = media_job(chat_prompt(f"{MARKER} ?"), [bad])
        with pytest.raises(InvalidRequest, match=LOAD_FAILED):
            eng.prepare(job, media=[bad])
    good = png(40, 40, seed=9)
    assert run(engine, media_job(chat_prompt(f"{MARKER} ?"), [good]), [good]).tokens_predicted


@VIDEO
def test_the_worker_flags_reach_the_projector(model: LoadedModel) -> None:
    """--video-fps, --video-timestamp-interval (by its env name) and --video-ffmpeg-dir from the
    worker's command line to the loaded projector."""
    folder = model.path.parent
    argv = ["-m", str(model.path), "-mm", str(folder / "mmproj.gguf"), "-c", "1024", "-np", "1",
            "--no-warmup", "--no-mmproj-offload"]
    video = mp4(seconds=1.0)

    def spans(*more: str, environ: dict[str, str] | None = None) -> int:
        loaded = load_model(WorkerSettings.from_args([*argv, *more], environ=environ or {}),
                            model.path)
        try:
            assert loaded.projector is not None
            return len(loaded.projector.tokenize(f"a {MARKER} b", MARKER, [video], False).spans)
        finally:
            loaded.close()

    no_stamps = {"LLAMA_ARG_VIDEO_TIMESTAMP_INTERVAL": "0"}
    assert spans("--video-fps", "2", environ=no_stamps) < spans(environ=no_stamps)
    assert spans("--video-timestamp-interval", "250") > spans(environ=no_stamps)
    with pytest.raises(InvalidRequest, match=LOAD_FAILED):
        spans("--video-ffmpeg-dir", str(folder))  # no ffmpeg there
