"""The web UI: the built bundle (or the `--path` folder) under `--api-prefix`, public even when
an API key is set (the calls the page makes carry the key), with ETags and caching headers."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sanic import Blueprint, Request
from sanic.response import HTTPResponse, raw, redirect

from api.endpoints.ui.bundle import REVALIDATE, StaticFile, load_bundle, resolve_in, static_file
from api.endpoints.ui.fleet_link import with_fleet_link
from api.routing import Routes
from api.settings import ApiSettings
from scheduler.contract.errors import NotFound

ISOLATION = {"Cross-Origin-Embedder-Policy": "require-corp",
             "Cross-Origin-Opener-Policy": "same-origin"}
"""Sent with the page, as llama-server sends them."""
SW_REMOVE = static_file("sw.js", b"""\
self.addEventListener('install', () => self.skipWaiting());
self.addEventListener('activate', (e) => e.waitUntil((async () => {
    await self.registration.unregister();
    for (const key of await caches.keys()) await caches.delete(key);
    for (const c of await self.clients.matchAll({ type: 'window' })) c.navigate(c.url);
})()));
""", REVALIDATE)
"""With --no-ui or --path, a browser that used the built-in UI still has its service worker:
its update check gets this one, which removes itself (as llama-server does)."""


def wants_page(request: Request) -> bool:
    """A browser's navigation (Accept names text/html), not a script's fetch (`*/*`)."""
    return "text/html" in request.headers.get("accept", "")


def is_ui_route(request: Request, ui: bool) -> bool:
    """Whether the request is for the UI (no API key needed): its page and assets, or (with the
    UI on, `ui`) a page a JSON route shows a browser (`ctx_page=True`: the fleet page)."""
    route = request.route
    if route is None:
        return False
    if getattr(route.ctx, "ui_public", False):
        return True
    return ui and bool(getattr(route.ctx, "page", False)) and wants_page(request)


async def send(request: Request, file: StaticFile, page: bool = False) -> HTTPResponse:
    headers = {"ETag": file.etag, "Cache-Control": file.cache_control, "Vary": "Accept-Encoding"}
    if page:
        headers.update(ISOLATION)
    if file.etag in {t.strip() for t in request.headers.get("if-none-match", "").split(",")}:
        return HTTPResponse(status=304, headers=headers)
    body = file.body
    if file.compressible and "gzip" in request.headers.get("accept-encoding", ""):
        body = await asyncio.to_thread(lambda: file.gzipped)  # made once, off the event loop
        headers["Content-Encoding"] = "gzip"
    if request.method == "HEAD":
        headers["Content-Length"] = str(len(body))
        return HTTPResponse(status=200, headers=headers, content_type=file.content_type)
    return raw(body, content_type=file.content_type, headers=headers)


def ui_blueprint(settings: ApiSettings) -> Blueprint:
    """The UI's routes for these settings (with --no-ui only the removing sw.js: `/` is a 404).
    """
    routes = Routes("ui", strict_slashes=True)
    ui = routes.blueprint
    prefix = settings.api_prefix.rstrip("/")
    methods = ["GET", "HEAD"]
    if not settings.ui:
        async def remove_worker(request: Request) -> HTTPResponse:
            return await send(request, SW_REMOVE)

        routes.route(methods, f"{prefix}/sw.js", name="ui_sw_remove",
                     ctx_ui_public=True)(remove_worker)
        return ui

    if prefix:
        async def to_slash(request: Request) -> HTTPResponse:
            return redirect(prefix + "/", status=308)

        # The page's URLs are relative to it: under a prefix it must be seen at `prefix/`.
        routes.route(methods, prefix, name="ui_redirect", ctx_ui_public=True)(to_slash)

    if settings.path:
        folder = Path(settings.path)
        if not folder.is_dir():
            raise ValueError(f"--path {settings.path!r} is not a folder")

        async def from_folder(request: Request, rest: str = "") -> HTTPResponse:
            found = resolve_in(folder, rest)
            if found is None:
                if rest == "sw.js":
                    return await send(request, SW_REMOVE)
                raise NotFound("File Not Found")
            return await send(request, static_file(found.name, found.read_bytes(), REVALIDATE))

        for route in ("/", "/<rest:path>"):
            routes.route(methods, prefix + route, name=f"ui_path{route.count('<')}",
                         ctx_ui_public=True)(from_folder)
        return ui

    bundle = load_bundle()
    page = static_file("index.html", with_fleet_link(bundle["index.html"].body), REVALIDATE)
    bundle[""] = bundle["index.html"] = page
    for relative, file in bundle.items():

        async def bundled(request: Request, file: StaticFile = file,
                          page: bool = relative in ("", "index.html")) -> HTTPResponse:
            return await send(request, file, page)

        name = "ui_" + (relative or "index").replace("/", "_").replace(".", "_").replace("-", "_")
        routes.route(methods, f"{prefix}/{relative}", name=name, ctx_ui_public=True)(bundled)
    return ui
