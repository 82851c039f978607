"""`llamaq up`: the whole service on one machine, with embedded defaults.

Uses the Redis at LLAMAQ_REDIS_URL when one answers there, else starts a private redis-server;
then runs one worker and the api as child processes with the same command line (each takes the
flags that concern it) and stops them all on SIGINT/SIGTERM.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import redis

from api.settings import ApiSettings
from llamaq.logs import setup_logging
from scheduler.config import select_args
from worker.settings import WorkerSettings

ROLES = (ApiSettings, WorkerSettings)


def run_up(argv: list[str]) -> None:
    if "-h" in argv or "--help" in argv:
        _help()
        return
    api_settings = ApiSettings.from_args(select_args(argv, ApiSettings, ROLES))
    WorkerSettings.from_args(select_args(argv, WorkerSettings, ROLES))  # fail fast on bad flags
    setup_logging(api_settings.verbosity(), api_settings.log_file, "up")
    children: list[subprocess.Popen[bytes]] = []
    redis_url = api_settings.redis_url
    if not redis_url or not _answers(redis_url):
        redis_process, redis_url = _start_redis(Path(api_settings.cache_dir).parent / "redis")
        children.append(redis_process)
    env = {**os.environ, "LLAMAQ_REDIS_URL": redis_url}
    me = [sys.executable, "-m", "llamaq"]
    children.append(subprocess.Popen([*me, "worker", *select_args(argv, WorkerSettings, ROLES)],
                                     env=env))
    children.append(subprocess.Popen([*me, "api", *select_args(argv, ApiSettings, ROLES)],
                                     env=env))
    print(f"llamaq: serving on http://{api_settings.host}:{api_settings.port} "
          f"(Redis {redis_url}); Ctrl-C stops", flush=True)
    _supervise(children)


def _help() -> None:
    print("usage: llamaq up [api flags] [worker flags]\n")
    ApiSettings.build_parser("llamaq up (api flags)").print_help()
    print()
    WorkerSettings.build_parser("llamaq up (worker flags)").print_help()


def _answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


def _start_redis(folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("llamaq: no Redis answers at LLAMAQ_REDIS_URL and redis-server is not installed"
                 " (apt-get install redis-server)")
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(folder)], stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + 10
    while not _answers(url):
        if time.monotonic() > deadline or process.poll() is not None:
            sys.exit("llamaq: redis-server did not start")
        time.sleep(0.05)
    return process, url


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _supervise(children: list[subprocess.Popen[bytes]]) -> None:
    stopping = False

    def stop(*_: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    while not stopping and all(c.poll() is None for c in children):
        time.sleep(0.2)
    for child in reversed(children):  # api first, Redis last
        if child.poll() is None:
            child.terminate()
        try:
            child.wait(timeout=15)
        except subprocess.TimeoutExpired:
            child.kill()
    failed = [c for c in children if c.returncode not in (0, -signal.SIGTERM, None)]
    sys.exit(1 if failed and not stopping else 0)
