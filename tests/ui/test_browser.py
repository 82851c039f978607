"""The web UI end to end in chromium against a fleet serving Gemma 3 270M: a streamed answer,
stop freeing the slot at once, the API key asked once, --ui-config defaults in the settings, the
fleet page with two workers and a batch.

Gemma 3 270M here is a base model: with the default chatml template an answer may run to its
max tokens, so each test sets max tokens (small, or large where the answer must be stopped)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from playwright.sync_api import Page, expect

from tests.conftest import WORKER_FLAGS, make_fleet
from tests.ui.conftest import Shot

ANSWER = ".message.assistant .content"


def _open_settings(page: Page) -> None:
    page.get_by_role("button", name="Settings").click()
    expect(page.locator("section.settings")).to_be_visible()


def _set_max_tokens(page: Page, value: int) -> None:
    _open_settings(page)
    page.fill("input[name=max_tokens]", str(value))
    page.get_by_role("button", name="Close").click()


def _watch_answer(page: Page) -> None:
    """Record every length the answer's text takes, to tell a stream from one final write."""
    page.evaluate("""() => {
        window.answerLengths = [];
        new MutationObserver(() => {
            const el = document.querySelector('.message.assistant .content');
            if (el) window.answerLengths.push(el.textContent.length);
        }).observe(document.body, {childList: true, subtree: true, characterData: true});
    }""")


def _finished(page: Page) -> int:
    return int(page.locator(".chat-layout").get_attribute("data-finished") or 0)


def _wait_answered(page: Page, before: int) -> None:
    """Until the answer asked for after `before` answers has ended."""
    expect(page.locator(".chat-layout")).to_have_attribute(
        "data-finished", str(before + 1), timeout=120_000)


def _send(page: Page, text: str) -> int:
    before = _finished(page)
    page.fill("textarea[name=message]", text)
    page.get_by_role("button", name="Send").click()
    return before


def test_chat_streams_an_answer(page: Page, api: str, shot: Shot) -> None:
    page.goto(f"{api}/")
    expect(page.get_by_label("Model")).to_have_value("gemma")
    _set_max_tokens(page, 24)
    _watch_answer(page)
    before = _send(page, "Write a short poem about the sea.")
    expect(page.locator(".message.user .content")).to_have_text(
        "Write a short poem about the sea.")
    _wait_answered(page, before)
    answer = page.locator(ANSWER).inner_text()
    assert answer.strip()
    lengths = sorted(set(page.evaluate("window.answerLengths")))
    assert len([n for n in lengths if 0 < n < len(answer)]) >= 3, lengths  # it grew in steps
    figures = page.locator(".message.assistant .figures")
    expect(figures).to_contain_text("tok/s")
    expect(figures).to_contain_text("cached")
    assert page.locator(".gen-speed").inner_text() != "– tok/s"
    shot(page, "chat-streamed")

    # the conversation is kept in the browser: a reload shows it again
    page.reload()
    expect(page.locator(".message.user .content")).to_have_text(
        "Write a short poem about the sea.")
    expect(page.locator(ANSWER)).not_to_be_empty()
    assert page.locator(ANSWER).inner_text() == answer
    stored = page.evaluate("localStorage.getItem('llamaq.conversations')")
    kept = json.loads(stored)[0]["messages"]
    assert [m["role"] for m in kept] == ["user", "assistant"] and kept[1]["content"].strip()

    # regenerate replaces the answer; edit resends the changed question
    before = _finished(page)
    page.get_by_role("button", name="Regenerate").click()
    _wait_answered(page, before)
    expect(page.locator(".message")).to_have_count(2)
    assert page.locator(ANSWER).inner_text().strip()
    page.locator(".message.user").get_by_role("button", name="Edit").click()
    page.fill(".message.user .edit textarea", "Name three colours.")
    before = _finished(page)
    page.get_by_role("button", name="Save & send").click()
    expect(page.locator(".message.user .content")).to_have_text("Name three colours.")
    _wait_answered(page, before)
    expect(page.locator(".message")).to_have_count(2)
    assert page.locator(ANSWER).inner_text().strip()
    shot(page, "chat-edited")


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
        page.goto(f"{url}/")
        expect(page.get_by_label("Model")).to_have_value("gemma")
        assert _busy_slots(url) == 0
        _send(page, "Tell me a very long story about a lighthouse keeper.")
        expect(page.locator(".message.assistant.streaming")).to_have_count(1)
        page.wait_for_function(
            "document.querySelector('.message.assistant .content').textContent.length > 40")
        assert _busy_slots(url) == 1
        stop = page.get_by_role("button", name="Stop")
        expect(stop).to_be_visible()
        stop.click()
        stopped_at = time.monotonic()
        while _busy_slots(url) and time.monotonic() - stopped_at < 5:
            time.sleep(0.02)
        freed_after = time.monotonic() - stopped_at
        print(f"slot idle in /slots {freed_after:.3f} s after Stop")
        assert freed_after < 1.0, f"the slot stayed busy {freed_after:.2f} s after Stop"
        expect(page.locator(".message.assistant .note")).to_have_text("stopped")
        expect(page.get_by_role("button", name="Send")).to_be_visible()
        shot(page, "chat-stopped")
    finally:
        fleet.stop()


def test_api_key_is_asked_once(keyed_api: str, page: Page, shot: Shot) -> None:
    url = keyed_api  # the session's worker behind a pod with --api-key sekrit
    page.goto(f"{url}/")
    expect(page.get_by_text("This server needs an API key")).to_be_visible()
    shot(page, "api-key-prompt")
    page.fill("input[name=api-key]", "wrong")
    page.get_by_role("button", name="Save key").click()
    expect(page.locator(".key-prompt .error")).to_contain_text("Invalid API Key")
    page.fill("input[name=api-key]", "sekrit")
    page.get_by_role("button", name="Save key").click()
    expect(page.get_by_label("Model")).to_have_value("gemma")
    _set_max_tokens(page, 16)
    _wait_answered(page, _send(page, "Hello!"))
    assert page.locator(ANSWER).inner_text().strip()
    assert not page.locator(".message.assistant .error").count()
    page.reload()  # asked once: the key is kept
    expect(page.get_by_label("Model")).to_have_value("gemma")
    expect(page.get_by_text("This server needs an API key")).to_have_count(0)
    page.get_by_role("link", name="Fleet").click()
    expect(page.locator(".worker")).not_to_have_count(0)
    shot(page, "api-key-chat")


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
        page.goto(f"{url}/#/fleet")
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


def test_ui_config_defaults_show_in_settings(redis_url: str, workdir: Path, gemma_path: Path,
                                             page: Page, api: str, tmp_path: Path,
                                             shot: Shot) -> None:
    config = tmp_path / "ui.json"
    config.write_text(json.dumps({"systemMessage": "You answer in French.", "top_k": 11}))
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma")  # shares the session's worker
    try:
        url = fleet.add_api("--ui-config-file", str(config),
                            "--ui-config", json.dumps({"temperature": 0.3, "max_tokens": 64}))
        page.goto(f"{url}/")
        expect(page.get_by_label("Model")).to_have_value("gemma")
        _open_settings(page)
        expect(page.locator("textarea[name=systemMessage]")).to_have_value(
            "You answer in French.")
        expect(page.locator("input[name=top_k]")).to_have_value("11")
        expect(page.locator("input[name=temperature]")).to_have_value("0.3")
        expect(page.locator("input[name=max_tokens]")).to_have_value("64")
        expect(page.locator("input[name=top_p]")).to_have_value("0.95")  # built-in default
        shot(page, "settings-ui-config")
        page.fill("input[name=top_k]", "5")  # the user's own change wins and is kept
        page.reload()
        _open_settings(page)
        expect(page.locator("input[name=top_k]")).to_have_value("5")
        expect(page.locator("input[name=temperature]")).to_have_value("0.3")
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

        page.goto(f"{plain}/#/fleet")
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
        page.goto(f"{with_metrics}/#/fleet")
        expect(page.locator(".worker")).to_have_count(2)
        expect(page.locator(".metrics")).to_contain_text("gen tok/s")
        generated = page.locator(".metrics .stat", has_text="tokens generated").locator(".value")
        expect(generated).to_have_text(re.compile(r"^\d+$"))
        assert int(generated.inner_text()) >= 8
        speed = page.locator(".metrics .stat", has_text="gen tok/s").locator(".value")
        expect(speed).not_to_have_text("0.0")
        shot(page, "fleet-two-workers")
    finally:
        fleet.stop()


STORED: list[dict[str, Any]] = [{
    "id": "c1", "title": "Markdown", "updated": 1, "messages": [
        {"id": "m1", "role": "user", "content": "Show me **code**"},
        {"id": "m2", "role": "assistant", "model": "gemma",
         "reasoning": "The user wants a *code* sample.",
         "content": "# Title\n\nSome **bold** and `inline`.\n\n```python\ndef f(x):\n"
                    "    return 'hi'  # note\n```\n\n- one\n- two\n\n"
                    "<img src=x onerror=\"window.pwned=1\"><script>window.pwned=2</script>",
         "timings": {"prompt_n": 12, "prompt_per_second": 345.6, "predicted_n": 30,
                     "predicted_per_second": 42.1, "cache_n": 5}},
    ]}]


def test_markdown_code_reasoning_and_copy(page: Page, api: str, shot: Shot) -> None:
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.goto(f"{api}/")
    page.evaluate("c => localStorage.setItem('llamaq.conversations', JSON.stringify(c))", STORED)
    page.reload()
    answer = page.locator(ANSWER)
    expect(answer.locator("h1")).to_have_text("Title")
    expect(answer.locator("strong")).to_have_text("bold")
    expect(answer.locator("li")).to_have_count(2)
    expect(answer.locator("pre.code code .hljs-keyword").first).to_have_text("def")
    expect(answer.locator("pre.code .hljs-comment")).to_have_text("# note")
    expect(answer.locator(".code-lang")).to_have_text("python")
    assert page.evaluate("window.pwned") is None  # model output runs no script
    assert answer.locator("script").count() == 0
    assert answer.locator("img").get_attribute("onerror") is None
    # the user's text is shown as typed, not as Markdown
    expect(page.locator(".message.user .content")).to_have_text("Show me **code**")

    reasoning = page.locator(".message.assistant details.reasoning")
    expect(reasoning).not_to_have_attribute("open", "")
    expect(reasoning.locator(".markdown")).to_be_hidden()
    reasoning.locator("summary").click()
    expect(reasoning.locator(".markdown em")).to_have_text("code")

    figures = page.locator(".message.assistant .figures")
    expect(figures).to_contain_text("prompt 12 tok")
    expect(figures.locator(".prompt-speed")).to_have_text("345.6 tok/s")
    expect(figures.locator(".gen-speed")).to_have_text("42.1 tok/s")
    expect(figures.locator(".cached")).to_have_text("cached 5")

    page.locator(".message.assistant").get_by_role("button", name="Copy").click()
    expect(page.locator(".message.assistant").get_by_role("button", name="Copied")).to_be_visible()
    assert page.evaluate("navigator.clipboard.readText()") == STORED[0]["messages"][1]["content"]
    shot(page, "markdown-code-reasoning")


def test_page_under_an_api_prefix(prefixed_api: str, page: Page) -> None:
    url = prefixed_api  # the session's worker behind a pod with --api-prefix /llm
    calls: list[str] = []
    page.on("request", lambda r: calls.append(r.url))
    page.goto(f"{url}/llm")
    assert page.url == f"{url}/llm/"
    expect(page.get_by_label("Model")).to_have_value("gemma")
    page.get_by_role("link", name="Fleet").click()
    expect(page.locator(".worker")).not_to_have_count(0)
    assert calls[0] == f"{url}/llm"  # redirected to /llm/, from which all else is relative
    assert all(c.startswith(f"{url}/llm/") for c in calls[1:]), calls


THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")


def test_reasoning_streams_folded(redis_url: str, workdir: Path, gemma_path: Path, page: Page,
                                  api: str, tmp_path: Path, shot: Shot) -> None:
    # a template that opens a think block: all Gemma writes in 16 tokens is reasoning_content
    template = tmp_path / "thinking.jinja"
    template.write_text(THINKING_TEMPLATE)
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma")  # shares the session's worker
    try:
        url = fleet.add_api("--chat-template-file", str(template),  # greedy: the same text
                            "--ui-config", json.dumps({"max_tokens": 16, "temperature": 0}))
        page.goto(f"{url}/")
        expect(page.get_by_label("Model")).to_have_value("gemma")
        before = _send(page, "Why is the sky blue?")
        expect(page.locator(".message.assistant details.reasoning summary")).to_have_text(
            "Reasoning…", timeout=120_000)  # shown while it streams, before any answer text
        _wait_answered(page, before)
        reasoning = page.locator(".message.assistant details.reasoning")
        expect(reasoning).not_to_have_attribute("open", "")
        expect(reasoning.locator(".markdown")).to_be_hidden()
        reasoning.locator("summary").click()
        expect(reasoning.locator(".markdown")).to_be_visible()
        assert reasoning.locator(".markdown").inner_text().strip()
        shot(page, "reasoning-folded")
    finally:
        fleet.stop()


def test_chat_calls_server_tools(redis_url: str, workdir: Path, gemma_path: Path, page: Page,
                                 api: str, shot: Shot) -> None:
    """--tools: the chat offers the pod's tools, the model's tool call runs on the pod
    (POST /tools), its call and result show, and the model answers again with the result. A
    pod without tools shows no tool choice."""
    page.goto(f"{api}/")
    expect(page.get_by_label("Model")).to_have_value("gemma")
    expect(page.locator("select[name=tool-mode]")).to_have_count(0)
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma")  # shares the session's worker
    try:
        url = fleet.add_api("--tools", "get_info")
        page.goto(f"{url}/")
        expect(page.get_by_label("Model")).to_have_value("gemma")
        expect(page.locator(".tool-mode")).to_contain_text("Tools (1)")
        page.select_option("select[name=tool-mode]", "required")  # the first answer calls one
        _open_settings(page)  # room for the whole call (the grammar allows spaces), greedy
        page.fill("input[name=max_tokens]", "96")
        page.fill("input[name=temperature]", "0")
        page.get_by_role("button", name="Close").click()
        page.fill("textarea[name=message]", "What operating system is the server running?")
        page.get_by_role("button", name="Send").click()
        expect(page.locator(".tool-call .tool-name").first).to_have_text("get_info",
                                                                        timeout=120_000)
        result = page.locator(".message.tool").first
        expect(result).to_contain_text("Tool get_info result", timeout=60_000)
        expect(page.locator(".chat-layout")).to_have_attribute("data-finished", "1",
                                                               timeout=180_000)
        result.locator("summary").click()
        expect(result.locator(".tool-output")).to_contain_text("Linux")
        shot(page, "chat-server-tools")
        # the model was asked again, with the tool's result: an answer after the tool message
        assert page.locator(".message.assistant").count() >= 2
        assert not page.locator(".message.assistant .error").count()
    finally:
        fleet.stop()
