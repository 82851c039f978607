"""The servers a benchmark starts (llamaq up, llama-server): a free port, the environment, the
process (its whole group stopped on the way out) and the wait for GET /health."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def server_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without LLAMAQ_REDIS_URL (so `llamaq up` starts its own private Redis),
    with `extra` over it."""
    env = {k: v for k, v in os.environ.items() if k != "LLAMAQ_REDIS_URL"}
    env.update(extra or {})
    return env


@contextmanager
def running(cmd: list[str], log: Path,
            env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """`cmd` in a session of its own, its output to `log`; stopped on the way out."""
    with log.open("wb") as out:
        process = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
        try:
            yield process
        finally:
            stop(process)


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, up to 30 s to exit, then SIGKILL to what is left of its group (llamaq's
    worker, api and Redis)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            print(f"  pid {process.pid} ignored SIGTERM for 30 s: killing its group", flush=True)
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


def wait_healthy(url: str, timeout_s: float = 180,
                 process: subprocess.Popen[bytes] | None = None) -> float:
    """Seconds until GET /health is 200; RuntimeError if `process` exits first, TimeoutError
    past `timeout_s`."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"exited with code {process.returncode} before /health was 200")
        with suppress(httpx.HTTPError):
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return time.monotonic() - start
        time.sleep(0.2)
    raise TimeoutError(f"{url}/health is not 200 after {timeout_s:.0f} s")
