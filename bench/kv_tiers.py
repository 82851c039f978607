"""KV cache tiers (issue 24): the host-memory prompt cache. One worker with `-np 2` answers
questions on 8 distinct long documents in rotation (document 0, 1, ..., 7, 0, 1, ...): with
`--cache-ram 512` an evicted document's state comes back from host memory, with
`--cache-ram 0` it is prefilled again. llamaq beside llama-server, both started with the same
model and flags.

    .venv/bin/python bench/kv_tiers.py [--llama-server PATH] [--model GGUF] [--rounds 3]
        [--words 600] [--cache-ram 512,0] [--systems llamaq,llama-server] [--threads 2]
    .venv/bin/python bench/kv_tiers.py --memory [--systems ...]

`--memory`: the issue's third figure instead: each system started with `-c 32768 -np 4
-ub 512`, one request, then the resident memory (VmRSS, and its anonymous and file-backed
parts) of llama-server against that of llamaq's worker process.

A request is `document i` + a question, greedy, `n_predict` 8, streamed; its TTFT is measured
by the client (request sent to the first token), and it is a hit when its `timings.cache_n`
covers at least half of its prompt. The first round only fills the caches and is left out.
The report: per system and --cache-ram, the hit rate and the median TTFT (with min-max).
Not a test: run it on an otherwise idle machine (the lead measures; docs/speed.md); a smoke
run: `--rounds 2 --words 150 --systems llamaq --cache-ram 512,0`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.processes import free_port, running, server_env, wait_healthy  # noqa: E402
from storage import default_model_path  # noqa: E402

DEFAULT_LLAMA_SERVER = Path.home() / ".cache" / "llamaq-bench" / "bin" / "llama-server"
N_DOCUMENTS = 8
WORDS = ("river", "stone", "lamp", "orchard", "copper", "violet", "harbor", "meadow", "signal",
         "ember", "lantern", "glacier", "thimble", "saddle", "quartz", "willow")


def document(index: int, n_words: int) -> str:
    body = " ".join(f"{WORDS[(i * 7 + index * 5) % len(WORDS)]}{(i * 31 + index) % 97}"
                    for i in range(n_words))
    return f"Document {index}.\n{body}\n\nQuestion: which word comes first? Answer:"


def command(system: str, llama_server: Path, model: Path, port: int, cache_ram: int,
            threads: int) -> list[str]:
    flags = ["-m", str(model), "-np", "2", "-c", "8192", "-t", str(threads),
             "--cache-ram", str(cache_ram), "--port", str(port)]
    if system == "llama-server":
        return [str(llama_server), *flags]
    return [sys.executable, "-m", "llamaq", "up", "--no-warmup", *flags]


def ask(http: httpx.Client, url: str, prompt: str) -> tuple[float, int, int]:
    """(TTFT in ms, cache_n, prompt tokens) of one streamed greedy request."""
    body = {"prompt": prompt, "n_predict": 8, "temperature": 0, "ignore_eos": True,
            "stream": True, "cache_prompt": True}
    started = time.perf_counter()
    ttft = 0.0
    timings: dict[str, float] = {}
    with http.stream("POST", f"{url}/completion", json=body, timeout=600,
                     headers={"Connection": "close"}) as reply:  # llama-server drops idle ones
        for line in reply.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if not ttft and event.get("content"):
                ttft = (time.perf_counter() - started) * 1000
            if event.get("stop"):
                timings = event.get("timings", {})
    cache_n, prompt_n = int(timings.get("cache_n", 0)), int(timings.get("prompt_n", 0))
    return ttft, cache_n, cache_n + prompt_n


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    """A resident-memory line of /proc/PID/status in MiB: VmRSS (the whole), RssAnon (heap,
    KV cache, buffers), RssFile (the mapped model file, libraries)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return 0.0


def worker_pid(group: int) -> int:
    """The `llamaq worker` process that `llamaq up` (session `group`) started."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(stat[3]) == group and b"worker" in argv:  # stat[3]: the session id
            return int(entry.name)
    raise RuntimeError("no llamaq worker process found")


def measure_memory(system: str, args: argparse.Namespace, model: Path, folder: Path) -> float:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = command(system, args.llama_server, model, port, 0, args.threads)
    cmd[cmd.index("-c") + 1] = "32768"
    cmd[cmd.index("-np") + 1] = "4"
    cmd += ["-ub", "512"]
    with running(cmd, folder / f"{system}-memory.log", server_env()) as process, \
            httpx.Client() as http:
        wait_healthy(url, process=process)
        ask(http, url, document(0, args.words))
        pid = process.pid if system == "llama-server" else worker_pid(process.pid)
        rss, anon, mapped = (rss_mib(pid, f) for f in ("VmRSS", "RssAnon", "RssFile"))
    print(f"  {system}: RSS {rss:.0f} MiB (anonymous {anon:.0f}, file-backed {mapped:.0f})",
          flush=True)
    return rss


def run_system(system: str, cache_ram: int, args: argparse.Namespace, model: Path,
               folder: Path) -> tuple[float, list[float]]:
    """(hit rate, TTFTs) after the first round."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = command(system, args.llama_server, model, port, cache_ram, args.threads)
    documents = [document(i, args.words) for i in range(N_DOCUMENTS)]
    hits, ttfts = 0, []
    with running(cmd, folder / f"{system}-{cache_ram}.log", server_env()) as process, \
            httpx.Client() as http:
        wait_healthy(url, process=process)
        for round_no in range(args.rounds):
            for prompt in documents:
                ttft, cache_n, n_prompt = ask(http, url, prompt)
                if round_no == 0:
                    continue
                hits += cache_n >= n_prompt // 2
                ttfts.append(ttft)
    rate = hits / max(1, len(ttfts))
    print(f"  {system} --cache-ram {cache_ram}: hit rate {rate:.2f}, median TTFT "
          f"{statistics.median(ttfts):.0f} ms ({min(ttfts):.0f}-{max(ttfts):.0f})", flush=True)
    return rate, ttfts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-server", type=Path, default=DEFAULT_LLAMA_SERVER)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--words", type=int, default=600,
                        help="words per document (about 2.4 tokens each)")
    parser.add_argument("--cache-ram", type=lambda s: [int(c) for c in s.split(",")],
                        default=[512, 0])
    parser.add_argument("--systems", default="llamaq,llama-server")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--memory", action="store_true",
                        help="the RSS figure (-c 32768 -np 4) instead of the rotation")
    args = parser.parse_args()
    if args.rounds < 2:
        sys.exit("--rounds must be at least 2 (the first one fills the caches)")
    systems = args.systems.split(",")
    if "llama-server" in systems and not args.llama_server.is_file():
        sys.exit(f"no llama-server at {args.llama_server}: run bench/build_llama_server.sh")
    model = args.model or default_model_path(Path.home() / ".cache" / "llamaq-tests")
    if args.memory:
        with tempfile.TemporaryDirectory(prefix="llamaq-kv-bench-") as tmp:
            rss = {s: measure_memory(s, args, model, Path(tmp)) for s in systems}
        if len(rss) == 2 and rss.get("llama-server"):
            print(f"\nRSS llamaq worker / llama-server: "
                  f"{rss['llamaq'] / rss['llama-server']:.2f}")
        return
    with tempfile.TemporaryDirectory(prefix="llamaq-kv-bench-") as tmp:
        results = {(s, c): run_system(s, c, args, model, Path(tmp))
                   for s in systems for c in args.cache_ram}
    print(f"\n{N_DOCUMENTS} documents of {args.words} words in rotation, -np 2, "
          f"{args.rounds - 1} measured round(s)")
    print(f"{'system':>14} {'--cache-ram':>11} {'hit rate':>9} {'median TTFT ms':>15}")
    for (system, cache_ram), (rate, ttfts) in results.items():
        print(f"{system:>14} {cache_ram:>11} {rate:>9.2f} {statistics.median(ttfts):>15.0f}")


if __name__ == "__main__":
    main()
