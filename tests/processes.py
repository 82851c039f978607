"""Real processes for tests: redis-server and llamaq api/worker processes on free ports."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_redis(folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    binary = shutil.which("redis-server")
    assert binary, "redis-server is needed for the tests (apt-get install redis-server)"
    port = free_port()
    folder.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
         "no", "--dir", str(folder)], stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.monotonic() + 10
    while True:
        try:
            if redis.Redis.from_url(url).ping():
                return process, url
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@dataclass
class Fleet:
    """llamaq processes sharing one Redis and one store; stopped by `stop()`."""

    redis_url: str
    workdir: Path
    common: list[str]
    logs: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    api_urls: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    """More environment for every process (no test process reaches the Hugging Face Hub
    unless a test sets HF_HUB_OFFLINE=0 and HF_ENDPOINT to its local stand-in)."""

    def _spawn(self, role: str, args: list[str],
               env_more: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = open(self.logs / f"{role}-{len(self.processes)}.log", "wb")  # noqa: SIM115
        env = {"HF_HUB_OFFLINE": "1", **os.environ, **self.env, **(env_more or {}),
               "LLAMAQ_REDIS_URL": self.redis_url}
        process = subprocess.Popen([sys.executable, "-m", "llamaq", role, *self.common, *args],
                                   cwd=self.workdir, env=env, stdout=log, stderr=log)
        self.processes.append(process)
        return process

    def add_worker(self, *args: str,
                   env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        return self._spawn("worker", list(args), env)

    def add_api(self, *args: str) -> str:
        port = free_port()
        self._spawn("api", ["--port", str(port), *args])
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _answers(url), what=f"api at {url}")
        self.api_urls.append(url)
        return url

    def wait_healthy(self, url: str, timeout: float = 60) -> None:
        wait_until(lambda: httpx.get(f"{url}/health").status_code == 200, timeout,
                   what=f"healthy fleet behind {url}")

    def stop_process(self, process: subprocess.Popen[bytes]) -> None:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def stop(self) -> None:
        for process in reversed(self.processes):
            self.stop_process(process)

    def kill(self) -> None:
        """SIGKILL every process: the teardown of a test that leaves endless generations
        running, which a SIGTERM would let go on for the stop's 15 s (the drain), all CPU."""
        for process in self.processes:
            if process.poll() is None:
                process.kill()
        for process in self.processes:
            process.wait()


def _answers(url: str) -> bool:
    try:
        httpx.get(f"{url}/health", timeout=1)
        return True
    except httpx.HTTPError:
        return False


def wait_until(check: object, timeout: float = 30, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():  # type: ignore[operator]
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.1)
