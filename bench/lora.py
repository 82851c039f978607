"""LoRA throughput (issue 21): aggregate generated tok/s at 1, 4 and 8 clients with 0, 1 and 2
distinct adapters, llamaq beside llama-server, both started with the same model, flags and
two adapters (written by tests/tiny_lora.py from two seeds).

    .venv/bin/python bench/lora.py [--llama-server PATH] [--model GGUF] [--np 8]
        [--clients 1,4,8] [--seconds 20] [--repeats 3] [--n-predict 64] [--systems ...]

0 adapters: both adapters' global scales at 0 (POST /lora-adapters []) and requests without
`lora`; 1: every request `lora: [{id 0, scale 1}]`; 2: the clients alternate between adapter
0 and adapter 1 (llamaq decodes the two sets in turns; llama-server lets the first slot fix a
step's set). Each client sends greedy requests of `--n-predict` tokens (ignore_eos) one after
another for `--seconds`; a cell is the median over `--repeats` runs, with min-max as spread.
Not a test: run it on an otherwise idle machine (the lead measures; docs/speed.md).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.processes import free_port, running, server_env, wait_healthy  # noqa: E402
from storage import default_model_path  # noqa: E402
from tests.tiny_lora import write_lora  # noqa: E402

DEFAULT_LLAMA_SERVER = Path.home() / ".cache" / "llamaq-bench" / "bin" / "llama-server"
ADAPTER_SEEDS = (21, 22)
MODES = (0, 1, 2)
"""How many distinct adapters the requests of a run use."""


def lora_of(mode: int, client: int) -> list[dict[str, Any]] | None:
    if mode == 0:
        return None
    return [{"id": client % mode, "scale": 1.0}]


async def client_loop(http: httpx.AsyncClient, url: str, mode: int, client: int,
                      n_predict: int, until: float) -> int:
    """Requests one after another until `until`; the tokens generated."""
    body: dict[str, Any] = {"prompt": f"Client {client} tells a story:", "n_predict": n_predict,
                            "temperature": 0, "ignore_eos": True, "cache_prompt": True}
    lora = lora_of(mode, client)
    if lora is not None:
        body["lora"] = lora
    tokens = 0
    while time.monotonic() < until:
        response = await http.post(f"{url}/completion", json=body)
        response.raise_for_status()
        tokens += int(response.json()["tokens_predicted"])
    return tokens


async def measure(url: str, mode: int, clients: int, seconds: float, n_predict: int) -> float:
    """Aggregate tok/s of one run."""
    async with httpx.AsyncClient(timeout=600) as http:
        scales = [] if mode == 0 else [{"id": 0, "scale": 0.0}, {"id": 1, "scale": 0.0}]
        (await http.post(f"{url}/lora-adapters", json=scales)).raise_for_status()
        started = time.monotonic()
        until = started + seconds
        counts = await asyncio.gather(*(client_loop(http, url, mode, c, n_predict, until)
                                        for c in range(clients)))
        return sum(counts) / (time.monotonic() - started)


def command(system: str, llama_server: Path, model: Path, port: int, adapters: list[Path],
            n_parallel: int) -> list[str]:
    flags = ["-m", str(model), "-c", str(1024 * n_parallel), "-np", str(n_parallel),
             "--port", str(port), *(a for path in adapters for a in ("--lora", str(path)))]
    if system == "llama-server":
        return [str(llama_server), *flags]
    return [sys.executable, "-m", "llamaq", "up", *flags]


def run_system(system: str, args: argparse.Namespace, model: Path, adapters: list[Path],
               folder: Path) -> dict[tuple[int, int], list[float]]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cells: dict[tuple[int, int], list[float]] = {}
    cmd = command(system, args.llama_server, model, port, adapters, args.np)
    with running(cmd, folder / f"{system}.log", server_env()) as process:
        wait_healthy(url, process=process)
        for mode in MODES:
            for clients in args.clients:
                runs = [asyncio.run(measure(url, mode, clients, args.seconds, args.n_predict))
                        for _ in range(args.repeats)]
                cells[(mode, clients)] = runs
                print(f"  {system}: {mode} adapter(s), {clients} client(s): "
                      f"{statistics.median(runs):.1f} tok/s "
                      f"({min(runs):.1f}-{max(runs):.1f})", flush=True)
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-server", type=Path, default=DEFAULT_LLAMA_SERVER)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--np", type=int, default=8)
    parser.add_argument("--clients", type=lambda s: [int(c) for c in s.split(",")],
                        default=[1, 4, 8])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--n-predict", type=int, default=64)
    parser.add_argument("--systems", default="llamaq,llama-server")
    args = parser.parse_args()
    systems = args.systems.split(",")
    if "llama-server" in systems and not args.llama_server.is_file():
        sys.exit(f"no llama-server at {args.llama_server}: run bench/build_llama_server.sh")
    model = args.model or default_model_path(Path.home() / ".cache" / "llamaq-tests")
    with tempfile.TemporaryDirectory(prefix="llamaq-lora-bench-") as tmp:
        folder = Path(tmp)
        adapters = [write_lora(folder / f"lora-{seed}.gguf", seed=seed)
                    for seed in ADAPTER_SEEDS]
        results = {system: run_system(system, args, model, adapters, folder)
                   for system in systems}
    print("\nadapters clients " + " ".join(f"{s:>22}" for s in systems)
          + ("   llamaq/llama-server" if len(systems) == 2 else ""))
    for mode in MODES:
        for clients in args.clients:
            cells = [results[s][(mode, clients)] for s in systems]
            row = " ".join(f"{statistics.median(c):8.1f} ({min(c):5.1f}-{max(c):5.1f})"
                           for c in cells)
            ratio = ""
            if len(cells) == 2:
                ratios = [a / b for a in cells[0] for b in cells[1] if b]
                ratio = (f"   {statistics.median(ratios):.2f} "
                         f"({min(ratios):.2f}-{max(ratios):.2f})") if ratios else ""
            print(f"{mode:8d} {clients:7d} {row}{ratio}")


if __name__ == "__main__":
    main()
