"""The Sanic app of an api pod, made of named parts: its services, one typed object
(api/services.py) put on the app once here; its middleware (middleware.py); its start, drain
and stop (lifecycle.py); its routes (routes.py)."""

from __future__ import annotations

from sanic import Sanic

from api.app.lifecycle import CLOSE_GRACE_S, add_lifecycle
from api.app.middleware import add_middleware
from api.app.routes import add_routes
from api.auth import load_api_keys
from api.chat.templates import validate_chat_template_setting
from api.endpoints.ui.api_router import ui_blueprint
from api.endpoints.ui.config import ui_defaults
from api.model_downloads import PodDownloads
from api.sanic_app import ApiApp, ApiRequest
from api.services import PodServices
from api.settings import ApiSettings
from api.tenants.service import TenantDirectory
from api.tools.service import ToolsConfig
from scheduler.contract.limits import largest_body_limit
from storage import open_store
from storage.lazy import LazyStore


def tools_config_of(settings: ApiSettings) -> ToolsConfig | None:
    """The tools this pod serves (None: /tools answers 403), checked now."""
    if not settings.tools_on():
        return None
    return ToolsConfig.from_flags(settings.enabled_tools(), settings.tools_runtime,
                                  settings.tools_root, settings.mcp_servers_config,
                                  settings.mcp_servers_json, settings.tools_runtime_allow,
                                  settings.tools_ssh_config)


def configure(app: Sanic, settings: ApiSettings) -> None:
    """Sanic's settings of the pod's requests."""
    app.config.REQUEST_TIMEOUT = settings.body_timeout  # to arrive (-to bounds the answer)
    app.config.RESPONSE_TIMEOUT = settings.timeout
    app.config.KEEP_ALIVE_TIMEOUT = 75
    app.config.GRACEFUL_SHUTDOWN_TIMEOUT = CLOSE_GRACE_S  # after our own drain (lifecycle.py)
    app.config.NOISY_EXCEPTIONS = False
    app.config.REQUEST_MAX_SIZE = largest_body_limit()  # each route has its own, below it
    app.config.API_PREFIX = settings.api_prefix  # the routes' limits are by path under it


def pod_services_of(settings: ApiSettings) -> PodServices:
    """The pod's services before it connects; an unreadable --ui-config JSON, or a --tenants
    file that does not read or is bad, stops the start."""
    ui_settings = ui_defaults(settings)
    api_keys = load_api_keys(settings.api_key, settings.api_key_file)
    try:
        directory = TenantDirectory(api_keys, settings.tenants, settings.s3_endpoint_url)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    store = LazyStore(lambda: open_store(settings.store_url, settings.s3_endpoint_url))
    return PodServices(settings, directory,
                       api_keys if not directory.enabled else frozenset({"(tenants)"}),
                       ui_settings, store, PodDownloads(settings))


def create_app(settings: ApiSettings, redis_url: str, name: str = "llamaq") -> Sanic:
    validate_chat_template_setting(settings)  # an unknown --chat-template stops the start
    ui = ui_blueprint(settings)  # so do a missing UI bundle or --path folder
    app = ApiApp(name, request_class=ApiRequest)
    configure(app, settings)
    pod = pod_services_of(settings)
    tools_config = tools_config_of(settings)  # a bad --tools, runtime or MCP config stops it
    app.ctx.services = pod
    add_lifecycle(app, pod, redis_url, tools_config)
    add_middleware(app)
    add_routes(app, settings, ui)
    return app
