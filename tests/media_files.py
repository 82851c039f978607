"""Small media files made by the tests without an imaging library: PNG (zlib + struct) and
WAV, with random pixels or samples, plus the base64 data URIs clients send."""

from __future__ import annotations

import base64
import io
import shutil
import struct
import subprocess
import tempfile
import wave
import zlib

import numpy as np


def png(width: int, height: int, seed: int = 0) -> bytes:
    """An 8-bit RGB PNG of random pixels."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    raw = b"".join(b"\x00" + pixels[y].tobytes() for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw))
            + chunk(b"IEND", b""))


def wav(seconds: float = 0.5, rate: int = 16000, seed: int = 0) -> bytes:
    """A mono 16-bit WAV of noise."""
    samples = np.random.default_rng(seed).integers(-3000, 3000, int(seconds * rate),
                                                   dtype=np.int16)
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.tobytes())
    return out.getvalue()


def data_uri(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def mp4(seconds: float = 1.0, size: str = "96x64", rate: int = 8, pattern: str = "testsrc"
        ) -> bytes:
    """A tiny MPEG-4 video written by ffmpeg (Debian's package, scripts/install): lavfi's test
    pattern, `rate` frames a second."""
    ffmpeg = shutil.which("ffmpeg")
    if ffmpeg is None:
        raise RuntimeError("ffmpeg is not installed (scripts/install test installs it)")
    with tempfile.TemporaryDirectory() as folder:
        out = f"{folder}/video.mp4"
        subprocess.run([ffmpeg, "-loglevel", "error", "-y", "-f", "lavfi", "-i",
                        f"{pattern}=size={size}:rate={rate}", "-t", str(seconds),
                        "-c:v", "mpeg4", out], check=True, timeout=60)
        with open(out, "rb") as file:
            return file.read()
