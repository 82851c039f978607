"""ours (issue 43): cross-site requests do not change the fleet or run tools. A route registered
with `guarded=True` (/tools, /cors-proxy, model loads and downloads, LoRA scales, slot actions,
deletions: api/routing.py) refuses a request a browser sent for a page of another origin:

- a request with neither `Origin` nor a `Sec-Fetch-Site` header is not a browser's (curl, an
  SDK, another service): it passes, as before;
- a browser's request must name the pod by a `Host` it knows as its own (an IP address,
  `localhost`, --host, or the host of an origin --cors-origins lists), so that a page whose
  name was rebound to the pod's address (DNS rebinding) is refused;
- its `Origin` must be the pod's own (same scheme, host and port as `Host`) or one
  --cors-origins lists (`localhost` for the local ones); `*` does not cover these routes: a
  site that may drive them is named;
- without `Origin`, a `Sec-Fetch-Site` of `cross-site` or `same-site` (a link, an image, a
  form of another site) is refused.

Browsers send `Origin` with every cross-origin request and every POST, so llama-server's own
web UI and clients keep working; the refusal is a 403 `permission_error`."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from urllib.parse import urlsplit

from api.cors import is_local_origin
from api.settings import ApiSettings

LOCAL_NAMES = frozenset({"localhost"})
WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::"})


def _host_name(host: str) -> str:
    """The name of a `Host` header (`[::1]:9931` → `::1`), lowercased."""
    try:
        return (urlsplit(f"//{host}").hostname or "").lower()
    except ValueError:
        return ""


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def listed_origins(settings: ApiSettings) -> list[str]:
    """--cors-origins as given (or its tools default, `localhost`), less `*`."""
    if "cors_origins" in settings.model_fields_set:
        given = settings.cors_origins
    else:
        given = ["localhost"] if settings.tools_on() else []
    return [o.rstrip("/") for o in given if o and o != "*"]


def own_host(host: str, settings: ApiSettings) -> bool:
    name = _host_name(host)
    if not name:
        return False
    if _is_ip(name) or name in LOCAL_NAMES or name.endswith(".localhost"):
        return True
    if settings.host not in WILDCARD_BINDS and name == settings.host.lower():
        return True
    return any(name == (urlsplit(o).hostname or "").lower() for o in listed_origins(settings)
               if "://" in o)


def origin_allowed(origin: str, host: str, settings: ApiSettings) -> bool:
    """Listed, or the pod's own: the origin's host and port are the `Host` header's (its
    scheme is not compared: a TLS proxy in front changes it, and the host is checked)."""
    origin = origin.rstrip("/")
    listed = listed_origins(settings)
    if origin in listed or ("localhost" in listed and is_local_origin(origin)):
        return True
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()


def refusal(headers: Mapping[str, str], settings: ApiSettings) -> str | None:
    """Why a guarded route refuses this request (None: it may go on)."""
    origin = headers.get("origin", "")
    fetch_site = headers.get("sec-fetch-site", "")
    if not origin and not fetch_site:
        return None
    host = headers.get("host", "")
    if not own_host(host, settings):
        return (f"host not allowed: {host} (a browser reaching the pod by this name must "
                "come from an origin --cors-origins lists)")
    if origin:
        if origin == "null" or not origin_allowed(origin, host, settings):
            return f"origin not allowed: {origin} (--cors-origins does not list it)"
        return None
    if fetch_site in ("cross-site", "same-site"):
        return f"a {fetch_site} request without an Origin is not allowed here"
    return None
