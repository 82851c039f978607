"""The embedding requests with media that llamaq answers as the vendored llama-server does, and
their recording: `python -m tests.media_embedding_cases OUT.json` starts
~/.cache/llamaq-bench/bin/llama-server on Gemma 3 270M with the tiny gemma3 projector
(tests/tiny_mmproj.py, deterministic) as `-m gemma --mmproj tiny --no-mmproj-offload
--embeddings --pooling mean -c 2048 -np 2`, once more without `--mmproj`, and once with
`--pooling none`, sends every case
and writes what it answered (status and body, embeddings rounded to 6 decimals).
tests/data/llama_server_media_embeddings.json is that file;
tests/fleet/embeddings/test_multimodal_embeddings.py sends the same cases to a fleet and
compares."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from tests.media_files import png

Case = tuple[str, dict[str, Any]]
LLAMA_SERVER = Path.home() / ".cache/llamaq-bench/bin/llama-server"
GEMMA = Path.home() / ".cache/llamaq-tests/gemma-3-270m-Q4_K_M.gguf"


def images() -> dict[str, bytes]:
    """The images of the cases: small ones (inline in a job) and one over the 256 KiB that
    go through the object store."""
    return {"cat": png(80, 60, seed=7), "dog": png(50, 50, seed=8),
            "large": png(420, 320, seed=11)}


def projector_cases(marker: str) -> dict[str, Case]:
    """Cases for a model with the projector (`marker`: its /props media_marker)."""
    pics = {name: base64.b64encode(data).decode() for name, data in images().items()}
    cat, dog, large = pics["cat"], pics["dog"], pics["large"]
    bad = base64.b64encode(b"not an image at all" * 10).decode()

    def uri(b64: str) -> str:
        return "data:image/png;base64," + b64

    def mm(prompt: str, *data: Any) -> dict[str, Any]:
        return {"prompt_string": prompt, "multimodal_data": list(data)}

    what = f"What is this: {marker}\n"
    return {
        "native": ("/embedding", {"content": [mm(what, cat), mm(what, cat),
                                              {"prompt_string": "What is this: \n"}]}),
        "oai_both_forms": ("/v1/embeddings", {"input": [
            {"content": [{"type": "text", "text": "What is this: "},
                         {"type": "image_url", "image_url": {"url": uri(cat)}},
                         {"type": "text", "text": "\n"}]},
            mm(what, cat), "What is this: \n"]}),
        "two_images": ("/v1/embeddings", {"input": mm(f"A {marker} and B {marker} end", cat,
                                                      dog)}),
        "image_first": ("/v1/embeddings", {"input": [{"content": [
            {"type": "image_url", "image_url": {"url": uri(dog)}},
            {"type": "text", "text": "Describe this image"}]}]}),
        "image_only": ("/v1/embeddings", {"input": [{"content": [
            {"type": "image_url", "image_url": {"url": uri(cat)}}]}]}),
        "marker_only": ("/v1/embeddings", {"input": mm(marker, cat)}),
        "large_through_the_store": ("/v1/embeddings", {"input": [mm(what, large),
                                                                  mm(what, cat)]}),
        "base64_answer": ("/v1/embeddings", {"encoding_format": "base64",
                                             "input": mm(f"x {marker} y", dog)}),
        "single_value_data": ("/v1/embeddings", {"input": {"prompt_string": f"x {marker} y",
                                                           "multimodal_data": cat}}),
        "corrupt": ("/v1/embeddings", {"input": mm(f"x {marker} y", bad)}),
        "corrupt_native": ("/embedding", {"content": mm(f"x {marker} y", bad)}),
        "corrupt_after_good": ("/v1/embeddings", {"input": ["fine", mm(f"x {marker} y",
                                                                       bad)]}),
        "empty_data": ("/v1/embeddings", {"input": mm(f"x {marker} y", "")}),
        "no_marker": ("/v1/embeddings", {"input": mm("x y", cat)}),
        "extra_marker": ("/v1/embeddings", {"input": mm(f"x {marker} {marker} y", cat)}),
        "tokens_with_data": ("/v1/embeddings", {"input": {"prompt_string": [1, 2, 3],
                                                          "multimodal_data": [cat]}}),
        "audio_on_vision": ("/v1/embeddings", {"input": [{"content": [
            {"type": "input_audio", "input_audio": {"data": cat, "format": "wav"}}]}]}),
        "video": ("/v1/embeddings", {"input": [{"content": [
            {"type": "input_video", "input_video": {"url": uri(cat)}}]}]}),
        "unknown_part": ("/v1/embeddings", {"input": [{"content": [{"type": "foo"}]}]}),
        "part_without_type": ("/v1/embeddings", {"input": [{"content": [{"text": "x"}]}]}),
        "bad_data_uri": ("/v1/embeddings", {"input": [{"content": [
            {"type": "image_url", "image_url": {"url": "data:text/plain;base64,AAAA"}}]}]}),
        "file_url": ("/v1/embeddings", {"input": [{"content": [
            {"type": "image_url", "image_url": {"url": "file://cat.png"}}]}]}),
    }


def token_row_cases(marker: str) -> dict[str, Case]:
    """Cases for `--pooling none` (/embedding: one row per token of what is read)."""
    cat = base64.b64encode(images()["cat"]).decode()
    return {"rows": ("/embedding", {"content": [
        {"prompt_string": f"What is this: {marker}\nA small picture.", "multimodal_data": [cat]},
        "What is this: \n"]})}


def text_cases() -> dict[str, Case]:
    """Cases for a model without a projector."""
    cat = base64.b64encode(images()["cat"]).decode()
    return {
        "no_projector_data": ("/v1/embeddings", {"input": {"prompt_string": "x <__media__> y",
                                                           "multimodal_data": [cat]}}),
        "no_projector_native": ("/embedding", {"content": {"prompt_string": "x y",
                                                           "multimodal_data": []}}),
        "no_projector_image": ("/v1/embeddings", {"input": [{"content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + cat}}]}]}),
        "no_projector_text_parts": ("/v1/embeddings", {"input": [{"content": [
            {"type": "text", "text": "hi"}]}]}),
    }


def send(url: str, cases: dict[str, Case]) -> dict[str, dict[str, Any]]:
    answers = {}
    for name, (path, body) in cases.items():
        response = httpx.post(f"{url}{path}", json=body, timeout=300)
        answers[name] = {"status": response.status_code, "body": response.json()}
    return answers


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items() if k != "model"}
    return value


def _record(folder: Path, mmproj: Path | None, cases: Any, port: int,
            pooling: str = "mean") -> dict[str, Any]:
    args = [str(LLAMA_SERVER), "-m", str(GEMMA), "--embeddings", "--pooling", pooling,
            "-c", "2048", "-np", "2", "--port", str(port)]
    if mmproj is not None:
        args += ["--mmproj", str(mmproj), "--no-mmproj-offload"]
    with open(folder / f"llama-server-{port}.log", "wb") as log:
        server = subprocess.Popen(args, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        marker = httpx.get(f"{url}/props").json().get("media_marker", "")
        return _rounded(send(url, cases(marker) if mmproj is not None else cases()))
    finally:
        server.terminate()
        server.wait()


def main(out: Path) -> None:
    from tests.tiny_mmproj import write_tiny_mmproj

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        mmproj = write_tiny_mmproj(folder / "mmproj-tiny-gemma3.gguf")
        recorded = {"projector": _record(folder, mmproj, projector_cases, 18451),
                    "text": _record(folder, None, text_cases, 18452),
                    "pooling_none": _record(folder, mmproj, token_row_cases, 18453, "none")}
    out.write_text(json.dumps(recorded, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
