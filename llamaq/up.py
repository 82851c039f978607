"""`llamaq up`: the whole service on one machine, with embedded defaults.

Uses the Redis at LLAMAQ_REDIS_URL when one answers there, else starts a private redis-server;
then runs one worker and the api as child processes with the same command line (each takes the
flags that concern it), and supervises them (llamaq/supervisor.py): a worker that dies is
restarted with backoff; SIGINT/SIGTERM drains and stops everything; the children die with `up`
even when it is killed (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import redis

from api.settings import ApiSettings
from llamaq.logs import prepare_process
from llamaq.pdeathsig import PARENT_PID_ENV, die_with_parent
from llamaq.processes import print_devices
from llamaq.supervisor import Child, Supervisor
from scheduler.config.command_line import FlagError, split_args
from storage.redact import redacted_url
from worker.runtime.settings import WorkerSettings

ROLES = (ApiSettings, WorkerSettings)


def run_up(argv: list[str]) -> None:
    if "-h" in argv or "--help" in argv or "--usage" in argv:
        _help()
        return
    if "--version" in argv:
        ApiSettings.from_args(["--version"])
    try:
        parts = split_args(argv, ROLES)
    except FlagError as exc:
        print(f"usage: llamaq up [api flags] [worker flags]\nllamaq up: error: {exc}",
              file=sys.stderr)
        sys.exit(2)
    api_settings = ApiSettings.from_args(parts[ApiSettings])
    worker_args = parts[WorkerSettings]
    if api_settings.router_mode() and WorkerSettings.from_args(worker_args).simulate:
        # no model named: the simulated fleet serves one named "simulated" (worker/simulate/)
        parts = split_args([*argv, "-m", SIMULATED_MODEL], ROLES)
        api_settings = ApiSettings.from_args(parts[ApiSettings])
        worker_args = parts[WorkerSettings]
    if "--list-devices" in worker_args:
        print_devices()
        return
    if api_settings.router_mode():  # the worker waits to be told which model to load
        worker_args = [*worker_args, "--no-default-model"]
    WorkerSettings.from_args(worker_args)  # fail fast on bad flags
    prepare_process(api_settings, "up")
    supervisor = Supervisor(api_settings.drain_timeout)
    supervisor.handle_signals()
    redis_url = api_settings.redis_url
    if not redis_url or not _answers(redis_url):
        redis_process, redis_url = _start_redis(Path(api_settings.cache_dir).parent / "redis")
        supervisor.adopt(Child("redis", [], redis_process))
    api_args, api_secrets = hide_secrets(parts[ApiSettings])
    worker_args, worker_secrets = hide_secrets(worker_args)
    env = {**os.environ, **api_secrets, **worker_secrets, "LLAMAQ_REDIS_URL": redis_url,
           PARENT_PID_ENV: str(os.getpid())}
    me = [sys.executable, "-m", "llamaq"]
    for name in worker_names(api_settings):
        supervisor.start(name, [*me, "worker", *worker_args], env, restart=True)
    supervisor.start("api", [*me, "api", *api_args], env)
    scheme = "https" if api_settings.ssl_cert_file else "http"
    mode = " in router mode" if api_settings.router_mode() else ""
    print(f"llamaq: serving on {scheme}://{api_settings.host}:{api_settings.port} "
          f"(Redis {redacted_url(redis_url)}){mode}; Ctrl-C stops", flush=True)
    sys.exit(supervisor.run())


SIMULATED_MODEL = "simulated"
"""The model name of `llamaq up --simulate` without -m."""
SECRET_FLAGS = {"--api-key": "LLAMA_API_KEY", "-hft": "HF_TOKEN", "--hf-token": "HF_TOKEN",
                "--redis-url": "LLAMAQ_REDIS_URL"}
"""Flags whose values are secrets, and the environment variable each role reads instead."""


def hide_secrets(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """A child's command line without its secrets (every user sees argv in `ps`), and the
    environment that carries them instead (flag over env holds: the flag's value is put
    there). Several --api-key flags become one comma-separated LLAMA_API_KEY."""
    rest: list[str] = []
    env: dict[str, str] = {}
    keys: list[str] = []
    words = iter(argv)
    for word in words:
        name, eq, value = word.partition("=")
        if name not in SECRET_FLAGS:
            rest.append(word)
            continue
        value = value if eq else next(words, "")
        if name == "--api-key":
            keys.append(value)
        else:
            env[SECRET_FLAGS[name]] = value
    if keys:
        env["LLAMA_API_KEY"] = ",".join(keys)
    return rest, env


ROUTER_WORKERS_UNBOUNDED = 4
"""Worker processes of `llamaq up` in router mode with --models-max 0 (no bound)."""


def worker_names(settings: ApiSettings) -> list[str]:
    """The worker processes `llamaq up` runs: one for its model; in router mode one per model
    it may hold at once (--models-max), as llama-server's router runs a child per loaded
    model. A worker without a model waits to be told which to load (~75 MB each)."""
    if not settings.router_mode():
        return ["worker"]
    n = settings.models_max if settings.models_max > 0 else ROUTER_WORKERS_UNBOUNDED
    return [f"worker-{i}" for i in range(1, n + 1)]


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
         "--dir", str(folder)], stdout=subprocess.DEVNULL,
        preexec_fn=die_with_parent)  # our Redis does not outlive us
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
