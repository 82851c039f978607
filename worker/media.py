"""Media in a prompt (images, audio) through llama.cpp's mtmd: the projector (`-mm/--mmproj`),
a prompt with media markers turned into text tokens and media chunks, and a media chunk
evaluated into a slot's KV cache.

Owns: the mtmd context and its lifetime, the decoding of media bytes (stb_image, miniaudio
inside mtmd; a bad file is the request's 400 "Failed to load image or audio file", never a
dead worker), the placeholder tokens that stand for a media chunk in a slot's token list.

A media chunk's positions hold placeholder tokens made from the SHA-256 of its bytes (negative,
so never a vocabulary token): the slot's prefix reuse (worker/kv_moves.py) then matches a
repeated image as llama-server does (by hash), and a second turn that repeats it evaluates
nothing again. Chunks are evaluated whole (Gemma 3's image tokens attend to each other:
non-causal), in a decode of their own, between two steps of the other slots."""

from __future__ import annotations

import ctypes
import logging
import secrets
import string
import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field

import llama_cpp as lc
from llama_cpp import mtmd_cpp as mtmd

from scheduler.contract.errors import InvalidRequest, ServerError
from worker.llama_logs import route_mtmd_logs

log = logging.getLogger(__name__)

LOAD_FAILED = "Failed to load image or audio file"
CHUNK_TEXT = 0


class ProjectorLoadError(RuntimeError):
    """The mmproj file could not be loaded for this model (a start-up failure)."""


@dataclass(frozen=True)
class ProjectorOptions:
    offload: bool = True
    n_threads: int = 1
    image_min_tokens: int = -1
    image_max_tokens: int = -1
    batch_max_tokens: int = -1


def media_marker(env: Mapping[str, str]) -> str:
    """llama-server's marker: LLAMA_MEDIA_MARKER, else `<__media_` + 32 random characters +
    `__>`, one per process."""
    pinned = env.get("LLAMA_MEDIA_MARKER", "")
    if pinned:
        return pinned
    alphabet = string.ascii_letters + string.digits
    return "<__media_" + "".join(secrets.choice(alphabet) for _ in range(32)) + "__>"


def placeholder_token(sha256: str) -> int:
    """The token that stands for every position of a media chunk with this id (< 0)."""
    return -1 - int(sha256[:15], 16)


@dataclass
class MediaSpan:
    """A media chunk at prompt positions [start, start + n_tokens)."""

    start: int
    n_tokens: int
    chunk: int
    """mtmd_input_chunk pointer (owned by its MediaPrompt's chunks)."""
    media_id: str

    @property
    def end(self) -> int:
        return self.start + self.n_tokens


@dataclass
class MediaPrompt:
    """A tokenized prompt with media: text tokens and placeholders, the media spans."""

    tokens: list[int]
    spans: list[MediaSpan] = field(default_factory=list)
    n_media_tokens: int = 0

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
        params.n_threads = options.n_threads
        params.print_timings = False
        params.warmup = False
        params.image_min_tokens = options.image_min_tokens
        params.image_max_tokens = options.image_max_tokens
        if options.batch_max_tokens > 0:
            params.batch_max_tokens = options.batch_max_tokens
        self._marker = marker.encode()
        params.media_marker = self._marker
        self.ctx = mtmd.mtmd_init_from_file(path.encode(), model, params)
        if not self.ctx:
            raise ProjectorLoadError(f"failed to load the multimodal projector {path}")
        self.marker = marker
        self.vision = bool(mtmd.mtmd_support_vision(self.ctx))
        self.audio = bool(mtmd.mtmd_support_audio(self.ctx))
        self.video = False  # video frames need ffmpeg (--video-*): not built
        self.n_evaluated = 0
        """Media chunks evaluated (encoded and decoded) since load."""
        self._lock = threading.Lock()
        """mtmd's context is not thread-safe: tokenizing (preprocessing) on a job's thread and
        evaluating on the engine thread take turns."""

    def modalities(self) -> dict[str, bool]:
        return {"vision": self.vision, "audio": self.audio, "video": self.video}

    def close(self) -> None:
        if self.ctx:
            mtmd.mtmd_free(self.ctx)
            self.ctx = None

    def load_bitmap(self, data: bytes) -> int:
        """A bitmap (pointer) from image or audio bytes; the request's 400 when they do not
        decode. Its id is the SHA-256 of the bytes (mtmd's helper sets it)."""
        if not data:
            raise InvalidRequest(LOAD_FAILED)
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        with self._lock:
            wrapper = mtmd.mtmd_helper_bitmap_init_from_buf_wrapper(
                self.ctx, buf, len(data), False, mtmd.mtmd_helper_init_opt_default())
        if wrapper.video_ctx:  # video needs its frames read (not built): refuse it whole
            mtmd.mtmd_helper_video_free(wrapper.video_ctx)
            if wrapper.bitmap:
                mtmd.mtmd_bitmap_free(wrapper.bitmap)
            raise InvalidRequest("video input is not supported")
        if not wrapper.bitmap:
            raise InvalidRequest(LOAD_FAILED)
        return int(wrapper.bitmap)

    def tokenize(self, prompt: str, job_marker: str, media: list[bytes],
                 add_special: bool) -> MediaPrompt:
        """The prompt's text (with `job_marker` where each media item goes) and the media,
        as tokens and media spans."""
        if prompt.count(job_marker) != len(media):
            raise InvalidRequest(f"number of media markers in the prompt "
                                 f"({prompt.count(job_marker)}) does not match the number of "
                                 f"media ({len(media)})")
        bitmaps = [self.load_bitmap(data) for data in media]
        try:
            return self._tokenize(prompt.replace(job_marker, self.marker), bitmaps, add_special)
        finally:
            for bitmap in bitmaps:
                mtmd.mtmd_bitmap_free(bitmap)

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
            if mtmd.mtmd_input_chunk_get_n_pos(chunk) != n_tokens:
                raise InvalidRequest("this model's media positions (M-RoPE) are not supported")
            raw_id = mtmd.mtmd_input_chunk_get_id(chunk) or b""
            media_id = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
            prompt.spans.append(MediaSpan(len(prompt.tokens), n_tokens, int(chunk), media_id))
            prompt.tokens.extend([placeholder_token(media_id or "0")] * n_tokens)
            prompt.n_media_tokens += n_tokens
        if prompt.spans and prompt.spans[-1].end == len(prompt.tokens):
            raise InvalidRequest("the prompt must not end with a media item")
        return prompt

    def evaluate(self, ctx: lc.llama_context_p, span: MediaSpan, seq_id: int,
                 n_batch: int) -> None:
        """Encode the chunk and decode its embeddings into sequence `seq_id` at its positions
        (a decode of its own; llama.cpp switches to non-causal attention for it if needed)."""
        new_n_past = lc.llama_pos(0)
        with self._lock:
            rc = mtmd.mtmd_helper_eval_chunk_single(self.ctx, ctx, span.chunk, span.start,
                                                    seq_id, n_batch, False,
                                                    ctypes.byref(new_n_past))
        if rc != 0:
            raise ServerError(f"failed to evaluate a media chunk (mtmd: {rc})")
        self.n_evaluated += 1
