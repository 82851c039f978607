"""The streaming benchmark's clients: streams, rounds of them, and what each saw."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import httpx

# About 30 tokens with the Gemma 3 tokenizer. Each request gets its own prefix (round and
# client number), so no two requests share a prompt prefix; cache_prompt is off as well.
PROMPT = ("Write a long story about a lighthouse keeper who finds a strange glowing bottle on "
          "the beach one stormy night, and what happens next in the village.")
ROUND_TIMEOUT_S = 120.0
LATE_DELAY_S = 1.0


@dataclass
class Stream:
    """What one streaming client saw."""

    start: float
    first_token: float | None = None
    end: float | None = None
    tokens: int = 0
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start


@dataclass
class Round:
    concurrency: int
    streams: list[Stream]
    wall_s: float

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.streams)

    @property
    def errors(self) -> list[str]:
        return [s.error for s in self.streams if s.error]


@dataclass
class Late:
    ttft_s: float | None
    first_of_others_done_s: float | None
    joined: bool
    errors: list[str]


def body(prompt: str, n_predict: int, seed: int) -> dict[str, object]:
    return {"prompt": prompt, "n_predict": n_predict, "stream": True, "ignore_eos": True,
            "temperature": 0.8, "seed": seed, "cache_prompt": False}


async def stream_one(client: httpx.AsyncClient, url: str, payload: dict[str, object],
                     result: Stream) -> None:
    """Fill `result` as the stream goes, so a round that times out still shows what it got."""
    predicted: int | None = None
    try:
        async with client.stream("POST", url + "/completion", json=payload) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                result.error = f"HTTP {response.status_code}: {text[:200]}"
                return
            async for line in response.aiter_lines():
                if line.startswith("error:"):
                    result.error = line[:200]
                    break
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    result.error = json.dumps(event["error"])[:200]
                    break
                tokens = event.get("tokens") or []
                if (tokens or event.get("content")) and result.first_token is None:
                    result.first_token = time.perf_counter()
                result.tokens += len(tokens)
                if event.get("stop"):
                    predicted = event.get("tokens_predicted")
                    break
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"[:200]
    finally:
        result.end = time.perf_counter()
    if isinstance(predicted, int):
        result.tokens = predicted


async def gather_streams(url: str, requests: list[tuple[float, dict[str, object]]]
                         ) -> tuple[list[Stream], float]:
    """Send each request after its delay (s); returns the streams (in order) and the wall time.
    Streams still running after ROUND_TIMEOUT_S are cancelled and marked, keeping what came."""
    streams = [Stream(start=0.0) for _ in requests]
    async with httpx.AsyncClient(timeout=None) as client:

        async def one(stream: Stream, delay: float, payload: dict[str, object]) -> None:
            await asyncio.sleep(delay)
            stream.start = time.perf_counter()
            await stream_one(client, url, payload, stream)

        start = time.perf_counter()
        tasks = {asyncio.create_task(one(s, d, p)): s
                 for s, (d, p) in zip(streams, requests, strict=True)}
        _, pending = await asyncio.wait(tasks, timeout=ROUND_TIMEOUT_S)
        for task in pending:
            task.cancel()
            tasks[task].error = f"timed out after {ROUND_TIMEOUT_S:.0f} s"
        await asyncio.gather(*pending, return_exceptions=True)
        return streams, time.perf_counter() - start


async def run_round(url: str, concurrency: int, n_predict: int, tag: str) -> Round:
    streams, wall = await gather_streams(url, [
        (0.0, body(f"[{tag} client {i}] {PROMPT}", n_predict, i)) for i in range(concurrency)])
    return Round(concurrency, streams, wall)


async def run_clients(url: str, concurrency: int, n_predict: int, tag: str,
                      per_client: int) -> Round:
    """`concurrency` clients at once, each sending `per_client` streams one after another
    (a new one as soon as its last one ends); the wall time spans them all."""
    rounds = []
    start = time.perf_counter()

    async def client(i: int) -> None:
        for k in range(per_client):
            streams, _ = await gather_streams(url, [(0.0, body(
                f"[{tag} client {i} stream {k}] {PROMPT}", n_predict, i))])
            rounds.extend(streams)

    await asyncio.gather(*(client(i) for i in range(concurrency)))
    return Round(concurrency, rounds, time.perf_counter() - start)


async def run_late(url: str, n_predict: int) -> Late:
    requests = [(0.0, body(f"[late long {i}] {PROMPT}", 2 * n_predict, i)) for i in range(7)]
    requests.append((LATE_DELAY_S, body(f"[late 8] {PROMPT}", n_predict, 7)))
    streams, _ = await gather_streams(url, requests)
    *others, mine = streams
    ends = [s.end for s in others if s.end is not None and not s.error]
    first_done = min(ends) if ends else None
    joined = (mine.first_token is not None
              and (first_done is None or mine.first_token < first_done))
    return Late(ttft_s=mine.ttft,
                first_of_others_done_s=None if first_done is None else first_done - mine.start,
                joined=joined,
                errors=[s.error for s in streams if s.error])
