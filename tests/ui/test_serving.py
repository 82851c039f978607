"""The web UI as the api pods serve it: llama.cpp's bundle (scripts/build-ui) with the fleet
link, caching headers, public assets under an API key, --no-ui, --api-prefix, --ui-config
defaults in /props, --path; /fleet (the page for a browser, else the JSON); the resumable
stream routes the UI calls."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from api.endpoints.ui.bundle import bundle_dir
from tests.conftest import make_fleet

NOT_FOUND = {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}}
PUBLIC_ASSETS = ("sw.js", "manifest.webmanifest", "_app/version.json", "favicon.svg", "build.json")
BROWSER = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}
"""What a browser's navigation accepts."""
FLEET_LINK = '<a id="llamaq-fleet-link" href="./fleet"'
UI_BUNDLE = bundle_dir()


def _asset_paths(page: str) -> list[str]:
    paths = re.findall(r'(?:src|href)="\./(_app/immutable/[^"]+)"', page)
    assert paths, page
    return paths


def test_page_and_assets_with_caching_headers(api: str) -> None:
    url = api  # the session's pod: no flags
    page = httpx.get(f"{url}/")
    assert page.status_code == 200
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    assert page.headers["cache-control"] == "no-cache"
    assert page.headers["cross-origin-opener-policy"] == "same-origin"
    assert page.headers["cross-origin-embedder-policy"] == "require-corp"
    # llama.cpp's page as scripts/build-ui built it, with the fleet link before </body>
    built = (UI_BUNDLE / "index.html").read_text()
    assert "__sveltekit" in built and FLEET_LINK not in built
    assert page.text.replace(page.text[page.text.index(FLEET_LINK):].split("\n")[0] + "\n",
                             "") == built
    assert page.text.index(FLEET_LINK) < page.text.rindex("</body>")
    assert httpx.get(f"{url}/index.html").text == page.text
    assert "http" not in re.sub(r'xmlns="[^"]+"', "", page.text)  # nothing from a CDN
    for asset in _asset_paths(page.text):
        response = httpx.get(f"{url}/{asset}")
        assert response.status_code == 200
        assert response.headers["cache-control"] == "public, max-age=31536000, immutable"
    script = next(a for a in _asset_paths(page.text) if a.endswith(".js"))
    zipped = httpx.get(f"{url}/{script}", headers={"Accept-Encoding": "gzip"})
    assert zipped.headers["content-encoding"] == "gzip"
    assert zipped.headers["content-type"] == "application/javascript; charset=utf-8"
    plain = httpx.get(f"{url}/{script}", headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers
    assert zipped.content == plain.content  # httpx decoded it
    with httpx.stream("GET", f"{url}/{script}", headers={"Accept-Encoding": "gzip"}) as raw:
        assert gzip.decompress(b"".join(raw.iter_raw())) == plain.content

    etag = page.headers["etag"]
    again = httpx.get(f"{url}/", headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.content == b""
    for path in PUBLIC_ASSETS:
        response = httpx.get(f"{url}/{path}")
        assert response.status_code == 200, path
        assert response.headers["cache-control"] == "no-cache"
    assert httpx.get(f"{url}/manifest.webmanifest").json()["name"] == "llama-ui"
    assert httpx.get(f"{url}/_app/version.json").json()["version"]
    head = httpx.head(f"{url}/sw.js")
    assert head.status_code == 200 and head.content == b""
    assert httpx.get(f"{url}/_app/immutable/nothing.js").json() == NOT_FOUND


def test_page_is_public_under_an_api_key(keyed_api: str) -> None:
    url = keyed_api  # the session's worker behind a pod with --api-key sekrit
    page = httpx.get(f"{url}/")
    assert page.status_code == 200
    for path in (*PUBLIC_ASSETS, *_asset_paths(page.text)):
        assert httpx.get(f"{url}/{path}").status_code == 200, path
    for path in ("props", "fleet", "v1/chat/completions"):
        assert httpx.get(f"{url}/{path}").status_code == 401, path
    keyed = httpx.get(f"{url}/fleet", headers={"Authorization": "Bearer sekrit"})
    assert keyed.status_code == 200 and keyed.json()["workers"]
    page = httpx.get(f"{url}/fleet", headers=BROWSER)  # the fleet page: public, as the UI
    assert page.status_code == 200 and "<title>llamaq fleet</title>" in page.text
    assert page.headers["content-type"] == "text/html; charset=utf-8"


@pytest.fixture(scope="module")
def no_ui_api(redis_url: str, workdir: Path, gemma_path: Path) -> Iterator[str]:
    """An api pod for the session's model started with --no-ui: two tests read it, none
    changes it."""
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma")
    fleet.logs = workdir / "logs-gemma-no-ui"
    try:
        yield fleet.add_api("--no-ui")
    finally:
        fleet.stop()


def test_no_ui_and_api_prefix(redis_url: str, workdir: Path, gemma_path: Path,
                              no_ui_api: str, prefixed_api: str) -> None:
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma")
    try:
        off = no_ui_api
        response = httpx.get(f"{off}/")
        assert response.status_code == 404 and response.json() == NOT_FOUND
        remover = httpx.get(f"{off}/sw.js")  # the old UI's service worker removes itself
        assert remover.status_code == 200 and "unregister()" in remover.text
        # no fleet page either: /fleet is the JSON for a browser too
        assert httpx.get(f"{off}/fleet", headers=BROWSER).json()["model"] == "gemma"
        old_name = fleet.add_api("--no-webui")
        assert httpx.get(f"{old_name}/").status_code == 404

        prefixed = prefixed_api
        response = httpx.get(f"{prefixed}/llm")
        assert response.status_code == 308 and response.headers["location"] == "/llm/"
        page = httpx.get(f"{prefixed}/llm/")
        assert page.status_code == 200 and FLEET_LINK in page.text
        for path in (*PUBLIC_ASSETS, *_asset_paths(page.text)):
            assert httpx.get(f"{prefixed}/llm/{path}").status_code == 200, path
        assert httpx.get(f"{prefixed}/").status_code == 404
        assert httpx.get(f"{prefixed}/sw.js").status_code == 404
        fleet_page = httpx.get(f"{prefixed}/llm/fleet", headers=BROWSER)
        assert "<title>llamaq fleet</title>" in fleet_page.text
    finally:
        fleet.stop()


def test_ui_config_defaults_in_props(redis_url: str, workdir: Path, gemma_path: Path,
                                     api: str, no_ui_api: str, tmp_path: Path) -> None:
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma")  # shares the session's worker
    try:
        assert httpx.get(f"{api}/props").json()["ui_settings"] == {}
        inline = fleet.add_api("--ui-config", '{"temperature": 0.25, "top_k": 7}')
        props = httpx.get(f"{inline}/props").json()
        assert props["ui"] is True
        assert props["ui_settings"] == {"temperature": 0.25, "top_k": 7}

        config = tmp_path / "ui.json"
        config.write_text(json.dumps({"systemMessage": "Be brief.", "top_k": 3}))
        both = fleet.add_api("--webui-config-file", str(config), "--webui-config", '{"top_k": 9}')
        assert httpx.get(f"{both}/props").json()["ui_settings"] == {
            "systemMessage": "Be brief.", "top_k": 9}
        assert httpx.get(f"{no_ui_api}/props").json()["ui"] is False
    finally:
        fleet.stop()


@pytest.mark.process
def test_bad_ui_config_stops_the_start(tmp_path: Path) -> None:
    for args, message in (
        (["--ui-config", "{nope"], "--ui-config is not valid JSON"),
        (["--ui-config", "[1]"], "--ui-config must be a JSON object"),
        (["--ui-config-file", str(tmp_path / "missing.json")], "cannot read --ui-config-file"),
        (["--path", str(tmp_path / "missing")], "is not a folder"),
    ):
        done = subprocess.run([sys.executable, "-m", "llamaq", "api", "--port", "1", *args],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode != 0, args
        assert message in done.stderr, done.stderr


def test_path_serves_a_folder(redis_url: str, workdir: Path, gemma_path: Path,
                              tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "sub").mkdir(parents=True)
    (site / "index.html").write_text("<p>mine</p>")
    (site / "sub" / "data.json").write_text('{"a": 1}')
    (tmp_path / "secret.txt").write_text("no")
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma")
    try:
        url = fleet.add_api("--path", str(site), "--api-key", "k")
        page = httpx.get(f"{url}/")
        assert page.status_code == 200 and page.text == "<p>mine</p>"
        assert page.headers["content-type"] == "text/html; charset=utf-8"
        assert httpx.get(f"{url}/sub/data.json").json() == {"a": 1}
        assert httpx.get(f"{url}/sub/").status_code == 404  # no index.html there
        assert httpx.get(f"{url}/../secret.txt").status_code == 404
        assert httpx.get(f"{url}/%2e%2e/secret.txt").status_code == 404
        assert httpx.get(f"{url}/favicon.svg").json() == NOT_FOUND  # the bundle is not served
        assert "unregister()" in httpx.get(f"{url}/sw.js").text
        assert httpx.get(f"{url}/health").status_code in (200, 503)  # API routes still win
        assert httpx.get(f"{url}/props").status_code == 401
    finally:
        fleet.stop()


def test_fleet_endpoint(api: str) -> None:
    fleet = httpx.get(f"{api}/fleet").json()
    assert fleet["model"] == "gemma" and fleet["queued"] == 0
    assert len(fleet["workers"]) >= 1
    worker = fleet["workers"][0]
    assert worker["model_id"] == "gemma" and worker["n_slots"] == 4
    assert [s["id"] for s in worker["slots"]] == [0, 1, 2, 3]
    assert "params" not in worker["slots"][0]
    assert set(worker["metrics"]) >= {"requests_processing", "requests_deferred",
                                      "tokens_predicted_total"}


def test_fleet_page_for_a_browser_json_for_a_script(api: str) -> None:
    page = httpx.get(f"{api}/fleet", headers=BROWSER)
    assert page.status_code == 200 and "<title>llamaq fleet</title>" in page.text
    assert page.headers["cache-control"] == "no-cache"
    for accept in ("*/*", "application/json"):
        assert httpx.get(f"{api}/fleet", headers={"Accept": accept}).json()["model"] == "gemma"


def test_resumable_stream_routes(api: str) -> None:
    """llama.cpp's UI calls llama-server's conversation stream routes: with no session, llamaq
    answers with their shapes and codes (docs/endpoints.md, Web UI)."""
    lookup = httpx.post(f"{api}/v1/streams/lookup", json={"conversation_ids": ["c1::gemma"]})
    assert lookup.status_code == 200 and lookup.json() == []
    bad = httpx.post(f"{api}/v1/streams/lookup", content=b"{nope")
    assert bad.status_code == 400 and bad.json()["error"]["message"].startswith(
        "Invalid JSON in the request body")
    missing = httpx.get(f"{api}/v1/stream")
    assert missing.status_code == 400
    assert missing.json()["error"]["message"] == "Missing conversation id in path"
    gone = httpx.get(f"{api}/v1/stream", params={"conv_id": "c1::gemma", "from": 0})
    assert gone.status_code == 404
    assert gone.json()["error"] == {"code": 404, "message": "Stream not found or expired",
                                    "type": "not_found_error"}
    assert httpx.delete(f"{api}/v1/stream", params={"conv_id": "c1"}).status_code == 204
    assert httpx.delete(f"{api}/v1/stream").status_code == 400


def _replay(api: str, conv: str, start: int = 0,
            headers: dict[str, str] | None = None) -> bytes:
    with httpx.stream("GET", f"{api}/v1/stream", params={"conv_id": conv, "from": start},
                      timeout=120, headers=headers) as replay:
        assert replay.status_code == 200
        assert replay.headers["content-type"].startswith("text/event-stream")
        return replay.read()


def test_conversation_stream_outlives_its_client_and_replays(api: str, keyed_api: str) -> None:
    """As llama-server's resumable streams: a chat streamed with `X-Conversation-Id` goes on
    to its end when the client leaves; the lookup lists it, `GET /v1/stream` replays its bytes
    (the very bytes the client got first) from any offset, on any api pod, and Stop evicts
    it."""
    conv = "conv-reload::gemma"
    body = {"messages": [{"role": "user", "content": "Count to fifty."}], "max_tokens": 48,
            "ignore_eos": True, "stream": True}
    got = b""
    with httpx.stream("POST", f"{api}/v1/chat/completions", json=body, timeout=120,
                      headers={"X-Conversation-Id": conv}) as first:
        assert first.status_code == 200
        for chunk in first.iter_raw():
            got += chunk
            if got.count(b"data: ") >= 3:
                break  # the client leaves mid-answer
    assert b"[DONE]" not in got
    (session,) = httpx.post(f"{api}/v1/streams/lookup",
                            json={"conversation_ids": ["conv-reload"]}).json()
    assert session["conversation_id"] == conv and session["started_at"] > 0
    assert set(session) == {"conversation_id", "is_done", "total_bytes", "started_at",
                            "completed_at"}
    whole = _replay(api, conv)  # follows the answer to its end
    assert whole.startswith(got) and whole.endswith(b"data: [DONE]\n\n")
    deltas = [json.loads(line[6:]) for line in whole.decode().split("\n")
              if line.startswith("data: {")]
    # every token, though nobody read them as they came: all 48 generated and the text sent
    # (counting content deltas undercounts where a partial stop string such as the sampled
    # "<|im_end" held tokens back into one delta: 25 of 48 once)
    (last,) = [d for d in deltas if d["choices"] and d["choices"][0]["finish_reason"]]
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["timings"]["predicted_n"] == 48
    assert sum(1 for d in deltas if d["choices"] and d["choices"][0]["delta"].get("content")) \
        >= 12
    assert _replay(api, conv, len(got)) == whole[len(got):]
    assert _replay(keyed_api, conv, 7, {"Authorization": "Bearer sekrit"}) == whole[7:]
    done = httpx.post(f"{api}/v1/streams/lookup", json={"conversation_ids": [conv]}).json()
    assert done == [{"conversation_id": conv, "is_done": True, "total_bytes": len(whole),
                     "started_at": session["started_at"],
                     "completed_at": done[0]["completed_at"]}]
    assert done[0]["completed_at"] >= session["started_at"]
    bad = httpx.get(f"{api}/v1/stream", params={"conv_id": conv, "from": "x"})
    assert bad.status_code == 400 and bad.json()["error"]["message"] == "Invalid 'from' offset"
    assert httpx.delete(f"{api}/v1/stream", params={"conv_id": conv}).status_code == 204
    assert httpx.get(f"{api}/v1/stream", params={"conv_id": conv}).status_code == 404
    assert httpx.post(f"{api}/v1/streams/lookup", json={"conversation_ids": [conv]}).json() == []
