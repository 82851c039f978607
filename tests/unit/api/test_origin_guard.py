"""The cross-site rule of guarded routes (api/origin_guard.py), a pure function of a request's
headers and the pod's flags: curl passes, a browser passes from the pod's own origin or a listed
one and by a host name the pod knows; `*` covers none of them."""

from __future__ import annotations

from api.origin_guard import refusal
from api.settings import ApiSettings


def settings(*argv: str) -> ApiSettings:
    return ApiSettings.from_args(list(argv), environ={})


def test_a_request_without_browser_headers_passes() -> None:
    assert refusal({"host": "evil.test"}, settings()) is None  # curl, an SDK


def test_the_pods_own_origin_passes_by_a_known_host() -> None:
    plain = settings()
    for host in ("127.0.0.1:9931", "localhost:9931", "[::1]:9931", "10.0.0.5:9931"):
        assert refusal({"host": host, "origin": f"http://{host}"}, plain) is None, host
        assert refusal({"host": host, "origin": f"https://{host}"}, plain) is None, host
        assert refusal({"host": host, "sec-fetch-site": "same-origin"}, plain) is None, host
    named = settings("--host", "llm.internal")
    assert refusal({"host": "llm.internal:9931", "origin": "http://llm.internal:9931"},
                   named) is None


def test_rebinding_and_foreign_origins_are_refused() -> None:
    plain = settings()
    assert str(refusal({"host": "evil.test:9931", "origin": "http://evil.test:9931"},
                       plain)).startswith("host not allowed: evil.test:9931")
    assert str(refusal({"host": "127.0.0.1:9931", "origin": "http://evil.test"},
                       plain)).startswith("origin not allowed: http://evil.test")
    assert refusal({"host": "127.0.0.1:9931", "origin": "null"}, plain) is not None
    assert refusal({"host": "127.0.0.1:9931", "origin": "http://127.0.0.1:8080"},
                   plain) is not None  # another port of this host is another origin
    for site in ("cross-site", "same-site"):
        assert refusal({"host": "127.0.0.1:9931", "sec-fetch-site": site}, plain) is not None


def test_listed_origins_pass_and_a_star_covers_none() -> None:
    listed = settings("--cors-origins", "*,https://app.test")
    assert refusal({"host": "127.0.0.1:9931", "origin": "https://app.test"}, listed) is None
    assert refusal({"host": "app.test", "origin": "https://app.test"}, listed) is None
    assert refusal({"host": "127.0.0.1:9931", "origin": "https://any.test"}, listed) \
        is not None
    tools = settings("--tools", "all")  # --cors-origins defaults to localhost
    assert refusal({"host": "127.0.0.1:9931", "origin": "http://localhost:5173"}, tools) is None
    assert refusal({"host": "127.0.0.1:9931", "origin": "http://localhost:5173"},
                   settings()) is not None
