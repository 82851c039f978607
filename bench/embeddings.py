"""/v1/embeddings throughput, llamaq vs llama-server (built from the same llama.cpp, see
build_llama_server.sh), same model and flags: texts/s at 1, 8 and 64 inputs per request.

    .venv/bin/python bench/embeddings.py [--model minilm|gemma|PATH] [--sizes 1,8,64]
        [--texts 128] [--clients 4] [--rounds 2] [--only llamaq|llama-server]

Both systems are started once and stay up; each round measures every size on both, the order
alternating per round (A/B, then B/A) so both see the same load from the rest of the machine.
Each measurement sends `--texts` texts as requests of `size` inputs from `--clients` concurrent
clients (bounded, 127.0.0.1 only) after one warm-up request. Prints each system's median
texts/s per size and the median of the per-round ratios (llamaq / llama-server).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.processes import free_port, running, server_env, wait_healthy  # noqa: E402
from storage import default_model_path  # noqa: E402

DEFAULT_LLAMA_SERVER = Path.home() / ".cache" / "llamaq-bench" / "bin" / "llama-server"
MINILM = Path.home() / ".cache" / "llamaq-tests" / "all-MiniLM-L6-v2-f32.gguf"
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "seven",
         "cats", "watch", "from", "an", "old", "red", "barn", "near", "the", "river", "bank",
         "in", "early", "spring", "morning", "light"]


def minilm_path() -> Path:
    """The tests' converted MiniLM (tests/conftest.py minilm_path), converted here if absent."""
    if not MINILM.is_file():
        import all_minilm_l6_v2

        from worker.runtime.convert_bert import convert

        MINILM.parent.mkdir(parents=True, exist_ok=True)
        convert(all_minilm_l6_v2.get_model_zip_path(), MINILM)
    return MINILM


def texts(n: int) -> list[str]:
    """Distinct sentences of 8 to 20 words."""
    return [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(8 + i % 13)) + f" {i}."
            for i in range(n)]


async def measure(url: str, size: int, n_texts: int, clients: int) -> float:
    """texts/s for `n_texts` texts in requests of `size` inputs from `clients` clients."""
    corpus = texts(n_texts)
    batches = [corpus[i:i + size] for i in range(0, n_texts, size)]
    async with httpx.AsyncClient(timeout=600) as client:
        warm = await client.post(f"{url}/v1/embeddings", json={"input": corpus[:size]})
        warm.raise_for_status()
        queue: asyncio.Queue[list[str]] = asyncio.Queue()
        for batch in batches:
            queue.put_nowait(batch)

        async def worker() -> None:
            while not queue.empty():
                batch = queue.get_nowait()
                response = await client.post(f"{url}/v1/embeddings",
                                             json={"input": batch, "encoding_format": "float"})
                response.raise_for_status()
                assert len(response.json()["data"]) == len(batch)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(min(clients, len(batches)))))
        return n_texts / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--sizes", default="1,8,64")
    parser.add_argument("--texts", type=int, default=128)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--flags", default="-np 8 -c 4096 -t 2",
                        help="flags given to both (besides --embedding, -m, --port)")
    parser.add_argument("--only", choices=("llamaq", "llama-server"))
    parser.add_argument("--passive", action="store_true",
                        help="OMP_WAIT_POLICY=PASSIVE for llama-server too (llamaq's workers "
                        "set it unless it is set): ggml's threads sleep instead of spinning")
    parser.add_argument("--llama-server", type=Path, default=Path(
        os.environ.get("LLAMA_SERVER_BIN", DEFAULT_LLAMA_SERVER)))
    args = parser.parse_args()
    if args.model == "minilm":
        model, pooling = minilm_path(), []
    elif args.model == "gemma":
        model, pooling = default_model_path(REPO / ".llamaq" / "cache"), ["--pooling", "mean"]
    else:
        model, pooling = Path(args.model), []
    flags = ["--embedding", *pooling, "-m", str(model), *args.flags.split()]
    systems = {"llama-server": [str(args.llama_server), *flags],
               "llamaq": [str(REPO / ".venv" / "bin" / "llamaq"), "up", *flags]}
    if args.only:
        systems = {args.only: systems[args.only]}
    sizes = [int(s) for s in args.sizes.split(",")]
    logs = Path(tempfile.mkdtemp(prefix="llamaq-bench-embed-"))
    env = server_env()
    if args.passive:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    results: dict[tuple[str, int], list[float]] = {}
    with ExitStack() as stack:
        urls = {}
        for name, command in systems.items():
            port = free_port()
            stack.enter_context(running([*command, "--host", "127.0.0.1", "--port", str(port)],
                                        logs / f"{name}.log", env))
            urls[name] = f"http://127.0.0.1:{port}"
        for url in urls.values():
            wait_healthy(url)
        names = list(urls)
        for round_index in range(args.rounds):
            order = names if round_index % 2 == 0 else names[::-1]
            for size in sizes:
                for name in order:
                    rate = asyncio.run(measure(urls[name], size, args.texts, args.clients))
                    results.setdefault((name, size), []).append(rate)
                    print(f"round {round_index + 1} size {size:>3} {name:<12} "
                          f"{rate:8.1f} texts/s", flush=True)
    print(f"\nmodel {model.name}, flags {' '.join(flags)}, {args.texts} texts, "
          f"{args.clients} clients, {args.rounds} rounds, OMP_WAIT_POLICY "
          f"{env.get('OMP_WAIT_POLICY', 'unset')} (logs in {logs})")
    print(f"{'inputs/request':>14} " + " ".join(f"{n:>14}" for n in names)
          + ("   llamaq/llama-server" if len(names) == 2 else ""))
    for size in sizes:
        line = f"{size:>14} " + " ".join(
            f"{statistics.median(results[(n, size)]):>14.1f}" for n in names)
        if len(names) == 2:
            ratios = [q / s for q, s in zip(results[("llamaq", size)],
                                            results[("llama-server", size)], strict=True)]
            line += f"   {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
        print(line)


if __name__ == "__main__":
    main()
