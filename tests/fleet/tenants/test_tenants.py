"""Tenants on a real fleet (--tenants): real Redis, real api pods and Gemma 3 270M on real
llama.cpp (slow enough that a long stream still runs when the next request comes), real HTTP
clients (httpx, the openai SDK for the 429's shape): limits refused with 429 and Retry-After
before anything is queued, tokens counted, a batch tenant's jobs in the batch lane, ownership of
files, batches and streams (another tenant: 404; the admin: all), SIGHUP re-reads the file,
per-tenant metrics."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis

from scheduler.contract import keys
from tests.conftest import make_fleet
from tests.processes import Fleet, wait_until

pytestmark = pytest.mark.process

TENANTS: list[dict[str, Any]] = [
    {"name": "alice", "keys": ["k-alice"], "max_concurrent": 1, "max_file_bytes": 2000},
    {"name": "bob", "keys": ["k-bob"], "tokens_per_minute": 60},
    {"name": "carol", "keys": ["k-carol"], "requests_per_minute": 2},
    {"name": "erin", "keys": ["k-erin"], "priority": "batch"},
    {"name": "ops", "keys": ["k-ops"], "admin": True},
    {"name": "frank", "keys": ["k-frank"], "max_stored_bytes": 1000},
]
ALIAS = "gemma-tenants"


def write_tenants(path: Path, tenants: list[dict[str, Any]]) -> None:
    path.write_text(json.dumps({"tenants": tenants}))


@pytest.fixture(scope="module")
def tenants_file(workdir: Path) -> Path:
    path = workdir / "tenants.json"
    write_tenants(path, TENANTS)
    return path


@pytest.fixture(scope="module")
def tenant_fleet(redis_url: str, workdir: Path, gemma_path: Path,
                 tenants_file: Path) -> Iterator[Fleet]:
    fleet = make_fleet(redis_url, workdir, gemma_path, ALIAS)
    fleet.add_worker("-c", "4096", "-np", "4", "-t", "2", "-n", "8",
                     "--slot-save-path", str(workdir / "slots"))
    url = fleet.add_api("--tenants", str(tenants_file), "--api-key", "k-default", "--metrics")
    fleet.wait_healthy(url)
    warm = httpx.post(f"{url}/completion", headers=auth("k-ops"), timeout=120,
                      json={"prompt": "Once upon a time", "n_predict": 2})
    assert warm.status_code == 200, warm.text  # the worker's first decode is slow
    yield fleet
    fleet.stop()


def api(fleet: Fleet) -> str:
    return fleet.api_urls[0]


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def complete(fleet: Fleet, key: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{api(fleet)}/completion", headers=auth(key), timeout=60,
                      json={"prompt": "Once upon a time", "n_predict": 4, **body})


def first_lines(response: httpx.Response) -> Iterator[str]:
    """Read up to the first token's data line (the job is running); the rest to come (keep
    it: a dropped line iterator closes the response, and the client is gone)."""
    lines = response.iter_lines()
    for line in lines:
        if line.startswith("data:"):
            break
    return lines


def test_a_key_of_no_tenant_is_refused(tenant_fleet: Fleet) -> None:
    assert complete(tenant_fleet, "k-nobody").status_code == 401
    assert complete(tenant_fleet, "k-default").status_code == 200  # --api-key: default


def test_requests_per_minute_answer_429_in_openai_shape(tenant_fleet: Fleet) -> None:
    client = openai.OpenAI(base_url=f"{api(tenant_fleet)}/v1", api_key="k-carol",
                           max_retries=0, timeout=60)
    for _ in range(2):
        client.completions.create(model=ALIAS, prompt="Hi", max_tokens=2)
    with pytest.raises(openai.RateLimitError) as caught:
        client.completions.create(model=ALIAS, prompt="Hi", max_tokens=2)
    error = caught.value
    assert error.status_code == 429
    assert 1 <= int(error.response.headers["Retry-After"]) <= 30
    body = error.response.json()["error"]
    assert body["type"] == "rate_limit_exceeded" and body["code"] == 429
    assert "requests_per_minute" in body["message"]


def test_max_concurrent_refuses_a_second_job_while_one_runs(tenant_fleet: Fleet) -> None:
    url = api(tenant_fleet)
    with httpx.stream("POST", f"{url}/completion", headers=auth("k-alice"), timeout=60,
                      json={"prompt": "Tell me", "n_predict": 900, "ignore_eos": True,
                            "stream": True}) as running:
        assert running.status_code == 200
        rest = first_lines(running)
        refused = complete(tenant_fleet, "k-alice")
        assert refused.status_code == 429, (refused.text, next(rest))
        assert refused.headers["Retry-After"] == "1"
        assert "max_concurrent" in refused.json()["error"]["message"]
        assert complete(tenant_fleet, "k-ops").status_code == 200  # others are not held
    # the stream's client left: its job is cancelled and its place is free again
    wait_until(lambda: complete(tenant_fleet, "k-alice").status_code == 200, 20,
               what="alice's place freed")


def test_tokens_per_minute_count_prompt_and_output(tenant_fleet: Fleet) -> None:
    first = complete(tenant_fleet, "k-bob", n_predict=64, ignore_eos=True)
    assert first.status_code == 200
    assert first.json()["tokens_predicted"] == 64
    refused = complete(tenant_fleet, "k-bob")
    assert refused.status_code == 429
    assert int(refused.headers["Retry-After"]) >= 4  # >= 5 tokens of debt at 1 token/s
    assert "tokens_per_minute" in refused.json()["error"]["message"]


def test_a_batch_tenants_jobs_wait_in_the_batch_lane(tenant_fleet: Fleet,
                                                     redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    wait_until(lambda: r.zcard(keys.batch_queue(ALIAS)) == 0 == r.zcard(keys.slot_queue(ALIAS)),
               timeout=60, what="the queues empty of earlier tests' jobs")
    with httpx.stream("POST", f"{api(tenant_fleet)}/completion", headers=auth("k-erin"),
                      timeout=60, json={"prompt": "Tell me", "n_predict": 900,
                                        "ignore_eos": True, "stream": True}) as running:
        assert running.status_code == 200
        rest = first_lines(running)
        assert r.zcard(keys.batch_queue(ALIAS)) == 1
        assert r.zcard(keys.slot_queue(ALIAS)) == 0, r.zrange(keys.slot_queue(ALIAS), 0, -1)
        assert next(rest) is not None


def test_files_belong_to_their_tenant(tenant_fleet: Fleet) -> None:
    url = api(tenant_fleet)
    line = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions",
                       "body": {"model": ALIAS, "prompt": "Hi", "max_tokens": 2}}) + "\n"
    made = httpx.post(f"{url}/v1/files", headers=auth("k-alice"), timeout=60,
                      data={"purpose": "batch"},
                      files={"file": ("in.jsonl", line.encode(), "application/jsonl")})
    assert made.status_code == 200, made.text
    assert "owner" not in made.json()
    file_id = made.json()["id"]
    for method, path in (("GET", f"/v1/files/{file_id}"),
                         ("GET", f"/v1/files/{file_id}/content"),
                         ("DELETE", f"/v1/files/{file_id}")):
        other = httpx.request(method, url + path, headers=auth("k-bob"), timeout=60)
        assert other.status_code == 404, (method, path, other.text)
    listed = httpx.get(f"{url}/v1/files", headers=auth("k-erin"), timeout=60).json()
    assert file_id not in [f["id"] for f in listed["data"]]
    seen = httpx.get(f"{url}/v1/files", headers=auth("k-ops"), timeout=60).json()
    assert file_id in [f["id"] for f in seen["data"]]
    assert httpx.get(f"{url}/v1/files/{file_id}", headers=auth("k-ops")).status_code == 200
    # a batch of another tenant's file: 404, as if it were not there
    batch = {"input_file_id": file_id, "endpoint": "/v1/completions",
             "completion_window": "24h"}
    assert httpx.post(f"{url}/v1/batches", headers=auth("k-erin"), json=batch,
                      timeout=60).status_code == 404
    made_batch = httpx.post(f"{url}/v1/batches", headers=auth("k-alice"), json=batch,
                            timeout=60)
    assert made_batch.status_code == 200, made_batch.text
    batch_id = made_batch.json()["id"]
    assert httpx.get(f"{url}/v1/batches/{batch_id}", headers=auth("k-erin")).status_code == 404
    assert httpx.post(f"{url}/v1/batches/{batch_id}/cancel",
                      headers=auth("k-erin")).status_code == 404
    others = httpx.get(f"{url}/v1/batches", headers=auth("k-erin")).json()["data"]
    assert batch_id not in [b["id"] for b in others]
    mine = httpx.get(f"{url}/v1/batches", headers=auth("k-alice")).json()["data"]
    assert batch_id in [b["id"] for b in mine]
    assert httpx.get(f"{url}/v1/batches/{batch_id}", headers=auth("k-ops")).status_code == 200

    def done() -> bool:
        got = httpx.get(f"{url}/v1/batches/{batch_id}", headers=auth("k-alice")).json()
        return bool(got["status"] == "completed")

    wait_until(done, 60, what="alice's batch completed")
    output = httpx.get(f"{url}/v1/batches/{batch_id}", headers=auth("k-alice")).json()
    out_id = output["output_file_id"]
    assert httpx.get(f"{url}/v1/files/{out_id}", headers=auth("k-alice")).status_code == 200
    assert httpx.get(f"{url}/v1/files/{out_id}", headers=auth("k-erin")).status_code == 404


def test_file_size_limit_of_a_tenant(tenant_fleet: Fleet) -> None:
    big = httpx.post(f"{api(tenant_fleet)}/v1/files", headers=auth("k-alice"), timeout=60,
                     data={"purpose": "batch"}, files={"file": ("in.jsonl", b"x" * 3000)})
    assert big.status_code == 413
    assert "max_file_bytes" in big.json()["error"]["message"]


def test_uploads_that_arrive_together_count_each_other(tenant_fleet: Fleet) -> None:
    """max_stored_bytes holds for uploads sent at the same instant (each is reserved in
    Redis before the tenant's files are counted): of eight 400-byte uploads against 1000
    bytes, exactly two are stored."""
    url = f"{api(tenant_fleet)}/v1/files"

    def upload(i: int) -> httpx.Response:
        return httpx.post(url, headers=auth("k-frank"), timeout=60, data={"purpose": "batch"},
                          files={"file": (f"in-{i}.jsonl", b"y" * 400)})

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(upload, range(8)))
    assert sorted(a.status_code for a in answers) == [200] * 2 + [413] * 6, \
        [a.text[:120] for a in answers]
    listed = httpx.get(url, headers=auth("k-frank"), timeout=30).json()["data"]
    assert sum(f["bytes"] for f in listed) == 800


def test_streams_are_stopped_and_resumed_only_by_their_tenant(tenant_fleet: Fleet) -> None:
    url = api(tenant_fleet)
    with httpx.stream("POST", f"{url}/completion", headers=auth("k-erin"), timeout=60,
                      json={"prompt": "Tell me", "n_predict": 900, "ignore_eos": True,
                            "stream": True}) as running:
        lines = running.iter_lines()
        event_id = next(line for line in lines if line.startswith("id:"))
        event_id = event_id.removeprefix("id:").strip()
        record = event_id.partition("-")[0]
        assert httpx.delete(f"{url}/v1/streams/{record}",
                            headers=auth("k-bob")).status_code == 404
        resumed = httpx.post(f"{url}/completion", timeout=60,
                             headers={**auth("k-bob"), "Last-Event-ID": event_id},
                             json={"prompt": "Tell me", "stream": True})
        assert resumed.status_code == 404
        stopped = httpx.delete(f"{url}/v1/streams/{record}", headers=auth("k-erin"))
        assert stopped.status_code == 200 and stopped.json()["stopped"] == 1
        assert next(lines) is not None


def test_sighup_rereads_the_file(tenant_fleet: Fleet, tenants_file: Path) -> None:
    assert complete(tenant_fleet, "k-dave").status_code == 401
    write_tenants(tenants_file, [*TENANTS, {"name": "dave", "keys": ["k-dave"]}])
    api_process = next(p for p in tenant_fleet.processes if "api" in p.args)  # type: ignore[operator]
    os.kill(api_process.pid, signal.SIGHUP)
    wait_until(lambda: complete(tenant_fleet, "k-dave").status_code == 200, 10,
               what="dave's key after SIGHUP")
    write_tenants(tenants_file, TENANTS)
    os.kill(api_process.pid, signal.SIGHUP)
    wait_until(lambda: complete(tenant_fleet, "k-dave").status_code == 401, 10,
               what="dave's key gone after SIGHUP")


def test_metrics_and_fleet_page_count_per_tenant(tenant_fleet: Fleet) -> None:
    url = api(tenant_fleet)
    assert complete(tenant_fleet, "k-ops", n_predict=3, ignore_eos=True).status_code == 200
    time.sleep(0.2)
    text = httpx.get(f"{url}/metrics", headers=auth("k-ops")).text
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
              if line.startswith("llamaq:tenant_")}
    assert values['llamaq:tenant_tokens_total{tenant="ops"}'] >= 3
    assert values['llamaq:tenant_requests_total{tenant="ops"}'] >= 1
    assert 'llamaq:tenant_rate_limited_total{tenant="alice"}' in values
    fleet_page = httpx.get(f"{url}/fleet", headers=auth("k-ops")).json()
    names = {t["name"] for t in fleet_page["tenants"]}
    assert {"default", "alice", "bob", "ops"} <= names
    own = httpx.get(f"{url}/fleet", headers=auth("k-erin")).json()["tenants"]
    assert [t["name"] for t in own] == ["erin"]


def test_a_saved_slot_is_its_tenants(tenant_fleet: Fleet) -> None:
    """Saved slots belong to the tenant that saved them: another tenant's restore of the name
    is 404, as a name nobody saved is (ids leak nothing); the owner restores it."""
    url = api(tenant_fleet)
    assert complete(tenant_fleet, "k-ops", id_slot=0).status_code == 200
    saved = httpx.post(f"{url}/slots/0?action=save", headers=auth("k-ops"),
                       json={"filename": "ops-slot"}, timeout=60)
    assert saved.status_code == 200, saved.text
    for key, name in (("k-erin", "ops-slot"), ("k-erin", "never-saved")):
        other = httpx.post(f"{url}/slots/0?action=restore", headers=auth(key),
                           json={"filename": name}, timeout=60)
        assert other.status_code == 404, other.text
        assert other.json()["error"]["type"] == "not_found_error"
    own = httpx.post(f"{url}/slots/0?action=restore", headers=auth("k-ops"),
                     json={"filename": "ops-slot"}, timeout=60)
    assert own.status_code == 200, own.text
