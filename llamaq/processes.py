"""Entry points of the single-role processes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import ssl
import sys
from collections.abc import Coroutine
from typing import Any

from api.settings import ApiSettings
from llamaq.flag_lists import refuse_other_roles_flags
from llamaq.logs import prepare_process
from llamaq.pdeathsig import PARENT_PID_ENV, die_with_parent
from scheduler.common_settings import CommonSettings, redis_url_of

log = logging.getLogger(__name__)

LISTEN_BACKLOG = 2048
"""Connections the kernel queues for an api pod before it accepts them (Sanic's default is
100; uvicorn and gunicorn use 2048; the kernel caps it at net.core.somaxconn). A pod that
holds thousands of streams takes new ones in bursts, and its loop may be a moment late:
past the queue a connection is reset or waits out a SYN retry (issue 44: 29 of 2,000 slow
streams reset at connect during a 60 s ramp with 100)."""

def run_api(argv: list[str]) -> None:
    from sanic import Sanic
    from sanic.worker.loader import AppLoader

    from api.app import create_app, tools_config_of
    from api.chat.templates import validate_chat_template_setting
    from api.endpoints.vertex.api_router import VertexSettings
    from api.sanic_app import ApiProtocol

    refuse_other_roles_flags(argv, "api")
    settings = ApiSettings.from_args(argv)
    prepare_process(settings, "api")
    watch_parent()
    try:
        validate_chat_template_setting(settings)
        tools_config_of(settings)  # --tools names, --tools-runtime, --tools-root, MCP config
        if settings.router_mode():  # a missing --models-dir, a bad preset: stop now
            from api.router import catalog_sources
            from scheduler.catalog import load_catalog

            for entry in load_catalog(catalog_sources(settings)).entries.values():
                settings.with_preset(entry.options)  # a preset's api options: bad values stop
    except ValueError as exc:
        sys.exit(f"llamaq api: {exc}")
    vertex = VertexSettings.from_env(os.environ)
    port = vertex.port if vertex.enabled else settings.port  # AIP_HTTP_PORT wins
    hosts = listen_hosts(settings.host)
    if port == 0 and sum(not h.endswith(".sock") for h in hosts) > 1:
        sys.exit("llamaq api: --port 0 is not supported with multiple TCP addresses")
    loader = AppLoader(factory=lambda: create_app(settings, redis_url_of(settings)))
    app = loader.load()
    ssl = tls_context(settings)
    for host in hosts:  # one listener per address; a path ending in .sock is a UNIX socket
        where: dict[str, Any] = {"unix": host} if host.endswith(".sock") else (
            {"sock": shared_port_socket(host, port)} if settings.reuse_port
            else {"host": host, "port": port})
        app.prepare(**where, workers=max(1, settings.workers), ssl=ssl, protocol=ApiProtocol,
                    backlog=LISTEN_BACKLOG,
                    access_log=settings.verbosity() >= 4, motd=False,
                    single_process=settings.workers <= 1)
    if settings.workers <= 1:
        Sanic.serve_single(primary=app)
        exit_at_once()
    else:
        Sanic.serve(primary=app, app_loader=loader)


def tls_context(settings: ApiSettings) -> ssl.SSLContext | None:
    """The server's TLS context from --ssl-cert-file/--ssl-key-file, built here rather than by
    Sanic's certificate shorthand, which reads the certificate's subjectAltName and fails on a
    certificate without one (`openssl req -x509 -subj /CN=...`, which llama-server accepts)."""
    if not (settings.ssl_cert_file and settings.ssl_key_file):
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(settings.ssl_cert_file, settings.ssl_key_file)
    except (OSError, ssl.SSLError) as exc:
        sys.exit(f"llamaq api: cannot load --ssl-cert-file/--ssl-key-file: {exc}")
    return context


def shared_port_socket(host: str, port: int) -> socket.socket:
    """A listening socket with SO_REUSEPORT (--reuse-port): other processes may bind the same
    address and port, and the kernel spreads connections among them."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sys.exit(f"llamaq api: cannot listen on {host}:{port}: {exc}")
    sock.listen(LISTEN_BACKLOG)
    sock.set_inheritable(True)
    return sock


def listen_hosts(host: str) -> list[str]:
    """--host: comma-separated addresses and UNIX socket paths (ending in .sock)."""
    hosts = [h.strip() for h in host.split(",") if h.strip()]
    if not hosts:
        sys.exit("llamaq api: --host names no address")
    return hosts


def print_devices() -> None:
    """--list-devices: llama.cpp's offload devices, as llama-server prints them."""
    from worker.runtime.devices import device_list_text

    print(device_list_text(), end="", flush=True)


def prepare_worker_process() -> None:
    """What a worker process sets before it imports its engine: llama-cpp-python's package
    without its high-level half (numpy, jinja2, diskcache: worker/runtime/llama_package.py) and
    glibc's mmap threshold (worker/runtime/allocator.py), so that its memory is the model's, not
    Python's."""
    from worker.runtime.allocator import return_large_frees
    from worker.runtime.llama_package import bindings_only

    bindings_only()
    return_large_frees()


def run_worker(argv: list[str]) -> None:
    prepare_worker_process()  # first: before anything imports llama_cpp
    from worker.runtime.settings import WorkerSettings

    refuse_other_roles_flags(argv, "worker")
    settings = WorkerSettings.from_args(argv)  # before llama.cpp is even imported
    if settings.list_devices:
        print_devices()
        return

    prepare_process(settings, "worker")
    watch_parent()

    def serving(redis_url: str, stop: asyncio.Event) -> Coroutine[Any, Any, None]:
        if settings.simulate:  # no model: simulated engines (worker/simulate/)
            from worker.process.simulated import serve_simulated

            return serve_simulated(settings, redis_url, stop)
        if settings.router_mode():  # no model: a host that loads what the router asks for
            from worker.process.host import WorkerHost

            return WorkerHost(settings, argv).run(redis_url, stop)
        from worker.process.serve import serve

        return serve(settings, redis_url, stop)

    async def drain_on_signal() -> None:
        """SIGTERM/SIGINT: drain (up to --drain-timeout); a second one: stop now."""
        stop = asyncio.Event()
        task = asyncio.ensure_future(serving(redis_url_of(settings), stop))
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            if stop.is_set():
                task.cancel()
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(drain_on_signal())
    exit_at_once()


def run_scheduler(argv: list[str]) -> None:
    from scheduler.housekeeping import run_housekeeping

    refuse_other_roles_flags(argv, "scheduler")
    settings = CommonSettings.from_args(argv)
    prepare_process(settings, "scheduler")
    watch_parent()
    _run_until_signal(run_housekeeping(redis_url_of(settings), settings.model_id()))


def exit_at_once() -> None:
    """After a clean stop, leave without the interpreter's teardown (a second or more of
    module and llama.cpp clean-up on a busy machine, while a supervisor waits for us)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def watch_parent() -> None:
    """Under `llamaq up` (LLAMAQ_PARENT_PID set): if `up` dies, even by SIGKILL, the kernel
    sends this process SIGTERM (PR_SET_PDEATHSIG), so it drains and exits instead of living on
    as an orphan holding the model in memory."""
    parent = os.environ.get(PARENT_PID_ENV)
    if not parent:
        return
    die_with_parent()
    if os.getppid() != int(parent):  # `up` died before the request was made
        os.kill(os.getpid(), signal.SIGTERM)


def _run_until_signal(main: Coroutine[Any, Any, None]) -> None:
    """Run a coroutine; SIGTERM/SIGINT cancel it so that its `finally` blocks clean up."""

    async def runner() -> None:
        task = asyncio.ensure_future(main)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(runner())
