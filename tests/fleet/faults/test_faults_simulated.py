"""The fault tests at a count the real engine cannot reach here: 20 simulated workers
(`llamaq worker --simulate`, five processes of four), 200 concurrent streams, a worker process
SIGKILLed every 2 s (four workers at once) and a fresh one started in its place. Every stream
ends with its whole text — the simulator's text is a function of the prompt, so a continued
stream must match it token for token — and no error: 0 errored, 0 lost. Real Redis, real api
and worker processes, real HTTP streams (aiohttp, one client for all 200)."""

from __future__ import annotations

import asyncio
import json
import random
import signal
from pathlib import Path
from typing import Any

import aiohttp
import httpx

from tests.processes import Fleet, wait_until
from worker.simulate.vocab import SimVocab

PROCESSES, PER_PROCESS, SLOTS = 5, 4, 10
STREAMS, N_PREDICT, ITL_MS = 200, 60, 100
KILL_EVERY_S, KILLS = 2.0, 3
WORKER_FLAGS = ("--simulate", "--sim-workers", str(PER_PROCESS), "-np", str(SLOTS),
                "--sim-itl-ms", str(ITL_MS), "--sim-eos-tokens", "1000", "--poll-delay", "0.2")


def expected_text(prompt: str, n_predict: int = N_PREDICT) -> str:
    vocab = SimVocab()
    tokens = vocab.tokenize_prompt(prompt)
    return vocab.detokenize([vocab.generated(tokens, i, 1000, False) for i in range(n_predict)])


async def stream(session: aiohttp.ClientSession, url: str, prompt: str,
                 flowing: asyncio.Event) -> dict[str, Any]:
    """One streamed /completion: its text, its final event, any error event or exception;
    `flowing` is set at its first text."""
    seen: dict[str, Any] = {"text": "", "final": None, "error": None}
    try:
        async with session.post(f"{url}/completion", json={
                "prompt": prompt, "n_predict": N_PREDICT, "stream": True}) as response:
            if response.status != 200:
                seen["error"] = f"HTTP {response.status}: {await response.text()}"
                return seen
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                data = json.loads(line.removeprefix("data: "))
                if "error" in data:
                    seen["error"] = data["error"]
                seen["text"] += data.get("content", "")
                if seen["text"]:
                    flowing.set()
                if data.get("stop"):
                    seen["final"] = data
    except Exception as error:  # recorded: the test asserts there is none
        seen["error"] = repr(error)
    return seen


async def load_and_kill(url: str, fleet: Fleet, workers: list[Any]) -> list[dict[str, Any]]:
    rng = random.Random(44)
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=180)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        flowing = asyncio.Event()
        tasks = [asyncio.create_task(stream(session, url, f"stream {i} tells its own tale",
                                            flowing)) for i in range(STREAMS)]
        # the kills hit running streams: they start once text flows (on a loaded box the
        # streams may take seconds to start), and their victims are processes that served
        # when the streams began, never a fresh replacement (which runs none of them)
        await asyncio.wait_for(flowing.wait(), 120)
        serving = list(workers)
        for _ in range(KILLS):
            await asyncio.sleep(KILL_EVERY_S)
            victim = serving.pop(rng.randrange(len(serving)))
            victim.send_signal(signal.SIGKILL)
            workers.append(fleet.add_worker(*WORKER_FLAGS))
        return await asyncio.gather(*tasks)


def migrated(url: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("llamaq:jobs_migrated_total "):
            return float(line.split()[1])
    raise AssertionError("no llamaq:jobs_migrated_total in /metrics")


def test_200_streams_on_20_simulated_workers_one_killed_every_2_s(
        redis_url: str, tmp_path: Path) -> None:
    fleet = Fleet(redis_url, tmp_path, ["-m", "simulated", "--store-url", str(tmp_path / "store"),
                                        "--cache-dir", str(tmp_path / "cache")],
                  logs=tmp_path / "logs")
    try:
        workers = [fleet.add_worker(*WORKER_FLAGS) for _ in range(PROCESSES)]
        url = fleet.add_api("--metrics")
        wait_until(lambda: httpx.get(f"{url}/props").json().get("total_slots")
                   == PROCESSES * PER_PROCESS * SLOTS, 120, what="20 simulated workers")
        results = asyncio.run(load_and_kill(url, fleet, workers))
        errored = [r["error"] for r in results if r["error"] is not None]
        assert not errored, f"{len(errored)} streams errored: {errored[:3]}"
        lost = [i for i, r in enumerate(results)
                if r["final"] is None or r["text"] != expected_text(
                    f"stream {i} tells its own tale")]
        assert not lost, (f"{len(lost)} streams lost tokens or their end: {lost[:5]}; the first "
                          f"got {results[lost[0]]['text']!r}, final {results[lost[0]]['final']}, "
                          f"wanted {expected_text(f'stream {lost[0]} tells its own tale')!r}")
        assert all(r["final"]["tokens_predicted"] == N_PREDICT for r in results)
        # the kills hit running streams: they went on on other workers
        assert migrated(url) >= 1
    finally:
        fleet.stop()
