"""Images, llamaq vs llama-server (built from the same llama.cpp, see build_llama_server.sh),
same model, same projector, same flags:

    .venv/bin/python bench/multimodal.py [--model PATH] [--mmproj PATH] [--rounds 1]
        [--only llamaq|llama-server] [--flags "-np 4 -c 8192 -t 2"] [--n-predict 16]

Without --mmproj the tiny gemma3 projector (tests/tiny_mmproj.py) is written with an 896-pixel
input, so an image is Gemma 3's 256 tokens; the model defaults to Gemma 3 270M. Per system and
round (both stay up, the order alternating per round), through /v1/chat/completions with the
image as a base64 data URI, greedy:

- `one image`: one 896×896 image, its prompt time (`timings.prompt_ms`) and wall time;
- `4 images`: four 896×896 images in one request;
- `2nd turn`: a second turn of that chat repeating the first image (same slot): prompt time
  and `timings.cache_n`;
- `stall`: a text stream (n_predict 128) runs while the 4-image request is sent: the longest
  gap between two of its tokens during the image request, beside its median gap;
- `same output`: whether the greedy completion of the one-image request is the same text on
  both systems, per round (with each round's `cache_n`: from the second round on, a system
  may start it from a prefix it cached, and its batches then differ from a cold run's).

Prints a table and writes it to bench/results/multimodal-<stamp>.md. A smoke run (`--rounds 1
--n-predict 4`) checks the bench itself; the numbers are for a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.processes import free_port, running, server_env, wait_healthy  # noqa: E402
from storage import default_model_path  # noqa: E402
from tests.media_files import png  # noqa: E402
from tests.tiny_mmproj import write_tiny_mmproj  # noqa: E402

DEFAULT_LLAMA_SERVER = Path.home() / ".cache" / "llamaq-bench" / "bin" / "llama-server"
RESULTS = REPO / "bench" / "results"


def image_part(data: bytes) -> dict[str, Any]:
    uri = "data:image/png;base64," + base64.b64encode(data).decode()
    return {"type": "image_url", "image_url": {"url": uri}}


def chat_body(messages: list[dict[str, Any]], n_predict: int, **more: Any) -> dict[str, Any]:
    return {"messages": messages, "max_tokens": n_predict, "temperature": 0, "seed": 1,
            **more}


async def timed_chat(client: httpx.AsyncClient, url: str,
                     body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    start = time.perf_counter()
    response = await client.post(f"{url}/v1/chat/completions", json=body)
    wall = time.perf_counter() - start
    if response.status_code != 200:
        raise RuntimeError(f"{url}: {response.status_code} {response.text[:300]}")
    return wall, response.json()


async def stall(client: httpx.AsyncClient, url: str, images: list[bytes],
                n_predict: int) -> tuple[float, float]:
    """(longest gap, median gap) in ms between two tokens of a text stream while a request
    with `images` is served."""
    stamps: list[float] = []
    window: list[float] = []

    async def stream() -> None:
        body = chat_body([{"role": "user", "content": "Count slowly from one to fifty."}], 128,
                         stream=True)
        body["ignore_eos"] = True
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: ") and '"content"' in line:
                    stamps.append(time.perf_counter())

    async def images_request() -> None:
        while len(stamps) < 8:  # the stream is generating
            await asyncio.sleep(0.01)
        window.append(time.perf_counter())
        parts = [image_part(i) for i in images] + [{"type": "text", "text": "compare"}]
        await timed_chat(client, url, chat_body([{"role": "user", "content": parts}],
                                                n_predict))
        window.append(time.perf_counter())

    await asyncio.gather(stream(), images_request())
    gaps = [(b - a) * 1000 for a, b in itertools.pairwise(stamps)]
    during = [(b - a) * 1000 for a, b in itertools.pairwise(stamps)
              if b >= window[0] and a <= window[1]]
    return max(during or [0.0]), statistics.median(gaps) if gaps else 0.0


async def measure(url: str, n_predict: int) -> dict[str, Any]:
    one = png(896, 896, seed=1)
    four = [png(896, 896, seed=10 + i) for i in range(4)]
    out: dict[str, Any] = {}
    async with httpx.AsyncClient(timeout=600) as client:
        first_turn = [{"role": "user", "content": [image_part(one),
                                                   {"type": "text", "text": "Describe it."}]}]
        warm = [{"role": "user", "content": [image_part(png(896, 896, seed=99)),
                                             {"type": "text", "text": "Warm up."}]}]
        await timed_chat(client, url, chat_body(warm, 1, id_slot=0))  # another image
        wall, answer = await timed_chat(client, url, chat_body(first_turn, n_predict, id_slot=0))
        out["one image"] = (answer["timings"]["prompt_ms"], wall * 1000,
                            answer["timings"].get("cache_n", 0))
        out["text"] = answer["choices"][0]["message"]["content"]
        second = [*first_turn, {"role": "assistant", "content": out["text"]},
                  {"role": "user", "content": "And the colours?"}]
        wall, answer = await timed_chat(client, url, chat_body(second, n_predict, id_slot=0))
        out["2nd turn"] = (answer["timings"]["prompt_ms"], wall * 1000,
                           answer["timings"].get("cache_n", 0))
        parts = [image_part(i) for i in four] + [{"type": "text", "text": "compare"}]
        wall, answer = await timed_chat(client, url, chat_body(
            [{"role": "user", "content": parts}], n_predict, id_slot=1))
        out["4 images"] = (answer["timings"]["prompt_ms"], wall * 1000)
        out["stall"] = await stall(client, url, [png(896, 896, seed=20 + i) for i in range(4)],
                                   n_predict)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--mmproj", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--only", choices=("llamaq", "llama-server"))
    parser.add_argument("--flags", default="-np 4 -c 8192 -t 2")
    parser.add_argument("--n-predict", type=int, default=16)
    parser.add_argument("--llama-server", type=Path, default=Path(
        os.environ.get("LLAMA_SERVER_BIN", DEFAULT_LLAMA_SERVER)))
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="llamaq-bench-mm-"))
    model = args.model or default_model_path(REPO / ".llamaq" / "cache")
    mmproj = args.mmproj or write_tiny_mmproj(logs / "mmproj-tiny-gemma3.gguf", image_size=896)
    flags = ["-m", str(model), "--mmproj", str(mmproj), *args.flags.split()]
    systems = {"llama-server": [str(args.llama_server), *flags],
               "llamaq": [sys.executable, "-m", "llamaq", "up", *flags]}
    if args.only:
        systems = {args.only: systems[args.only]}
    env = server_env({"PYTHONPATH": str(REPO)})
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
    with ExitStack() as stack:
        urls = {}
        for name, command in systems.items():
            port = free_port()
            process = stack.enter_context(running(
                [*command, "--host", "127.0.0.1", "--port", str(port)], logs / f"{name}.log",
                env))
            urls[name] = f"http://127.0.0.1:{port}"
            wait_healthy(urls[name], process=process)
        names = list(urls)
        for round_index in range(args.rounds):
            for name in names if round_index % 2 == 0 else names[::-1]:
                print(f"round {round_index + 1}: {name}", flush=True)
                results[name].append(asyncio.run(measure(urls[name], args.n_predict)))
    report = render(results, args, logs)
    print(report)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"multimodal-{time.strftime('%Y%m%d-%H%M%S')}.md"
    path.write_text(report)
    print(f"written to {path}")


def render(results: dict[str, list[dict[str, Any]]], args: argparse.Namespace,
           logs: Path) -> str:
    def med(name: str, key: str, index: int) -> float:
        return statistics.median(r[key][index] for r in results[name])

    lines = [f"# multimodal bench ({time.strftime('%Y-%m-%d %H:%M')})", "",
             f"flags: `{args.flags}`, n_predict {args.n_predict}, rounds {args.rounds}, "
             f"logs {logs}", "",
             "prompt ms is the server's `timings.prompt_ms`, wall ms the request's time", "",
             "| system | one image: prompt / wall ms | 4 images: prompt / wall ms | 2nd turn: "
             "prompt / wall ms (cache_n) | stall: longest gap ms (median gap) |",
             "|---|---|---|---|---|"]
    for name in results:
        lines.append(f"| {name} | {med(name, 'one image', 0):.0f} / "
                     f"{med(name, 'one image', 1):.0f} | {med(name, '4 images', 0):.0f} / "
                     f"{med(name, '4 images', 1):.0f} | {med(name, '2nd turn', 0):.0f} / "
                     f"{med(name, '2nd turn', 1):.0f} ({med(name, '2nd turn', 2):.0f}) | "
                     f"{med(name, 'stall', 0):.0f} ({med(name, 'stall', 1):.0f}) |")
    if len(results) == 2:
        texts = [[r["text"] for r in runs] for runs in results.values()]
        same = ", ".join(f"round {i + 1} {a == b}"
                         for i, (a, b) in enumerate(zip(*texts, strict=True)))
        lines += ["", f"same greedy output: {texts[0] == texts[1]} ({same})"]
        for name, runs in results.items():  # a later round may start from a cached prefix
            lines.append(f"- {name}: " + ", ".join(
                f"{json.dumps(r['text'])} (cache_n {r['one image'][2]})" for r in runs))
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
