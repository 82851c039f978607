"""CPU a /v1/embeddings request costs the fleet's hop: `llamaq up --embedding` on MiniLM,
`--requests` one-input requests from `--clients` clients (this process) after 200 to warm up;
utime+stime of the api process, the worker (and its threads) and redis-server from /proc over
them, and Redis commands a request from INFO commandstats. A measure that holds on a shared box,
where throughput ratios against llama-server do not (docs/speed.md, Embeddings).

    .venv/bin/python bench/embedding_cpu.py [--requests 1500] [--clients 4] [--py-spy DIR]

`--py-spy DIR`: py-spy (--gil) profiles of the api and the worker during the load, as raw
stacks in DIR.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import redis

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.embeddings import minilm_path, texts  # noqa: E402
from bench.processes import free_port, running, server_env, wait_healthy  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
BIN = Path(sys.executable).parent
"""llamaq and py-spy: beside this Python (the venv's)."""


def children(pid: int) -> dict[int, str]:
    """Every descendant of `pid`: its command line."""
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid=,args="], capture_output=True,
                         text=True, check=True).stdout
    rows = [line.split(None, 2) for line in out.splitlines()]
    found: dict[int, str] = {}
    todo = [str(pid)]
    while todo:
        parent = todo.pop()
        for row in rows:
            if len(row) == 3 and row[1] == parent:
                found[int(row[0])] = row[2]
                todo.append(row[0])
    return found


def cpu_s(path: str) -> float:
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def switches(path: str) -> int:
    return sum(int(line.split()[1]) for line in Path(path).read_text().splitlines()
               if "ctxt_switches" in line)


def threads(pid: int) -> dict[str, tuple[float, int]]:
    """CPU seconds and context switches of each thread of `pid`."""
    found = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            found[tid] = (cpu_s(f"/proc/{pid}/task/{tid}/stat"),
                          switches(f"/proc/{pid}/task/{tid}/status"))
        except OSError:  # ended meanwhile
            continue
    return found


async def load(url: str, n: int, clients: int) -> None:
    queue: asyncio.Queue[str] = asyncio.Queue()
    for text in texts(n):
        queue.put_nowait(text)
    async with httpx.AsyncClient(timeout=600) as client:
        async def one_client() -> None:
            while not queue.empty():
                response = await client.post(f"{url}/v1/embeddings", json={
                    "input": [queue.get_nowait()], "encoding_format": "float"})
                response.raise_for_status()
        await asyncio.gather(*(one_client() for _ in range(clients)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--py-spy", type=Path, dest="py_spy")
    args = parser.parse_args()
    n, port = args.requests, free_port()
    cmd = [str(BIN / "llamaq"), "up", "--embedding", "-m",
           str(minilm_path()), "--port", str(port)]
    log = Path(tempfile.mkdtemp(prefix="llamaq-embedding-cpu-")) / "up.log"
    with running(cmd, log, server_env()) as process:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url)
        asyncio.run(load(url, 200, args.clients))  # warm-up, the thread trial
        roles: dict[str, int] = {}
        redis_port = 0
        for pid, line in children(process.pid).items():
            if "redis-server" in line:
                roles["redis"], redis_port = pid, int(line.split(":")[-1].split()[0])
            elif " worker " in line:
                roles["worker"] = pid
            elif " api " in line:
                roles["api"] = pid
        stats = redis.Redis(port=redis_port)
        stats.config_resetstat()
        spies = [subprocess.Popen(
            [str(BIN / "py-spy"), "record", "--nonblocking", "--gil", "-r", "200", "-f", "raw",
             "-o", str(args.py_spy / f"{role}.txt"), "-p", str(roles[role])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for role in (("api", "worker") if args.py_spy else ())]
        before = {role: cpu_s(f"/proc/{pid}/stat") for role, pid in roles.items()}
        worker_before = threads(roles["worker"])
        load_average = os.getloadavg()
        asyncio.run(load(url, n, args.clients))
        after = {role: cpu_s(f"/proc/{pid}/stat") for role, pid in roles.items()}
        worker_after = threads(roles["worker"])
        for spy in spies:
            spy.send_signal(signal.SIGINT)
            spy.wait(timeout=60)
        commands: dict[str, dict[str, int]] = stats.info("commandstats")  # type: ignore[assignment]
    per_thread = sorted(
        ((round((cpu - worker_before.get(tid, (0.0, 0))[0]) / n * 1e6),
          round((sw - worker_before.get(tid, (0.0, 0))[1]) / n, 2),
          "main" if tid == str(roles["worker"]) else tid)
         for tid, (cpu, sw) in worker_after.items()), reverse=True)
    print(json.dumps({
        "requests": n, "clients": args.clients,
        "load_average": [round(x, 1) for x in load_average],
        "cpu_us_a_request": {role: round((after[role] - before[role]) / n * 1e6)
                             for role in roles},
        "worker_threads_us_switches": [t for t in per_thread if t[0] or t[1]],
        "redis_commands_a_request": round(sum(c["calls"] for c in commands.values()) / n, 2),
        "by_command": {name.removeprefix("cmdstat_"): round(c["calls"] / n, 2)
                       for name, c in sorted(commands.items())},
        "at": time.strftime("%Y-%m-%d %H:%M:%S"),
    }, indent=1))


if __name__ == "__main__":
    main()
