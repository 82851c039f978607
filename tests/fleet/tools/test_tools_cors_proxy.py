"""--ui-mcp-proxy (and --agent) on a real api pod against a real local HTTP server: the proxy
reaches 127.0.0.1 (--fetch-allow), forwards only the headers named
x-llama-server-proxy-header-*, passes the status (a 204 with no body too), the body and the
target's headers (not its CORS ones); it refuses other schemes and credentials in the URL;
--agent also turns on every tool. Ours (issue 43): answers are sandboxed and set no cookie,
private targets need --fetch-allow, redirects are bounded and never re-enter the proxy."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote, urlsplit

import httpx
import pytest

from tests.fleet.tools.tools_fleet import tools_fleet
from tests.processes import Fleet

HITS: list[str] = []


class Target(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        HITS.append(self.path)
        if self.path.startswith(("/loop", "/chain")):
            self.send_response(302)
            self.send_header("Location", "/loop" if self.path == "/loop" else CHAIN[0])
            self.end_headers()
            return
        if self.path == "/page":
            page = b"<script>localStorage.clear(); fetch('/tools')</script>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Set-Cookie", "session=attacker; Path=/")
            self.send_header("Clear-Site-Data", '"storage"')
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)
            return
        if self.path == "/empty":
            self.send_response(204)
            self.end_headers()
            return
        length = int(self.headers.get("content-length") or 0)
        body = json.dumps({"path": self.path, "method": self.command,
                           "headers": {k.lower(): v for k, v in self.headers.items()},
                           "body": self.rfile.read(length).decode()}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Target", "yes")
        self.send_header("Access-Control-Allow-Origin", "http://target.example")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def target() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Target)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


CHAIN = [""]  # where /chain sends the proxy: back into it


@pytest.fixture(scope="module")
def fleet(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    fleet: Fleet = tools_fleet(redis_url, tmp_path_factory.mktemp("proxy"), "proxy")
    fleet.add_api("--agent", "--fetch-allow", "127.0.0.1")
    fleet.add_api("--agent")  # no --fetch-allow: public targets only
    yield fleet
    fleet.stop()


@pytest.fixture(scope="module")
def api(fleet: Fleet) -> str:
    return fleet.api_urls[0]


def test_proxy_forwards_what_it_is_told(api: str, target: str) -> None:
    res = httpx.post(f"{api}/cors-proxy", params={"url": f"{target}/mcp?x=1"},
                     content=b'{"jsonrpc":"2.0"}',
                     headers={"Authorization": "Bearer for-llamaq",
                              "Cookie": "session=secret",
                              "x-llama-server-proxy-header-Authorization": "Bearer for-target",
                              "x-llama-server-proxy-header-content-type": "application/json",
                              "Origin": "http://localhost:5173"})
    assert res.status_code == 201
    seen = res.json()
    assert (seen["path"], seen["method"], seen["body"]) == ("/mcp?x=1", "POST",
                                                            '{"jsonrpc":"2.0"}')
    assert seen["headers"]["authorization"] == "Bearer for-target"
    assert seen["headers"]["content-type"] == "application/json"
    assert "cookie" not in seen["headers"]
    assert res.headers["x-target"] == "yes"
    assert res.headers["content-type"] == "application/json"
    # our CORS header (localhost, as --agent turns tools on), not the target's
    assert res.headers["access-control-allow-origin"] == "http://localhost:5173"


def test_no_content_and_get(api: str, target: str) -> None:
    res = httpx.post(f"{api}/cors-proxy", params={"url": f"{target}/empty"}, json={})
    assert res.status_code == 204 and res.content == b""
    assert httpx.get(f"{api}/cors-proxy", params={"url": f"{target}/g"}).json()["method"] == "GET"
    models = httpx.get(f"{api}/cors-proxy", params={"url": f"{api}/models"})
    assert models.status_code == 200 and "data" in models.json()  # the pod itself, too


@pytest.mark.parametrize(("url", "message"), [
    ("ftp://127.0.0.1/x", "unsupported URL scheme: ftp"),
    ("file:///etc/passwd", "unsupported URL scheme: file"),
    ("http://user:pw@127.0.0.1/", "authentication in target URL is not supported"),
    ("127.0.0.1/x", "invalid URL: no scheme"),
])
def test_refusals(api: str, url: str, message: str) -> None:
    res = httpx.get(f"{api}/cors-proxy", params={"url": url})
    assert res.status_code == 500
    assert res.json()["error"]["message"] == message


def test_unreachable_target_is_a_clean_error(api: str) -> None:
    res = httpx.get(f"{api}/cors-proxy", params={"url": "http://127.0.0.1:9/"})
    assert res.status_code == 500 and "proxy request failed" in res.json()["error"]["message"]


def test_agent_turns_on_every_tool(api: str) -> None:
    assert len(httpx.get(f"{api}/tools").json()) == 7


def test_a_page_is_sandboxed_and_sets_no_cookie(api: str, target: str) -> None:
    res = httpx.get(f"{api}/cors-proxy", params={"url": f"{target}/page"})
    assert res.status_code == 200 and b"<script>" in res.content
    assert res.headers["content-security-policy"] == "sandbox"  # no script on our origin
    assert res.headers["x-content-type-options"] == "nosniff"
    assert "set-cookie" not in res.headers and "clear-site-data" not in res.headers


def test_private_targets_need_fetch_allow(fleet: Fleet, target: str) -> None:
    HITS.clear()
    for url in (f"{target}/g", "http://169.254.169.254/latest/meta-data/",
                f"http://localhost:{urlsplit(target).port}/g"):
        res = httpx.get(f"{fleet.api_urls[1]}/cors-proxy", params={"url": url})
        assert res.status_code == 403, res.text
        assert res.json()["error"]["type"] == "permission_error"
        assert res.json()["error"]["message"].startswith("target address not allowed: ")
    assert HITS == []  # nothing was sent


def test_redirects_are_bounded(api: str, target: str) -> None:
    HITS.clear()
    res = httpx.get(f"{api}/cors-proxy", params={"url": f"{target}/loop"}, timeout=30)
    assert res.status_code == 500 and "TooManyRedirects" in res.json()["error"]["message"]
    assert len(HITS) == 6  # the first request and 5 redirects


def test_a_redirect_back_into_the_proxy_stops_there(api: str, target: str) -> None:
    CHAIN[0] = f"{api}/cors-proxy?url={quote(target + '/chain', safe='')}"
    HITS.clear()
    res = httpx.get(f"{api}/cors-proxy", params={"url": f"{target}/chain"}, timeout=30)
    assert res.status_code == 403, res.text[:300]  # the proxy's second entry refused
    assert "cannot go through it again" in res.json()["error"]["message"]
    assert HITS == ["/chain"]
