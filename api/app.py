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

from api.auth import is_public, load_api_keys, request_tenant
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
from api.sanic_app import HARD_STOP_MARGIN_S, ApiApp, ApiRequest, exit_by_force_after
from api.settings import ApiSettings
from api.tenants.config import UNLIMITED
from api.tenants.service import CURRENT, TenantDirectory, TenantService
from api.tools.service import ToolsConfig, ToolsService
from scheduler.contract.errors import AuthenticationFailed, LlamaqError, Unavailable
from scheduler.contract.limits import largest_body_limit
from scheduler.supervise import exit_when_done
from scheduler.tenant_limits import TenantLimits
from storage import open_store
from storage.lazy import LazyStore
from storage.results import ResultStore

log = logging.getLogger(__name__)

CLOSE_GRACE_S = 2.0
"""Once drained, how long Sanic waits for connections still busy before it drops them."""
EXIT_TASK_DIED = 70


def _exit_for_restart() -> None:
    """A background task the pod needs died: exit non-zero so that a supervisor restarts us."""
    logging.shutdown()
    os._exit(EXIT_TASK_DIED)


def tools_config_of(settings: ApiSettings) -> ToolsConfig | None:
    """The tools this pod serves (None: /tools answers 403), checked now."""
    if not settings.tools_on():
        return None
    return ToolsConfig.from_flags(settings.enabled_tools(), settings.tools_runtime,
                                  settings.tools_root, settings.mcp_servers_config,
                                  settings.mcp_servers_json)


def create_app(settings: ApiSettings, redis_url: str, name: str = "llamaq") -> Sanic:
    validate_chat_template_setting(settings)  # an unknown --chat-template stops the start
    ui = ui_blueprint(settings)  # so do a missing UI bundle or --path folder
    app = ApiApp(name, request_class=ApiRequest)
    app.config.REQUEST_TIMEOUT = settings.body_timeout  # to arrive (-to bounds the answer)
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
    try:  # a --tenants file that does not read or is bad stops the start
        directory = TenantDirectory(api_keys, settings.tenants, settings.s3_endpoint_url)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    app.ctx.tenant_directory = directory
    app.ctx.refuses_key = lambda request: request_tenant(request, directory,
                                                         settings.api_prefix) is None
    app.ctx.api_keys = api_keys if not directory.enabled else frozenset({"(tenants)"})
    tools_config = tools_config_of(settings)  # a bad --tools, runtime or MCP config stops it
    app.ctx.tools = None

    @app.before_server_start
    async def connect(app: Sanic) -> None:
        app.ctx.fleet = await Fleet.connect(redis_url, float(settings.timeout),
                                            settings.queue_max, settings.n_probs_max,
                                            settings.prefix_affinity,
                                            # one job per tenant: no coalescing
                                            settings.coalesce_embeddings
                                            and not directory.enabled,
                                            max(0, settings.migration_limit))
        exit_when_done(app.ctx.fleet.hub.reader, "event hub", _exit_for_restart)
        app.ctx.tenants = TenantService(directory, TenantLimits(app.ctx.fleet.redis))
        renewing = asyncio.create_task(app.ctx.tenants.renew_forever())
        exit_when_done(renewing, "tenant holds renewal", _exit_for_restart)
        app.ctx.store = LazyStore(lambda: open_store(settings.store_url,
                                                     settings.s3_endpoint_url))
        app.ctx.fleet.jobs.results = ResultStore(app.ctx.store)
        app.ctx.batch_driver = BatchDriver(app.ctx.fleet, settings, app.ctx.store,
                                           app.ctx.tenants)
        driving = asyncio.create_task(app.ctx.batch_driver.run())
        exit_when_done(driving, "batch driver", _exit_for_restart)
        if tools_config is not None:
            tools = ToolsService(tools_config)
            await tools.start()
            app.ctx.tools = tools
        features = [*(tools_config.features() if tools_config else []),
                    *(["MCP proxy (experimental)"] if settings.cors_proxy_on() else [])]
        if features:
            log.warning("security: %s enabled - do not expose to untrusted environments",
                        ", ".join(features))
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
        def on_hangup() -> None:  # the --tenants file again (off the loop: it may be on S3)
            app.add_task(asyncio.to_thread(directory.reload))

        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGHUP, on_hangup)

    async def drain_then_stop(app: Sanic) -> None:
        await app.ctx.batch_driver.close()  # another pod takes its batches over at once
        if app.ctx.tools is not None:  # MCP calls in flight end now, with an error
            await app.ctx.tools.close()
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
        if app.ctx.tools is not None:
            await app.ctx.tools.close()
        await app.ctx.fleet.close()

    @app.on_request
    async def authenticate(request: Request) -> HTTPResponse | None:
        if app.ctx.draining:
            return error_response(Unavailable("the server is shutting down",
                                              retry_after_s=1))
        if preflight_response := preflight(request, settings):
            return preflight_response
        service: TenantService = app.ctx.tenants
        if is_ui_route(request):  # the web UI's page and assets
            request.ctx.tenant = service.scope(UNLIMITED)
            return None
        tenant = request_tenant(request, directory, settings.api_prefix)
        if tenant is None:
            return error_response(AuthenticationFailed("Invalid API Key"))
        scope = service.scope(tenant)
        request.ctx.tenant = scope
        if directory.enabled:  # this request's task: the job client meters and limits it
            CURRENT.set(scope)
        if directory.enabled and request.method != "OPTIONS" \
                and not is_public(request.path, settings.api_prefix):
            try:
                await scope.take_request()
            except LlamaqError as error:
                return error_response(error)
        return None

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
