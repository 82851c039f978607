"""The api pod's Sanic application class: Sanic's, with its task shutdown bounded.

Sanic 25.12's `shutdown_tasks` counts a float timeout down by 0.1 and tests it for truth
(2.0 - 0.1 * 20 is not 0.0), and its sleep between checks never runs (it calls
`run_until_complete` on the running loop, or looks for a running loop where there is none, and
suppresses the RuntimeError). So while any task is left in the app's registry at shutdown it
spins for ever at full CPU, ignoring SIGTERM: seen with several listeners (`--host
a,b,socket`) after `llamaq up` was killed. Here the wait is bounded by the clock and sleeps."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time

from sanic import Request, Sanic
from sanic.http import Stage
from sanic.server.protocols.http_protocol import HttpProtocol

from api.body import parse_ahead
from api.services import pod_services, services
from scheduler.contract.errors import AuthenticationFailed, InvalidRequest


class ApiRequest(Request):  # type: ignore[type-arg]
    """Sanic reads a body before any middleware runs; here a request without a valid key is
    answered 401 before its body (a client that sends headers and then nothing is turned
    away at once), and the body must arrive within --body-timeout (it had -to, 3600 s)."""

    async def receive_body(self) -> None:
        if self.body:
            return
        pod = services(self)
        if pod.refuses_key(self):
            raise AuthenticationFailed("Invalid API Key")
        timeout = pod.settings.body_timeout
        try:
            await asyncio.wait_for(super().receive_body(), timeout)
        except TimeoutError:
            raise InvalidRequest(f"the request body did not arrive within {timeout:g} s "
                                 "(--body-timeout)", status=408) from None
        # a big JSON body: parsed off the event loop, frozen until the request has ended
        self.ctx.frozen_body = await parse_ahead(self, pod.frozen_bodies)


class ApiProtocol(HttpProtocol):
    """Sanic's HTTP/1 protocol, with `-to, --timeout` as llama-server's: cpp-httplib's read and
    write timeouts on the socket, not a bound on the handler. Sanic's response timeout runs
    from the connection's last byte in or out, also while a handler computes; here it starts
    once the response has begun (Stage.RESPONSE): a client that stops reading its stream for
    --timeout s (pings go out every --sse-ping-interval) is let go, and a non-streamed
    generation that takes longer than --timeout is answered (scheduler/job_events.py bounds
    only the wait for a worker to take a job by --timeout)."""

    def check_timeouts(self) -> None:
        http = self.http
        if self._task and http is not None and http.stage is Stage.HANDLER:
            self._time = time.monotonic()  # Sanic's own clock (time.monotonic)
        super().check_timeouts()


class ApiApp(Sanic):  # type: ignore[type-arg]
    async def handle_request(self, request: Request) -> None:
        """Sanic's, and the release of a big body `ApiRequest` froze once the request ends."""
        try:
            await super().handle_request(request)
        finally:
            period = getattr(request.ctx, "frozen_body", None)
            if period is not None:
                request.ctx.frozen_body = None
                request.ctx.parsed_ahead = None
                pod_services(self).frozen_bodies.release(period)

    def shutdown_tasks(self, timeout: float | None = None, increment: float = 0.1) -> None:
        """Cancel every task but the server's and give them up to `timeout` seconds (the
        graceful shutdown timeout by default) to end; those still running are left behind."""
        for task in self.tasks:
            if task.get_name() != "RunServer":
                task.cancel()
        wait_s = self.config.GRACEFUL_SHUTDOWN_TIMEOUT if timeout is None else timeout
        deadline = time.monotonic() + max(0.0, float(wait_s))
        while self._task_registry and time.monotonic() < deadline:
            loop = _idle_loop()
            if loop is not None:  # the loop has stopped: let the cancelled tasks run to their end
                loop.run_until_complete(asyncio.sleep(increment))
            else:
                time.sleep(increment)
            self.purge_tasks()


HARD_STOP_MARGIN_S = 10.0
"""How long past its drain timeout a stopping pod may take before it is ended by force."""
EXIT_HARD_STOP = 3


def exit_by_force_after(seconds: float) -> None:
    """Whatever its libraries do on the way out, the process is gone `seconds` from now (a
    daemon timer: a clean exit before it never sees it)."""
    def end() -> None:
        logging.getLogger(__name__).error("still stopping %g s after the signal: exiting now",
                                          seconds)
        logging.shutdown()
        os._exit(EXIT_HARD_STOP)

    timer = threading.Timer(seconds, end)
    timer.daemon = True
    timer.start()


def _idle_loop() -> asyncio.AbstractEventLoop | None:
    """This thread's event loop when it exists and is not running (nor closed)."""
    try:
        asyncio.get_running_loop()
        return None
    except RuntimeError:
        pass
    try:
        loop = asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:
        return None
    return None if loop.is_closed() or loop.is_running() else loop
