"""The Sanic app factory of an api pod."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time

from sanic import Request, Sanic
from sanic.response import HTTPResponse

from api.auth import check_api_key, load_api_keys
from api.batch.driver import BatchDriver
from api.chat.templates import validate_chat_template_setting
from api.cors import add_allow_origin, preflight
from api.endpoints.families import FAMILIES
from api.endpoints.ui.api_router import is_ui_route, ui_blueprint
from api.endpoints.ui.config import ui_defaults
from api.endpoints.vertex.api_router import VertexSettings, add_predict_route
from api.errors import error_response, install_error_handler
from api.fleet import Fleet
from api.router import ModelRouter
from api.sanic_app import HARD_STOP_MARGIN_S, ApiApp, exit_by_force_after
from api.settings import ApiSettings
from scheduler.contract.errors import Unavailable
from scheduler.contract.limits import largest_body_limit
from scheduler.supervise import exit_when_done
from storage import open_store
from storage.lazy import LazyStore

log = logging.getLogger(__name__)

CLOSE_GRACE_S = 2.0
"""Once drained, how long Sanic waits for connections still busy before it drops them."""
EXIT_TASK_DIED = 70


def _exit_for_restart() -> None:
    """A background task the pod needs died: exit non-zero so that a supervisor restarts us."""
    logging.shutdown()
    os._exit(EXIT_TASK_DIED)


def create_app(settings: ApiSettings, redis_url: str, name: str = "llamaq") -> Sanic:
    validate_chat_template_setting(settings)  # an unknown --chat-template stops the start
    ui = ui_blueprint(settings)  # so do a missing UI bundle or --path folder
    app = ApiApp(name)
    app.config.REQUEST_TIMEOUT = settings.timeout
    app.config.RESPONSE_TIMEOUT = settings.timeout
    app.config.KEEP_ALIVE_TIMEOUT = 75
    app.config.GRACEFUL_SHUTDOWN_TIMEOUT = CLOSE_GRACE_S  # after our own drain (below)
    app.config.NOISY_EXCEPTIONS = False
    app.config.REQUEST_MAX_SIZE = largest_body_limit()  # each route has its own, below it
    app.ctx.settings = settings
    app.ctx.started_at = time.time()
    app.ctx.draining = False
    app.ctx.ui_settings = ui_defaults(settings)  # and unreadable --ui-config JSON
    api_keys = load_api_keys(settings.api_key, settings.api_key_file)

    @app.before_server_start
    async def connect(app: Sanic) -> None:
        app.ctx.fleet = await Fleet.connect(redis_url, float(settings.timeout),
                                            settings.queue_max, settings.n_probs_max,
                                            settings.prefix_affinity,
                                            settings.coalesce_embeddings)
        exit_when_done(app.ctx.fleet.hub.reader, "event hub", _exit_for_restart)
        app.ctx.store = LazyStore(lambda: open_store(settings.store_url,
                                                     settings.s3_endpoint_url))
        app.ctx.batch_driver = BatchDriver(app.ctx.fleet, settings, app.ctx.store)
        driving = asyncio.create_task(app.ctx.batch_driver.run())
        exit_when_done(driving, "batch driver", _exit_for_restart)
        app.ctx.router = None
        if settings.router_mode():
            router = await ModelRouter.create(settings, app.ctx.fleet.redis)
            app.ctx.router = router
            relay = asyncio.ensure_future(router.relay(app.ctx.fleet.redis))
            exit_when_done(relay, "model events relay", _exit_for_restart)
            app.ctx.startup_loads = asyncio.ensure_future(router.load_on_startup())

    @app.after_server_start
    async def drain_on_signal(app: Sanic) -> None:
        """SIGTERM/SIGINT (replacing Sanic's handlers, which stop the loop at once): refuse new
        requests (503, so a balancer sends them elsewhere), let the requests that wait for jobs
        finish up to --drain-timeout, then stop. A second signal stops at once."""
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            if app.ctx.draining:
                app.stop(terminate=False)
                return
            app.ctx.draining = True
            exit_by_force_after(settings.drain_timeout + HARD_STOP_MARGIN_S)
            app.add_task(drain_then_stop(app))

        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, on_signal)

    async def drain_then_stop(app: Sanic) -> None:
        await app.ctx.batch_driver.close()  # another pod takes its batches over at once
        jobs = app.ctx.fleet.jobs
        deadline = time.monotonic() + settings.drain_timeout
        log.info("draining: %d open requests have up to %g s", jobs.active,
                 settings.drain_timeout)
        while jobs.active and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        if jobs.active:
            log.warning("drain timeout: ending %d open requests", jobs.active)
            jobs.end_all(Unavailable("the server is shutting down"))
            await asyncio.sleep(CLOSE_GRACE_S)  # their error events go out
        app.stop(terminate=False)

    @app.after_server_stop
    async def disconnect(app: Sanic) -> None:
        await app.ctx.batch_driver.close()
        await app.ctx.fleet.close()

    @app.on_request
    async def authenticate(request: Request) -> HTTPResponse | None:
        if app.ctx.draining:
            return error_response(Unavailable("the server is shutting down",
                                              retry_after_s=1))
        if preflight_response := preflight(request, settings):
            return preflight_response
        if is_ui_route(request):  # the web UI's page and assets
            return None
        return check_api_key(request, api_keys, settings.api_prefix)

    @app.on_request
    async def route_by_model(request: Request) -> None:
        """Router mode: the model a request names (body `model`, or `?model=`), checked and
        loaded on demand; handlers read it with api.router.request_model."""
        router: ModelRouter | None = app.ctx.router
        if router is not None and request.method != "OPTIONS" and not is_ui_route(request):
            request.ctx.model_id = await router.route(request)

    @app.on_response
    async def cors(request: Request, response: HTTPResponse) -> None:
        add_allow_origin(request, response, settings)

    for family in FAMILIES:
        app.blueprint(family.blueprint, url_prefix=settings.api_prefix or None)
    app.blueprint(ui)  # its routes carry the prefix themselves (`/` is the prefix's root)
    vertex = VertexSettings.from_env(os.environ)
    if vertex.enabled:  # after every other route: /predict dispatches to them
        add_predict_route(app, vertex, settings.api_prefix)
    install_error_handler(app)
    return app
