"""llama.cpp's own web UI (the bundle scripts/build-ui builds from the pinned sdist), end to end
in chromium against a fleet serving Gemma 3 270M: a streamed answer, regenerate, edit, stop
freeing the slot at once, a text file attached, --ui-config defaults in its settings, an API
key; and ours beside it, the fleet page at /fleet (two workers, a batch, the tenants) linked
from the UI.

Gemma 3 270M here is a base model: with the default chatml template an answer may run to its
max tokens, so each test sets max tokens (--ui-config: small, or large where the answer must be
stopped)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from playwright.sync_api import Page, Request, expect

from tests.conftest import WORKER_FLAGS, make_fleet
from tests.processes import Fleet
from tests.ui.conftest import Shot

PROMPT = "Type a message..."
USER = ".chat-message-user"
ASSISTANT = ".chat-message-assistant"
CHAT_PATH = "/v1/chat/completions"
SHORT = json.dumps({"max_tokens": 24})


@pytest.fixture(scope="module")
def ui_fleet(redis_url: str, workdir: Path, gemma_path: Path, fleet: Fleet) -> Iterator[str]:
    """An api pod of the session's worker whose --ui-config keeps answers short."""
    pods = make_fleet(redis_url, workdir, gemma_path, "gemma")
    url = pods.add_api("--ui-config", SHORT)
    pods.wait_healthy(url)
    yield url
    pods.stop()


def _open(page: Page, url: str) -> None:
    page.goto(url)
    expect(page.get_by_placeholder(PROMPT)).to_be_visible()
    expect(page.get_by_role("button", name="gemma").last).to_be_visible()  # /v1/models read


def _is_chat(request: Request) -> bool:
    return request.method == "POST" and request.url.endswith(CHAT_PATH)


def _answered(page: Page, request: Request) -> dict[str, Any]:
    """Waits for the streamed answer to `request` to end, in the network and on the page;
    returns the request's body."""
    response = request.response()
    assert response is not None and response.status == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    response.finished()
    expect(page.get_by_role("button", name="Stop generation")).to_have_count(0)
    return json.loads(request.post_data or "{}")


def _send(page: Page, text: str) -> dict[str, Any]:
    with page.expect_request(_is_chat) as request:
        page.get_by_placeholder(PROMPT).fill(text)
        page.keyboard.press("Enter")
    return _answered(page, request.value)


def _answer(page: Page) -> str:
    return page.locator(ASSISTANT).last.locator(".markdown-content").inner_text()


def _user_text(body: dict[str, Any]) -> str:
    content = [m for m in body["messages"] if m["role"] == "user"][-1]["content"]
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content)


def _watch_answer(page: Page) -> None:
    """Record every length the newest answer's text takes, to tell a stream from one write."""
    page.evaluate("""() => {
        window.answerLengths = [];
        new MutationObserver(() => {
            const all = document.querySelectorAll('.chat-message-assistant .markdown-content');
            if (all.length) window.answerLengths.push(all[all.length - 1].textContent.length);
        }).observe(document.body, {childList: true, subtree: true, characterData: true});
    }""")


def test_chat_streams_regenerates_and_edits(page: Page, ui_fleet: str, shot: Shot) -> None:
    _open(page, f"{ui_fleet}/")
    _watch_answer(page)
    body = _send(page, "Write a short poem about the sea.")
    assert body["stream"] is True and body["max_tokens"] == 24  # --ui-config's default
    assert _user_text(body) == "Write a short poem about the sea."
    expect(page.locator(USER).locator(".markdown-content")).to_have_text(
        "Write a short poem about the sea.")
    answer = _answer(page)
    assert answer.strip()
    lengths = sorted(set(page.evaluate("window.answerLengths")))
    assert len([n for n in lengths if 0 < n < len(answer)]) >= 3, lengths  # it grew in steps
    expect(page.locator(ASSISTANT).last).to_contain_text("tokens")  # its timings
    shot(page, "chat-streamed")

    # regenerate asks again for the same question
    with page.expect_request(_is_chat) as again:
        page.locator(ASSISTANT).last.get_by_role("button", name="Regenerate").click()
    regenerated = _answered(page, again.value)
    assert regenerated["messages"] == body["messages"]
    assert _answer(page).strip()

    # edit resends the changed question
    page.locator(USER).last.get_by_role("button", name="Edit").click()
    page.get_by_placeholder("Edit your message...").fill("Name three colours.")
    with page.expect_request(_is_chat) as edited:
        page.locator(USER).last.get_by_role("button", name="Send").click()
    assert _user_text(_answered(page, edited.value)) == "Name three colours."
    expect(page.locator(USER).last.locator(".markdown-content")).to_have_text(
        "Name three colours.")
    assert _answer(page).strip()
    shot(page, "chat-edited")


def test_text_file_attached_is_sent(page: Page, ui_fleet: str, tmp_path: Path,
                                    shot: Shot) -> None:
    note = tmp_path / "note.txt"
    note.write_text("The secret word is pelican.\n")
    _open(page, f"{ui_fleet}/")
    page.locator("input[type=file]").first.set_input_files(str(note))
    expect(page.get_by_text("note.txt").first).to_be_visible()
    body = _send(page, "What is the secret word?")
    sent = _user_text(body)
    assert "note.txt" in sent and "The secret word is pelican." in sent, sent
    assert "What is the secret word?" in sent
    assert _answer(page).strip()
    shot(page, "chat-text-file")


def _busy_slots(url: str, headers: dict[str, str] | None = None) -> int:
    slots = httpx.get(f"{url}/slots", headers=headers).json()
    return sum(1 for s in slots if s["is_processing"])


@pytest.mark.serial  # a freed slot within 1 s: alone (tests/lanes.py)
def test_stop_frees_the_slot_at_once(redis_url: str, workdir: Path, gemma_path: Path,
                                     page: Page, api: str, shot: Shot) -> None:
    # its own api, with large max tokens as its --ui-config default, on the session's worker
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma")
    try:
        url = fleet.add_api("--ui-config", json.dumps({"max_tokens": 4000}))
        _open(page, f"{url}/")
        assert _busy_slots(url) == 0
        page.get_by_placeholder(PROMPT).fill("Tell me a very long story about a lighthouse.")
        page.keyboard.press("Enter")
        page.wait_for_function("""() => {
            const all = document.querySelectorAll('.chat-message-assistant .markdown-content');
            return all.length && all[all.length - 1].textContent.length > 40;
        }""")
        assert _busy_slots(url) == 1
        stop = page.get_by_role("button", name="Stop generation")
        expect(stop).to_be_visible()
        with page.expect_request(lambda r: r.method == "DELETE") as deleted:
            stop.click()
        stopped_at = time.monotonic()
        assert "/v1/stream?conv_id=" in deleted.value.url  # llama-server's stop
        while _busy_slots(url) and time.monotonic() - stopped_at < 5:
            time.sleep(0.02)
        freed_after = time.monotonic() - stopped_at
        print(f"slot idle in /slots {freed_after:.3f} s after Stop")
        assert freed_after < 1.0, f"the slot stayed busy {freed_after:.2f} s after Stop"
        expect(page.get_by_role("button", name="Stop generation")).to_have_count(0)
        assert _answer(page).strip()  # what came before the stop is kept
        shot(page, "chat-stopped")
    finally:
        fleet.stop()


def test_reload_mid_answer_reattaches_and_finishes(redis_url: str, workdir: Path,
                                                  gemma_path: Path, page: Page, api: str,
                                                  shot: Shot) -> None:
    """As with llama-server: a page reloaded while an answer streams finds the answer still
    running (POST /v1/streams/lookup), replays it (GET /v1/stream?conv_id=&from=0) and follows
    it to its end; the finished answer stays after another reload."""
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma")
    try:
        url = fleet.add_api("--ui-config", json.dumps({"max_tokens": 300}))
        _open(page, f"{url}/")
        with page.expect_request(_is_chat) as chat:
            page.get_by_placeholder(PROMPT).fill("Tell me a very long story about a lighthouse.")
            page.keyboard.press("Enter")
        conv = chat.value.headers["x-conversation-id"]
        page.wait_for_function("""() => {
            const all = document.querySelectorAll('.chat-message-assistant .markdown-content');
            return all.length && all[all.length - 1].textContent.length > 40;
        }""")
        before = _answer(page)
        with page.expect_request(lambda r: r.method == "GET" and "/v1/stream?" in r.url
                                 and "from=0" in r.url) as replay:
            page.reload()
        assert f"conv_id={conv}" in replay.value.url.replace("%3A", ":")
        running = httpx.post(f"{url}/v1/streams/lookup", json={"conversation_ids": [conv]})
        assert running.json() and running.json()[0]["conversation_id"] == conv
        response = replay.value.response()  # the replay, followed to the answer's end
        assert response is not None and response.status == 200
        response.finished()
        expect(page.get_by_role("button", name="Stop generation")).to_have_count(
            0, timeout=180_000)  # the UI saved the answer and unlocked
        (done,) = httpx.post(f"{url}/v1/streams/lookup",
                             json={"conversation_ids": [conv]}).json()
        assert done["is_done"] is True
        after = _answer(page)
        assert len(after) > len(before) and before[:30] in after, (before, after)
        shot(page, "chat-reloaded-finished")
        page.reload()  # the replayed answer was saved as the answer
        saved = re.compile("^\\s*" + "\\s*".join(map(re.escape, after.split())) + "\\s*$")
        # the same words in the same order: a saved answer's paragraphs may join in its text
        # content without the blank line the live one showed (once in a CI run)
        expect(page.locator(ASSISTANT).last.locator(".markdown-content")).to_have_text(saved)
    finally:
        fleet.stop()


def test_ui_config_defaults_show_in_settings(redis_url: str, workdir: Path, gemma_path: Path,
                                             page: Page, api: str, tmp_path: Path,
                                             shot: Shot) -> None:
    """The UI reads --ui-config-file and --ui-config (whose keys win) from /props
    `ui_settings` as its defaults, as from llama-server."""
    config = tmp_path / "ui.json"
    config.write_text(json.dumps({"systemMessage": "Overridden by --ui-config.", "top_k": 11}))
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma")  # shares the session's worker
    try:
        url = fleet.add_api("--ui-config-file", str(config), "--ui-config", json.dumps(
            {"systemMessage": "You answer in French.", "temperature": 0.3, "max_tokens": 16}))
        _open(page, f"{url}/")
        page.get_by_role("button", name="Settings").first.click()
        expect(page.locator("#systemMessage")).to_have_value("You answer in French.")
        page.get_by_role("button", name="Sampling & Penalties").click()
        expect(page.locator("#temperature")).to_have_value("0.3")
        expect(page.locator("#top_k")).to_have_value("11")
        shot(page, "settings-ui-config")
        page.keyboard.press("Escape")
        body = _send(page, "Bonjour")  # and a chat sends them
        assert body["messages"][0] == {"role": "system", "content": "You answer in French."}
        assert (body["temperature"], body["top_k"], body["max_tokens"]) == (0.3, 11, 16)
    finally:
        fleet.stop()


def test_api_key_is_asked_once(keyed_api: str, page: Page, shot: Shot) -> None:
    url = keyed_api  # the session's worker behind a pod with --api-key sekrit
    page.goto(f"{url}/")
    expect(page.get_by_text("Access denied")).to_be_visible()  # /props answered 401
    page.get_by_role("button", name="Enter API Key").click()
    page.locator("#api-key-input").fill("sekrit")
    shot(page, "api-key-asked")
    page.get_by_role("button", name="Save & Retry").click()
    expect(page.get_by_placeholder(PROMPT)).to_be_visible()
    page.reload()  # asked once: the UI keeps it
    _open(page, f"{url}/")
    page.get_by_role("button", name="Settings").first.click()
    page.get_by_role("button", name="Sampling & Penalties").click()
    page.locator("#max_tokens").fill("8")
    page.get_by_role("button", name="Save settings").click()
    _send(page, "Hello!")
    assert _answer(page).strip()
    # the fleet page sends the key the UI keeps
    page.locator("#llamaq-fleet-link").click()
    expect(page.locator(".worker")).not_to_have_count(0)
    shot(page, "api-key-fleet")


def test_page_under_an_api_prefix(prefixed_api: str, page: Page) -> None:
    url = prefixed_api  # the session's worker behind a pod with --api-prefix /llm
    calls: list[str] = []
    page.on("request", lambda r: calls.append(r.url))
    page.goto(f"{url}/llm")
    assert page.url == f"{url}/llm/"
    expect(page.get_by_role("button", name="gemma").last).to_be_visible()
    page.locator("#llamaq-fleet-link").click()
    expect(page.locator(".worker")).not_to_have_count(0)
    assert page.url == f"{url}/llm/fleet"
    page.get_by_role("link", name="← chat").click()
    expect(page.get_by_placeholder(PROMPT)).to_be_visible()
    assert calls[0] == f"{url}/llm"  # redirected to /llm/, from which all else is relative
    assert [c for c in calls[1:] if not c.startswith(f"{url}/llm/")] == [], calls


def test_fleet_page_shows_the_tenants(redis_url: str, workdir: Path, gemma_path: Path,
                                      page: Page, api: str, tmp_path: Path) -> None:
    """Under --tenants the fleet page lists what /fleet gives the key's tenant: the admin
    tenant every tenant, with its counters and limits."""
    tenants = tmp_path / "tenants.json"
    # names of this test's own: the session's Redis keeps other tests' tenant counters
    tenants.write_text(json.dumps({"tenants": [
        {"name": "ui-ops", "keys": ["k-ui-ops"], "admin": True},
        {"name": "ui-alice", "keys": ["k-ui-alice"], "max_concurrent": 2,
         "tokens_per_minute": 900}]}))
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma")  # shares the session's worker
    try:
        url = fleet.add_api("--tenants", str(tenants))
        answer = httpx.post(f"{url}/completion", headers={"Authorization": "Bearer k-ui-alice"},
                            json={"prompt": "Hi", "n_predict": 2}, timeout=120)
        assert answer.status_code == 200, answer.text
        page.goto(f"{url}/fleet")
        page.fill("input[name=api-key]", "k-ui-ops")
        page.get_by_role("button", name="Save key").click()
        alice = page.locator("tr[data-tenant='ui-alice']")
        expect(alice.locator(".tenant-requests")).to_have_text("1")
        expect(alice).to_contain_text("900")
        # its completion's wait and preemptions at its priority (0, the default)
        waited = alice.locator(".tenant-priority[data-priority='0']")
        expect(waited.locator(".started")).to_have_text("1")
        expect(waited.locator(".preempted")).to_have_text("0")
        expect(waited.locator(".mean-wait")).to_have_text(re.compile(r"^\d+\.\d\d$"))
        expect(page.locator("tr[data-tenant='ui-ops']")).to_have_count(1)
        expect(page.locator("tr[data-tenant='default']")).to_have_count(1)
    finally:
        fleet.stop()


def test_fleet_page_lists_both_workers(redis_url: str, workdir: Path, gemma_path: Path,
                                       page: Page, shot: Shot) -> None:
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma-ui")
    try:
        fleet.add_worker(*WORKER_FLAGS)
        fleet.add_worker("-c", "2048", "-np", "2", "-t", "1")
        plain = fleet.add_api()
        with_metrics = fleet.add_api("--metrics")
        fleet.wait_healthy(plain)
        deadline = time.monotonic() + 120
        while len(httpx.get(f"{plain}/fleet").json()["workers"]) < 2:
            assert time.monotonic() < deadline, "the second worker never came up"
            time.sleep(0.2)
        ids = sorted(w["worker_id"] for w in httpx.get(f"{plain}/fleet").json()["workers"])

        page.goto(f"{plain}/fleet")
        expect(page.locator(".worker")).to_have_count(2)
        assert sorted(page.locator(".worker-id").all_inner_texts()) == ids
        expect(page.locator(".worker-model")).to_have_text(["gemma-ui", "gemma-ui"])
        expect(page.locator(".slot")).to_have_count(6)
        fits = sorted(page.locator(".worker-fit").all_inner_texts())  # what --fit decided
        assert [f.splitlines()[0] for f in fits] == ["fit: ctx 2048", "fit: ctx 4096"]
        expect(page.locator("#worker-count")).to_have_text("2")
        expect(page.locator("#metrics-note")).to_contain_text("not available")
        # the Batch API's batches, refreshed with the rest of the page
        sdk = openai.OpenAI(base_url=f"{plain}/v1", api_key="none")
        batch_input = b"".join(json.dumps({
            "custom_id": f"ui-{i}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "gemma-ui", "max_tokens": 4,
                     "messages": [{"role": "user", "content": f"hi {i}"}]}}).encode() + b"\n"
            for i in range(3))
        upload = sdk.files.create(file=("lines.jsonl", batch_input), purpose="batch")
        batch = sdk.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                   completion_window="24h")
        row = page.locator(f"tr[data-batch='{batch.id}']")
        expect(row.locator(".batch-status")).to_have_text("completed", timeout=120_000)
        expect(row.locator(".batch-completed")).to_have_text("3")
        expect(row.locator(".batch-total")).to_have_text("3")
        expect(row.locator(".batch-progress")).to_have_text("100 %")

        # it refreshes itself: a running request shows as a busy slot, then idle again
        body = {"prompt": "Once upon a time", "n_predict": 400, "ignore_eos": True}
        with httpx.Client(timeout=120) as client, client.stream(
                "POST", f"{plain}/completion", json={**body, "stream": True}) as response:
            lines = response.iter_lines()  # (leaving a for loop over it closes the stream)
            while '"content"' not in next(lines):
                pass  # until the first token: the slot is busy then
            expect(page.locator(".slot.busy")).to_have_count(1, timeout=30_000)
            expect(page.locator(".slot.busy")).to_contain_text("busy")
            expect(page.locator("#queue-depth")).to_have_text("0")  # running is not waiting
            shot(page, "fleet-busy")
        expect(page.locator(".slot.busy")).to_have_count(0, timeout=30_000)

        done = httpx.post(f"{plain}/completion", json={**body, "n_predict": 8}, timeout=120)
        assert done.status_code == 200
        page.goto(f"{with_metrics}/fleet")
        expect(page.locator(".worker")).to_have_count(2)
        generated = page.locator(".stat", has_text="tokens generated").locator(".value")
        expect(generated).to_have_text(re.compile(r"^\d+$"))
        assert int(generated.inner_text()) >= 8
        speed = page.locator(".stat", has_text="gen tok/s").locator(".value")
        expect(speed).not_to_have_text("0.0")
        shot(page, "fleet-two-workers")
    finally:
        fleet.stop()


def test_tool_call_runs_on_the_pod(redis_url: str, workdir: Path, gemma_path: Path,
                                   page: Page, api: str, shot: Shot) -> None:
    """--tools: the UI lists the pod's tools (GET /tools) and offers them to the model; the
    model's call (forced here with the UI's own custom JSON setting: a 270M base model calls
    no tool of its own accord) runs on the pod (POST /tools) once allowed, and its result goes
    back to the model as a `tool` message."""
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma")  # shares the session's worker
    try:
        url = fleet.add_api("--tools", "get_info", "--ui-config", json.dumps(
            {"max_tokens": 64, "temperature": 0}))
        _open(page, f"{url}/")
        page.get_by_role("button", name="Settings").first.click()
        page.get_by_role("button", name="Developer").click()
        page.locator("#customJson").fill(json.dumps(
            {"tool_choice": {"type": "function", "function": {"name": "get_info"}}}))
        page.get_by_role("button", name="Save settings").click()
        chats: list[Request] = []
        page.on("request", lambda r: chats.append(r) if _is_chat(r) else None)
        page.get_by_placeholder(PROMPT).fill("What operating system is the server running?")
        page.keyboard.press("Enter")
        offered = [t["function"]["name"] for t in _posted(page, chats, 1)[0]["tools"]]
        assert "get_info" in offered, offered
        with page.expect_request(lambda r: r.method == "POST" and r.url.endswith("/tools"),
                                 timeout=120_000) as ran:
            page.get_by_role("button", name="Allow once").click(timeout=120_000)
        assert json.loads(ran.value.post_data or "{}")["tool"] == "get_info"
        result = ran.value.response()
        assert result is not None and result.status == 200
        assert "Linux" in result.text()
        again = _posted(page, chats, 2)[1]  # the model asked again, with the result
        tool = [m for m in again["messages"] if m["role"] == "tool"]
        assert tool and "Linux" in json.dumps(tool[0]["content"]), again["messages"]
        shot(page, "chat-server-tool")
        page.get_by_role("button", name="Stop generation").click()
    finally:
        fleet.stop()


def _posted(page: Page, chats: list[Request], count: int) -> list[dict[str, Any]]:
    """The bodies of the first `count` chat requests, once they were sent."""
    deadline = time.monotonic() + 120
    while len(chats) < count:
        assert time.monotonic() < deadline, f"{len(chats)} chat requests, not {count}"
        page.wait_for_timeout(100)
    return [json.loads(c.post_data or "{}") for c in chats[:count]]
