"""Issue 43 item 3 on real api pods without an API key (the default local setup): a page of
another site cannot run a tool or change the fleet through the operator's browser. POST /tools
takes only `application/json` (415 otherwise: a `text/plain` post needs no preflight); a
browser's request to a guarded route (/tools, /cors-proxy, /models load and downloads,
/lora-adapters, slot actions) must come from the pod's own origin or one --cors-origins lists,
and name the pod by a host it knows (DNS rebinding); curl and SDKs (no Origin) are unchanged."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.fleet.tools.tools_fleet import tools_fleet
from tests.processes import Fleet


@pytest.fixture(scope="module")
def fleet(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    fleet = tools_fleet(redis_url, tmp_path_factory.mktemp("cross-site"), "cross-site")
    fleet.add_api("--agent")  # every tool and /cors-proxy; --cors-origins: localhost
    fleet.add_api("--tools", "all", "--cors-origins", "*,http://app.test")
    yield fleet
    fleet.stop()


def shell(api: str, marker: Path, headers: dict[str, str],
          content_type: str = "application/json") -> httpx.Response:
    body = f'{{"tool": "exec_shell_command", "params": {{"command": "touch {marker}"}}}}'
    return httpx.post(f"{api}/tools", content=body.encode(), timeout=30,
                      headers={"Content-Type": content_type, **headers})


def refused(res: httpx.Response, what: str) -> None:
    assert res.status_code == 403, res.text
    error = res.json()["error"]
    assert error["type"] == "permission_error" and error["code"] == 403
    assert error["message"].startswith(what), error["message"]


def test_a_foreign_page_cannot_run_a_command(fleet: Fleet, tmp_path: Path) -> None:
    api = fleet.api_urls[0]
    marker = tmp_path / "pwned"
    for content_type in ("text/plain", "application/json"):
        refused(shell(api, marker, {"Origin": "http://evil.test"}, content_type),
                "origin not allowed: http://evil.test")
    assert not marker.exists()


def test_a_tool_call_must_be_json(fleet: Fleet, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "", "text/json"):
        res = shell(fleet.api_urls[0], marker, {}, content_type)
        assert res.status_code == 415, res.text
        assert res.json() == {"code": 415, "type": "invalid_request_error",
                              "message": "the body of a tool call must be application/json"}
    assert not marker.exists()


def test_dns_rebinding_is_refused(fleet: Fleet, tmp_path: Path) -> None:
    api = fleet.api_urls[0]
    port = urlsplit(api).port
    marker = tmp_path / "pwned"
    rebound = {"Host": f"evil.test:{port}", "Origin": f"http://evil.test:{port}"}
    refused(shell(api, marker, rebound), f"host not allowed: evil.test:{port}")
    same_site_get = httpx.get(f"{api}/cors-proxy", params={"url": f"{api}/health"},
                              headers={"Host": f"evil.test:{port}",
                                       "Sec-Fetch-Site": "same-origin"})
    refused(same_site_get, "host not allowed")
    assert not marker.exists()


def test_the_pods_own_pages_and_local_origins_still_work(fleet: Fleet, tmp_path: Path) -> None:
    api = fleet.api_urls[0]
    for origin in (api, "http://localhost:5173"):
        marker = tmp_path / f"ran-{len(origin)}"
        res = shell(api, marker, {"Origin": origin, "Sec-Fetch-Site": "same-origin"})
        assert res.status_code == 200, res.text
        assert marker.exists()
    marker = tmp_path / "curl"
    assert shell(api, marker, {}).status_code == 200 and marker.exists()  # no Origin: curl


def test_the_proxy_refuses_other_sites(fleet: Fleet) -> None:
    api = fleet.api_urls[0]
    target = {"url": f"{api}/health"}
    refused(httpx.get(f"{api}/cors-proxy", params=target,
                      headers={"Origin": "http://evil.test"}), "origin not allowed")
    refused(httpx.get(f"{api}/cors-proxy", params=target,
                      headers={"Sec-Fetch-Site": "cross-site"}),  # an <img>, a link
            "a cross-site request without an Origin")


@pytest.mark.parametrize(("method", "path"), [
    ("POST", "/models/load"), ("POST", "/models/unload"), ("POST", "/models"),
    ("DELETE", "/models"), ("POST", "/lora-adapters"), ("POST", "/slots/0?action=erase"),
    ("POST", "/props")])
def test_fleet_changes_refuse_other_sites(fleet: Fleet, method: str, path: str) -> None:
    api = fleet.api_urls[0]
    res = httpx.request(method, f"{api}{path}", json={"model": "x"},
                        headers={"Origin": "http://evil.test"}, timeout=30)
    refused(res, "origin not allowed")
    plain = httpx.request(method, f"{api}{path}", json={"model": "x"}, timeout=30)
    assert plain.status_code != 403, plain.text  # curl: whatever the route answers


def test_a_star_does_not_cover_tools_a_listed_origin_does(fleet: Fleet, tmp_path: Path) -> None:
    api = fleet.api_urls[1]
    refused(shell(api, tmp_path / "x", {"Origin": "http://evil.test"}), "origin not allowed")
    marker = tmp_path / "app"
    assert shell(api, marker, {"Origin": "http://app.test"}).status_code == 200
    assert marker.exists()
