"""Media in a prompt (images, audio) through llama.cpp's mtmd: the projector (`-mm/--mmproj`),
a prompt with media markers turned into text tokens and media chunks, and a media chunk
evaluated into a slot's KV cache.

Owns: the mtmd context and its lifetime, the decoding of media bytes (stb_image, miniaudio
inside mtmd; a bad file is the request's 400 "Failed to load image or audio file", never a
dead worker), the placeholder tokens that stand for a media chunk in a slot's token list.

A media chunk's positions hold placeholder tokens made from the SHA-256 of its bytes (negative,
so never a vocabulary token): the slot's prefix reuse (worker/kv/moves.py) then matches a
repeated image as llama-server does (by hash), and a second turn that repeats it evaluates
nothing again.

With M-RoPE (Qwen2-VL and kin) a chunk's tokens take fewer positions than they are (n_pos):
the token list keeps one placeholder per token and MediaPrompt.pos_of maps an index to its
model position, as llama-server's server_tokens::pos_next.

Where llama-server stalls every slot while it encodes an image, the encoding (the vision
tower, the costly part) runs here when the request is prepared, on the job's thread, while the
engine goes on decoding the other slots; its embeddings are kept by media hash (EMBD_CACHE_BYTES),
so an image seen again is not encoded again even on another slot. The engine thread only
decodes the embeddings into the slot's cache: whole, in a decode of its own (Gemma 3's image
tokens attend to each other, non-causal, so they cannot share a batch with text)."""

from __future__ import annotations

import ctypes
import hashlib
import logging
import secrets
import string
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import llama_cpp as lc
from llama_cpp import mtmd_cpp as mtmd

from scheduler.contract.errors import InvalidRequest, ServerError
from worker.runtime.llama_logs import route_mtmd_logs

if TYPE_CHECKING:
    import numpy as np  # for annotations: imported where used, ~19 MiB a worker may never need

log = logging.getLogger(__name__)

LOAD_FAILED = "Failed to load image or audio file"
CHUNK_TEXT = 0
EMBD_CACHE_BYTES = 256 << 20
"""Encoded media embeddings kept by media hash (least recently used out first)."""


class ProjectorLoadError(RuntimeError):
    """The mmproj file could not be loaded for this model (a start-up failure)."""


@dataclass(frozen=True)
class ProjectorOptions:
    offload: bool = True
    device: int | None = None
    """-mmdev: the ggml device handle to offload to (None: llama.cpp's choice)."""
    n_threads: int = 1
    image_min_tokens: int = -1
    image_max_tokens: int = -1
    batch_max_tokens: int = -1
    video_fps: float = 4.0
    """--video-fps: frames a second taken from a video (<= 0: the video's own)."""
    video_timestamp_interval_ms: int = 5000
    """--video-timestamp-interval: a text timestamp between frames this often (<= 0: none)."""
    video_ffmpeg_dir: str | None = None
    """--video-ffmpeg-dir: where ffmpeg and ffprobe are (None: PATH)."""
    flash_attn_type: int = lc.LLAMA_FLASH_ATTN_TYPE_AUTO
    """-fa, as llama-server gives it to the vision/audio encoder."""
    warmup: bool = False
    """--warmup: encode a dummy input at load. As in llama-server, it is also what resolves
    `-fa auto` (clip.cpp tries flash attention then): without it the encoder computes
    attention without flash attention, with other roundings than llama-server's default."""
    progress: Callable[[float], None] | None = None
    """The load's progress, 0..1 (mtmd's progress callback)."""


def media_marker(env: Mapping[str, str]) -> str:
    """llama-server's marker: LLAMA_MEDIA_MARKER, else `<__media_` + 32 random characters +
    `__>`, one per process."""
    pinned = env.get("LLAMA_MEDIA_MARKER", "")
    if pinned:
        return pinned
    alphabet = string.ascii_letters + string.digits
    return "<__media_" + "".join(secrets.choice(alphabet) for _ in range(32)) + "__>"


def placeholder_token(media_id: str) -> int:
    """The token that stands for every position of a media chunk with this id (< 0): the
    SHA-256 of its bytes, or for a video's frame (`<sha256>+<frame>`) that of the id."""
    digest = hashlib.sha256(media_id.encode()).hexdigest() if "+" in media_id else media_id
    return -1 - int(digest[:15], 16)


@dataclass
class MediaSpan:
    """A media chunk at token indexes [start, start + n_tokens) of the prompt; its model
    positions start at `pos` and take `n_pos` (fewer than its tokens with M-RoPE)."""

    start: int
    n_tokens: int
    chunk: int
    """mtmd_input_chunk pointer (owned by its MediaPrompt's chunks)."""
    media_id: str
    embd: np.ndarray | None = None
    """The encoded embeddings (n_tokens × the model's input width, float32)."""
    pos: int = -1
    """The model position of its first token (-1: `start`, no M-RoPE before it)."""
    n_pos: int = -1
    """The positions it takes (-1: `n_tokens`)."""

    def __post_init__(self) -> None:
        if self.pos < 0:
            self.pos = self.start
        if self.n_pos < 0:
            self.n_pos = self.n_tokens

    @property
    def end(self) -> int:
        return self.start + self.n_tokens


@dataclass
class MediaPrompt:
    """A tokenized prompt with media: text tokens and placeholders, the media spans."""

    tokens: list[int]
    spans: list[MediaSpan] = field(default_factory=list)
    n_media_tokens: int = 0
    encode_ms: float = 0.0
    """Time spent encoding its media (none when they came from the cache): part of the
    prompt's time in its timings, as in llama-server's."""

    @property
    def mrope(self) -> bool:
        """Some chunk's positions differ from its token count (M-RoPE: Qwen2-VL and kin)."""
        return any(s.n_pos != s.n_tokens for s in self.spans)

    def pos_of(self, index: int) -> int:
        """The model position of the token at `index` of the prompt (or of what follows it:
        generated tokens), as llama-server's server_tokens::pos_next: a media chunk before it
        advances the positions by its n_pos, not its token count."""
        return index - sum(s.n_tokens - s.n_pos for s in self.spans if s.end <= index)

    def span_at(self, pos: int) -> MediaSpan | None:
        return next((s for s in self.spans if s.start == pos), None)

    def span_over(self, pos: int) -> MediaSpan | None:
        """The span that holds position `pos` past its first one (a cut inside a chunk)."""
        return next((s for s in self.spans if s.start < pos < s.end), None)

    def text_end(self, pos: int) -> int:
        """Where the text that starts at `pos` ends: the next media chunk, or the prompt's end."""
        return min((s.start for s in self.spans if s.start >= pos), default=len(self.tokens))


class Projector:
    """One mtmd context on the worker's model (its text embeddings must match)."""

    def __init__(self, path: str, model: lc.llama_model_p, options: ProjectorOptions,
                 marker: str) -> None:
        route_mtmd_logs()
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = options.offload
        if options.device is not None:
            params.device = options.device
        params.n_threads = options.n_threads
        params.print_timings = False
        params.flash_attn_type = options.flash_attn_type
        params.warmup = options.warmup
        params.image_min_tokens = options.image_min_tokens
        params.image_max_tokens = options.image_max_tokens
        if options.batch_max_tokens > 0:
            params.batch_max_tokens = options.batch_max_tokens
        self._marker = marker.encode()
        params.media_marker = self._marker
        if options.progress is not None:
            report = options.progress

            def progress(value: float, _: object) -> bool:
                report(value)
                return True

            self._progress = mtmd.mtmd_progress_callback(progress)  # alive while it loads
            params.progress_callback = self._progress
        self.ctx = mtmd.mtmd_init_from_file(path.encode(), model, params)
        if not self.ctx:
            raise ProjectorLoadError(f"failed to load the multimodal projector {path}")
        self.marker = marker
        self.vision = bool(mtmd.mtmd_support_vision(self.ctx))
        self.audio = bool(mtmd.mtmd_support_audio(self.ctx))
        self.video = bool(mtmd.mtmd_helper_support_video(self.ctx))
        """Video through ffmpeg (mtmd's helper, a vision projector on a build with video):
        what llama-server reports; a video that ffmpeg cannot read is the request's 400."""
        self._ffmpeg_dir = options.video_ffmpeg_dir.encode() if options.video_ffmpeg_dir \
            else None
        self._init_opt = mtmd.mtmd_helper_init_opt_default()
        self._init_opt.video_params.fps_target = options.video_fps
        self._init_opt.video_params.timestamp_interval_ms = options.video_timestamp_interval_ms
        self._init_opt.video_params.ffmpeg_bin_dir = self._ffmpeg_dir
        self.n_embd = lc.llama_model_n_embd_inp(model)
        self.n_encoded = 0
        """Media chunks encoded since load (a cached one is not)."""
        self.n_decoded = 0
        """Media chunks decoded into a slot's cache since load."""
        self._lock = threading.Lock()
        """mtmd's encoder is not thread-safe: jobs' threads take turns (the engine thread's
        decode of embeddings does not need it)."""
        self._embd_cache: OrderedDict[str, np.ndarray] = OrderedDict()

    def modalities(self) -> dict[str, bool]:
        return {"vision": self.vision, "audio": self.audio, "video": self.video}

    def close(self) -> None:
        if self.ctx:
            mtmd.mtmd_free(self.ctx)
            self.ctx = None

    def load_bitmap(self, data: bytes) -> tuple[int, int | None]:
        """A bitmap (pointer) from image, audio or video bytes, and a video's reader (which
        must outlive the tokenizing: mtmd reads the frames from it lazily, through ffmpeg);
        the request's 400 when they do not decode. Its id is the SHA-256 of the bytes (mtmd's
        helper sets it, on every frame of a video too)."""
        if not data:
            raise InvalidRequest(LOAD_FAILED)
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        with self._lock:
            wrapper = mtmd.mtmd_helper_bitmap_init_from_buf_wrapper(
                self.ctx, buf, len(data), False, self._init_opt)
        video = int(wrapper.video_ctx) if wrapper.video_ctx else None
        if not wrapper.bitmap:
            if video is not None:
                mtmd.mtmd_helper_video_free(video)
            raise InvalidRequest(LOAD_FAILED)
        return int(wrapper.bitmap), video

    def tokenize(self, prompt: str, job_marker: str, media: list[bytes],
                 add_special: bool) -> MediaPrompt:
        """The prompt's text (with `job_marker` where each media item goes) and the media,
        as tokens and media spans."""
        if prompt.count(job_marker) != len(media):
            raise InvalidRequest(f"number of media markers in the prompt "
                                 f"({prompt.count(job_marker)}) does not match the number of "
                                 f"media ({len(media)})")
        bitmaps: list[int] = []
        videos: list[int] = []
        try:
            for data in media:
                bitmap, video = self.load_bitmap(data)
                bitmaps.append(bitmap)
                if video is not None:
                    videos.append(video)
            tokenized = self._tokenize(prompt.replace(job_marker, self.marker), bitmaps,
                                       add_special)
        finally:
            for bitmap in bitmaps:
                mtmd.mtmd_bitmap_free(bitmap)
            for video in videos:
                mtmd.mtmd_helper_video_free(video)
        started = time.perf_counter()
        for span in tokenized.spans:
            span.embd = self._embeddings(span)
        tokenized.encode_ms = (time.perf_counter() - started) * 1000
        return tokenized

    def _embeddings(self, span: MediaSpan) -> np.ndarray:
        """The span's embeddings: from the cache by media hash, else encoded now."""
        import numpy as np

        with self._lock:
            cached = self._embd_cache.get(span.media_id) if span.media_id else None
            if cached is not None and cached.shape[0] == span.n_tokens * self.n_embd:
                self._embd_cache.move_to_end(span.media_id)
                return cached
            if mtmd.mtmd_encode_chunk(self.ctx, span.chunk) != 0:
                raise InvalidRequest(LOAD_FAILED)
            out = mtmd.mtmd_get_output_embd(self.ctx)
            embd = np.ctypeslib.as_array(out, shape=(span.n_tokens * self.n_embd,)).copy()
            self.n_encoded += 1
            if span.media_id:
                self._embd_cache[span.media_id] = embd
                while sum(e.nbytes for e in self._embd_cache.values()) > EMBD_CACHE_BYTES \
                        and len(self._embd_cache) > 1:
                    self._embd_cache.popitem(last=False)
            return embd

    def _tokenize(self, text: str, bitmaps: list[int], add_special: bool) -> MediaPrompt:
        chunks = mtmd.mtmd_input_chunks_init()
        encoded = text.encode()
        inp = mtmd.mtmd_input_text()
        inp.text = encoded
        inp.text_len = len(encoded)
        inp.add_special = add_special
        inp.parse_special = True
        array = (mtmd.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
        with self._lock:
            rc = mtmd.mtmd_tokenize(self.ctx, chunks, ctypes.byref(inp), array, len(bitmaps))
        if rc != 0:
            mtmd.mtmd_input_chunks_free(chunks)
            raise InvalidRequest(LOAD_FAILED if rc == 2 else f"Failed to tokenize the prompt "
                                 f"with its media (mtmd_tokenize: {rc})")
        prompt = MediaPrompt(tokens=[])
        weakref.finalize(prompt, mtmd.mtmd_input_chunks_free, chunks)
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            if mtmd.mtmd_input_chunk_get_type(chunk) == CHUNK_TEXT:
                n = ctypes.c_size_t(0)
                ptr = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                prompt.tokens.extend(ptr[k] for k in range(n.value))
                continue
            n_tokens = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
            n_pos = mtmd.mtmd_input_chunk_get_n_pos(chunk)
            raw_id = mtmd.mtmd_input_chunk_get_id(chunk) or b""
            media_id = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
            start = len(prompt.tokens)
            prompt.spans.append(MediaSpan(start, n_tokens, int(chunk), media_id,
                                          pos=prompt.pos_of(start), n_pos=n_pos))
            prompt.tokens.extend([placeholder_token(media_id or "0")] * n_tokens)
            prompt.n_media_tokens += n_tokens
        if prompt.spans and prompt.spans[-1].end == len(prompt.tokens):
            raise InvalidRequest("the prompt must not end with a media item")
        return prompt

    def evaluate(self, ctx: lc.llama_context_p, span: MediaSpan, seq_id: int,
                 n_batch: int) -> None:
        """Decode the chunk's embeddings (encoded when it was prepared) into sequence `seq_id`
        at its positions (from `span.pos`; mtmd's helper lays out M-RoPE's 2-D ones): a decode
        of its own, with non-causal attention where the model needs it (the helper switches
        it)."""
        if span.embd is None:
            raise ServerError("a media chunk was not encoded")
        new_n_past = lc.llama_pos(0)
        embd = span.embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        rc = mtmd.mtmd_helper_decode_image_chunk(self.ctx, ctx, span.chunk, embd, span.pos,
                                                 seq_id, n_batch, ctypes.byref(new_n_past),
                                                 mtmd.mtmd_helper_post_decode_callback(0),
                                                 None)
        if rc != 0:
            raise ServerError(f"failed to decode a media chunk (mtmd: {rc})")
        self.n_decoded += 1
