"""Tenants stay in their lane (issue 43, items 6, 7 and 13's first half), on a real fleet
(Redis, an api pod with --tenants, a worker on Gemma 3 270M), as a caller would try it:

- a stream dropped and resumed (`Last-Event-ID`) keeps its max_concurrent place, and every
  token it generates is charged once, resumed or abandoned;
- what changes the fleet for everyone (models, global LoRA scales, slot saves and erasures,
  /tools, /cors-proxy) is the admin tenant's: 403 `permission_error` for another;
- `/slots` shows a request's `params` to its tenant and the admin only, `/metrics` names
  other tenants to the admin only;
- `/v1/chat/completions/control` ends only the caller's own completion, also after a resume.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from scheduler.contract import keys, tenant_keys
from tests.conftest import make_fleet
from tests.processes import Fleet, wait_until

pytestmark = pytest.mark.process

TENANTS: list[dict[str, Any]] = [
    {"name": "alice", "keys": ["k-alice"], "max_concurrent": 1,
     "tokens_per_minute": 10_000_000},
    {"name": "bob", "keys": ["k-bob"]},
    {"name": "ops", "keys": ["k-ops"], "admin": True},
]
ALIAS = "gemma-lanes"
LONG = {"prompt": "Tell me a long story", "n_predict": 900, "ignore_eos": True,
        "stream": True}
THINKING = [{"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "<think>"}]


@pytest.fixture(scope="module")
def lanes(redis_url: str, workdir: Path, gemma_path: Path) -> Iterator[str]:
    path = workdir / "tenants-lanes.json"
    path.write_text(json.dumps({"tenants": TENANTS}))
    fleet: Fleet = make_fleet(redis_url, workdir, gemma_path, ALIAS)
    fleet.add_worker("-c", "4096", "-np", "4", "-t", "2", "-n", "8",
                     "--slot-save-path", str(workdir / "slots-lanes"))
    url = fleet.add_api("--tenants", str(path), "--api-key", "k-default", "--metrics",
                        "--slots")
    fleet.wait_healthy(url)
    warm = httpx.post(f"{url}/completion", headers=auth("k-ops"), timeout=120,
                      json={"prompt": "Once upon a time", "n_predict": 2})
    assert warm.status_code == 200, warm.text  # the worker's first decode is slow
    yield url
    fleet.stop()


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def complete(url: str, key: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{url}/completion", headers=auth(key), timeout=60,
                      json={"prompt": "Once upon a time", "n_predict": 4, **body})


def first_event_id(response: httpx.Response) -> tuple[str, Iterator[str]]:
    """The id of the stream's first event that carries data, and the lines after it."""
    lines = response.iter_lines()
    event_id = ""
    for line in lines:
        if line.startswith("id:"):
            event_id = line.removeprefix("id:").strip()
        elif line.startswith("data:") and event_id:
            return event_id, lines
    raise AssertionError("the stream ended before its first event")


def charged(redis_url: str, tenant: str) -> int:
    value = redis.Redis.from_url(redis_url).hget(tenant_keys.TENANT_COUNTERS, f"tokens:{tenant}")
    return int(value or 0)  # type: ignore[arg-type]


def alice_free(url: str) -> bool:
    return complete(url, "k-alice").status_code == 200


def test_a_resumed_stream_keeps_its_place(lanes: str) -> None:
    """max_concurrent 1: a stream dropped and resumed still holds alice's one place, after the
    resume's grace too; the place is free once the resumed stream is dropped for good."""
    wait_until(lambda: alice_free(lanes), 20, what="alice's place free")
    with httpx.stream("POST", f"{lanes}/completion", headers=auth("k-alice"), timeout=60,
                      json=LONG) as dropped:
        assert dropped.status_code == 200
        event_id, _ = first_event_id(dropped)
    with httpx.stream("POST", f"{lanes}/completion", timeout=60, json=LONG,
                      headers={**auth("k-alice"), "Last-Event-ID": event_id}) as resumed:
        assert resumed.status_code == 200
        lines = resumed.iter_lines()
        assert next(line for line in lines if line.startswith("data:"))
        refused = complete(lanes, "k-alice")
        assert refused.status_code == 429, refused.text
        assert "max_concurrent" in refused.json()["error"]["message"]
        time.sleep(keys.RESUME_GRACE_S + 1)  # the dropped request's grace is over
        assert next(line for line in lines if line.startswith("data:"))
        assert complete(lanes, "k-alice").status_code == 429
    wait_until(lambda: alice_free(lanes), 20, what="alice's place freed after the resume")


def test_a_resumed_stream_is_charged_once_for_every_token(lanes: str, redis_url: str) -> None:
    wait_until(lambda: alice_free(lanes), 20, what="alice's place free")
    before = charged(redis_url, "alice")
    body = {**LONG, "n_predict": 120}
    with httpx.stream("POST", f"{lanes}/completion", headers=auth("k-alice"), timeout=60,
                      json=body) as dropped:
        event_id, _ = first_event_id(dropped)
    final: dict[str, Any] = {}
    with httpx.stream("POST", f"{lanes}/completion", timeout=120, json=body,
                      headers={**auth("k-alice"), "Last-Event-ID": event_id}) as resumed:
        assert resumed.status_code == 200
        for line in resumed.iter_lines():
            if line.startswith("data:"):
                chunk = json.loads(line.removeprefix("data:"))
                if chunk.get("stop"):
                    final = chunk
    assert final["tokens_predicted"] == 120
    total = final["tokens_evaluated"] + final["tokens_predicted"]
    wait_until(lambda: charged(redis_url, "alice") - before == total, 10,
               what=f"{total} tokens charged to alice")


def test_an_abandoned_stream_is_charged_for_what_it_generated(lanes: str,
                                                             redis_url: str) -> None:
    """Dropped and never resumed: the tokens its job generated before the grace cancelled it
    are charged, though no client read them."""
    wait_until(lambda: alice_free(lanes), 20, what="alice's place free")
    with httpx.stream("POST", f"{lanes}/completion", headers=auth("k-alice"), timeout=60,
                      json=LONG) as dropped:
        first_event_id(dropped)
    time.sleep(0.5)
    at_drop = charged(redis_url, "alice")
    time.sleep(keys.RESUME_GRACE_S + 1.5)  # the grace is over: the job was cancelled
    assert charged(redis_url, "alice") > at_drop
    wait_until(lambda: alice_free(lanes), 20, what="alice's place freed after the grace")


def test_fleet_changes_are_the_admins(lanes: str) -> None:
    changes: list[tuple[str, str, Any]] = [
        ("POST", "/lora-adapters", []), ("POST", "/slots/0?action=erase", None),
        ("POST", "/slots/0?action=save", {"filename": "x"}),
        ("POST", "/models", {"model": "some/model"}), ("DELETE", "/models?model=x", None),
        ("POST", "/models/load", {"model": "x"}), ("POST", "/models/unload", {"model": "x"}),
        ("GET", "/tools", None), ("POST", "/tools", {"tool": "read_file"}),
        ("GET", "/cors-proxy?url=http://example.com/", None)]
    for key in ("k-bob", "k-default"):
        for method, path, body in changes:
            answer = httpx.request(method, f"{lanes}{path}", headers=auth(key), json=body,
                                   timeout=30)
            assert answer.status_code == 403, (key, method, path, answer.text)
            assert answer.json()["error"]["type"] == "permission_error", answer.text
    assert httpx.post(f"{lanes}/slots/0?action=erase", headers=auth("k-ops"),
                      timeout=30).status_code == 200
    assert httpx.post(f"{lanes}/lora-adapters", headers=auth("k-ops"), json=[],
                      timeout=30).status_code != 403


SEED = "987654321"


def test_slots_show_a_requests_params_to_its_tenant_only(lanes: str) -> None:
    body = {**LONG, "seed": 987654321}  # shown in the slot's params
    with httpx.stream("POST", f"{lanes}/completion", headers=auth("k-bob"), timeout=60,
                      json=body) as running:
        _, rest = first_event_id(running)  # kept: a dropped iterator closes the stream

        def slots(key: str) -> str:
            return httpx.get(f"{lanes}/slots", headers=auth(key), timeout=30).text

        wait_until(lambda: SEED in slots("k-bob"), 10,
                   what="the slot's state in the registry")
        seen: dict[str, str] = {}
        for key in ("k-bob", "k-ops", "k-alice", "k-default"):
            seen[key] = slots(key)
        assert next(rest) is not None
    assert SEED in seen["k-bob"] and SEED in seen["k-ops"]
    assert SEED not in seen["k-alice"]
    assert SEED not in seen["k-default"]
    assert any(s["is_processing"] for s in json.loads(seen["k-alice"]))  # the rest is shown


def test_metrics_name_other_tenants_to_the_admin_only(lanes: str) -> None:
    assert complete(lanes, "k-bob").status_code == 200

    def tenants_named(key: str) -> set[str]:
        text = httpx.get(f"{lanes}/metrics", headers=auth(key), timeout=30).text
        return {line.split('tenant="')[1].split('"')[0] for line in text.splitlines()
                if line.startswith("llamaq:tenant_")}

    assert tenants_named("k-bob") == {"bob"}
    assert tenants_named("k-ops") >= {"alice", "bob", "ops", "default"}


def control(lanes: str, key: str, completion_id: str) -> Any:
    return httpx.post(f"{lanes}/v1/chat/completions/control", headers=auth(key), timeout=30,
                      json={"id": completion_id, "action": "reasoning_end"}).json()


def test_control_is_the_owners_and_works_after_a_resume(lanes: str) -> None:
    client = httpx.Client(timeout=120)
    body = {"messages": THINKING, "max_tokens": 400, "temperature": 0, "stream": True,
            "reasoning_format": "deepseek", "reasoning_control": True}
    with client.stream("POST", f"{lanes}/v1/chat/completions", headers=auth("k-bob"),
                       json=body) as dropped:
        event_id, lines = first_event_id(dropped)
        completion_id = json.loads(next(line for line in lines if line.startswith("data:"))
                                   .removeprefix("data:"))["id"]
        assert control(lanes, "k-alice", completion_id)["success"] is False
    content = ""
    chunks_after_ask: int | None = None
    with client.stream("POST", f"{lanes}/v1/chat/completions", json=body,
                       headers={**auth("k-bob"), "Last-Event-ID": event_id}) as resumed:
        assert resumed.status_code == 200
        for line in resumed.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            if not chunk["choices"]:
                continue
            content += chunk["choices"][0]["delta"].get("content") or ""
            if chunks_after_ask is None:
                assert control(lanes, "k-alice", completion_id)["success"] is False
                assert control(lanes, "k-bob", completion_id) == {"success": True}
                chunks_after_ask = 0
            elif not content:
                chunks_after_ask += 1
    assert content, "the thinking block never ended"
    assert chunks_after_ask is not None and chunks_after_ask < 10
