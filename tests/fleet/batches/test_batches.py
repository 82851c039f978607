"""The OpenAI Files + Batch API on a real fleet: the openai SDK as the client, real Redis, a real
S3 endpoint (moto) as the object store, the tiny GGUF on real llama.cpp workers; a worker
SIGKILLed mid-batch, an api pod (the batch's driver) SIGKILLed mid-batch, cancel, bad lines."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import numpy as np
import openai
import pytest
import redis
from moto.server import ThreadedMotoServer

from tests.conftest import make_fleet
from tests.processes import Fleet, free_port, wait_until

WORKER = ("-c", "4096", "-np", "4", "-t", "1", "-n", "12")


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    with pytest.MonkeyPatch.context() as patch:
        for name, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                            "AWS_DEFAULT_REGION": "us-east-1"}.items():
            patch.setenv(name, value)  # the fleet's processes inherit them
        for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            patch.delenv(name, raising=False)
        yield f"http://127.0.0.1:{port}"
    server.stop()


def s3_fleet(redis_url: str, workdir: Path, model: Path, s3_endpoint: str) -> Fleet:
    """A fleet whose store is a fresh bucket on the moto server."""
    bucket = f"batch-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    alias = f"tiny-{bucket}"
    fleet = make_fleet(redis_url, workdir, model, alias)
    fleet.common += ["--store-url", f"s3://{bucket}/llamaq", "--s3-endpoint-url", s3_endpoint]
    return fleet


@pytest.fixture(scope="module")
def batch_fleet(redis_url: str, workdir: Path, tiny_model_path: Path,
                s3_endpoint: str) -> Iterator[Fleet]:
    fleet = s3_fleet(redis_url, workdir, tiny_model_path, s3_endpoint)
    fleet.add_worker(*WORKER)
    fleet.wait_healthy(fleet.add_api("--metrics"))
    yield fleet
    fleet.stop()


def client_of(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=60)


def chat_line(custom_id: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "tiny", "messages": [{"role": "user", "content": text}],
                     "max_tokens": 8, **extra}}


def jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def upload(client: openai.OpenAI, data: bytes) -> str:
    return client.files.create(file=("input.jsonl", data), purpose="batch").id


def wait_final(client: openai.OpenAI, batch_id: str, timeout: float = 180) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "cancelled", "expired"):
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status}: {batch}"
        time.sleep(0.3)


def read_lines(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def once_each(lines: list[dict[str, Any]]) -> set[str]:
    ids = [line["custom_id"] for line in lines]
    assert len(ids) == len(set(ids)), "a custom_id appears more than once"
    return set(ids)


def test_chat_batch_with_bad_lines(batch_fleet: Fleet) -> None:
    client = client_of(batch_fleet.api_urls[0])
    lines = [chat_line(f"req-{i}", f"hello {i}") for i in range(40)]
    lines[7]["body"]["max_tokens"] = "many"  # a bad request: 400, in the error file
    lines[23]["body"]["messages"] = []
    file_id = upload(client, jsonl(lines))
    assert client.files.retrieve(file_id).purpose == "batch"
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"run": "one"})
    assert batch.status == "validating" and batch.metadata == {"run": "one"}
    assert batch.expires_at == batch.created_at + 24 * 3600
    done = wait_final(client, batch.id)
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed,
            done.request_counts.failed) == (40, 38, 2)
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    output, errors = read_lines(client, done.output_file_id), read_lines(client,
                                                                        done.error_file_id)
    assert [line["custom_id"] for line in output] == [
        f"req-{i}" for i in range(40) if i not in (7, 23)]  # input order, each once
    for line in output:
        assert line["id"].startswith("batch_req_") and line["error"] is None
        response = line["response"]
        assert response["status_code"] == 200 and response["request_id"]
        assert response["body"]["object"] == "chat.completion"
        assert response["body"]["choices"][0]["message"]["role"] == "assistant"
    assert [line["custom_id"] for line in errors] == ["req-7", "req-23"]
    for line in errors:
        assert line["response"]["status_code"] == 400
        assert line["response"]["body"]["error"]["type"] == "invalid_request_error"
    output_file = client.files.retrieve(done.output_file_id)
    assert output_file.purpose == "batch_output" and output_file.bytes > 0


def test_completions_batch_and_listing(batch_fleet: Fleet) -> None:
    client = client_of(batch_fleet.api_urls[0])
    lines = [{"custom_id": f"c{i}", "method": "POST", "url": "/v1/completions",
              "body": {"prompt": f"once upon {i}", "max_tokens": 4, "temperature": 0}}
             for i in range(6)]
    file_id = upload(client, jsonl(lines))
    ids = [client.batches.create(input_file_id=file_id, endpoint="/v1/completions",
                                 completion_window="24h").id for _ in range(3)]
    for batch_id in ids:
        done = wait_final(client, batch_id)
        assert done.status == "completed" and done.error_file_id is None
        output = read_lines(client, done.output_file_id)
        assert once_each(output) == {f"c{i}" for i in range(6)}
        assert all(o["response"]["body"]["object"] == "text_completion" for o in output)
    first = client.batches.list(limit=2)
    assert [b.id for b in first.data] == [ids[2], ids[1]] and first.has_more
    second = client.batches.list(limit=2, after=ids[1])
    assert second.data[0].id == ids[0]
    assert client.files.delete(file_id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(file_id)
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nothere")


@pytest.mark.parametrize(("data", "code"), [
    (b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'
     b"not json\n", "invalid_json_line"),
    (jsonl([chat_line("a", "x"), chat_line("a", "y")]), "duplicate_custom_id"),
    (jsonl([{**chat_line("a", "x"), "url": "/v1/completions"}]), "invalid_url"),
    (jsonl([chat_line("a", "x"), {**chat_line("b", "y"), "body": {
        "model": "other", "messages": [{"role": "user", "content": "y"}]}}]),
     "mismatched_model"),
    (jsonl([{"method": "POST", "url": "/v1/chat/completions", "body": {}}]),
     "missing_required_parameter"),
    (b"\n\n", "empty_file"),
])
def test_bad_input_fails_the_batch(batch_fleet: Fleet, data: bytes, code: str) -> None:
    client = client_of(batch_fleet.api_urls[0])
    batch = client.batches.create(input_file_id=upload(client, data),
                                  endpoint="/v1/chat/completions", completion_window="24h")
    done = wait_final(client, batch.id)
    assert done.status == "failed" and done.failed_at, done
    assert done.errors is not None and done.errors.data
    assert code in [e.code for e in done.errors.data]
    assert done.output_file_id is None and done.error_file_id is None


def test_bad_batch_requests(batch_fleet: Fleet) -> None:
    client = client_of(batch_fleet.api_urls[0])
    file_id = upload(client, jsonl([chat_line("a", "x")]))
    with pytest.raises(openai.BadRequestError, match="endpoint"):
        client.batches.create(input_file_id=file_id, endpoint="/v1/moderations",  # type: ignore[arg-type]
                              completion_window="24h")
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                              completion_window="1h")  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="output_expires_after"):
        client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                              completion_window="24h",
                              output_expires_after={"anchor": "created_at", "seconds": 3600})
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-nothere", endpoint="/v1/chat/completions",
                              completion_window="24h")
    with pytest.raises(openai.BadRequestError, match="purpose"):
        client.files.create(file=("x.jsonl", b"{}"), purpose="fine-tune")
    api = batch_fleet.api_urls[0]
    response = httpx.post(f"{api}/v1/files", files={"file": ("x.jsonl", b"{}")})
    assert response.status_code == 400 and "purpose" in response.json()["error"]["message"]


def test_cancel_finalizes_what_is_done(batch_fleet: Fleet) -> None:
    client = client_of(batch_fleet.api_urls[0])
    lines = [chat_line(f"k{i}", f"story {i}", max_tokens=48) for i in range(400)]
    batch = client.batches.create(input_file_id=upload(client, jsonl(lines)),
                                  endpoint="/v1/chat/completions", completion_window="24h")
    wait_until(lambda: client.batches.retrieve(batch.id).request_counts.completed > 0,  # type: ignore[union-attr]
               timeout=120, what="some lines done")
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at
    done = wait_final(client, batch.id, timeout=60)
    assert done.status == "cancelled" and done.cancelled_at
    assert done.request_counts is not None
    output = read_lines(client, done.output_file_id)
    assert once_each(output) <= {f"k{i}" for i in range(400)}
    assert len(output) == done.request_counts.completed < 400
    again = client.batches.cancel(done.id)  # cancelling a cancelled batch changes nothing
    assert again.status == "cancelled" and again.cancelled_at == done.cancelled_at
    finished = client.batches.create(input_file_id=upload(client, jsonl([chat_line("a", "b")])),
                                     endpoint="/v1/chat/completions", completion_window="24h")
    assert wait_final(client, finished.id).status == "completed"
    with pytest.raises(openai.BadRequestError, match="completed"):
        client.batches.cancel(finished.id)


def rerun_jobs(redis_url: str, fleet: Fleet) -> int:
    """Jobs of the fleet's model that ran again (or ended) because their worker died."""
    alias = fleet.common[fleet.common.index("--alias") + 1]
    counters: dict[bytes, bytes] = redis.Redis.from_url(redis_url).hgetall(  # type: ignore[assignment]
        f"llamaq:model:{alias}:counters")
    return sum(int(counters.get(k, 0)) for k in (b"retried", b"failed:worker_died"))


def busy_slots(api: str, worker_id: str) -> int:
    """How many slots the worker last reported busy (through the api's /fleet)."""
    workers = httpx.get(f"{api}/fleet").json()["workers"]
    return sum(slot["is_processing"] for worker in workers if worker["worker_id"] == worker_id
               for slot in worker.get("slots") or [])


def test_a_worker_killed_mid_batch_loses_nothing(redis_url: str, workdir: Path,
                                                 tiny_model_path: Path,
                                                 s3_endpoint: str) -> None:
    fleet = s3_fleet(redis_url, workdir, tiny_model_path, s3_endpoint)
    try:
        doomed = fleet.add_worker(*WORKER, "--worker-id", "doomed")
        fleet.add_worker(*WORKER)
        api = fleet.add_api()
        fleet.wait_healthy(api)
        client = client_of(api)
        # Long lines: the slots the doomed worker last reported busy are still busy when
        # the kill comes (a 48-token line could end between the report and the kill).
        lines = [chat_line(f"w{i}", f"tale {i}", max_tokens=256, ignore_eos=True)
                 for i in range(120)]
        batch = client.batches.create(input_file_id=upload(client, jsonl(lines)),
                                      endpoint="/v1/chat/completions", completion_window="24h")
        wait_until(lambda: client.batches.retrieve(batch.id).request_counts.completed > 0,  # type: ignore[union-attr]
                   timeout=120, what="some lines done")
        wait_until(lambda: busy_slots(api, "doomed") >= 2, timeout=60,
                   what="the doomed worker running lines")
        doomed.kill()  # SIGKILL, with lines of the batch in its slots
        done = wait_final(client, batch.id, timeout=300)
        assert done.status == "completed", done
        assert rerun_jobs(redis_url, fleet) >= 1  # the kill did catch lines running
        output = read_lines(client, done.output_file_id)
        assert read_lines(client, done.error_file_id) == []
        assert [line["custom_id"] for line in output] == [f"w{i}" for i in range(120)]
    finally:
        fleet.stop()


def test_the_driver_killed_mid_batch_is_resumed_by_another_pod(
        redis_url: str, workdir: Path, tiny_model_path: Path, s3_endpoint: str) -> None:
    fleet = s3_fleet(redis_url, workdir, tiny_model_path, s3_endpoint)
    try:
        fleet.add_worker(*WORKER)
        first = fleet.add_api()
        fleet.wait_healthy(first)
        driver = fleet.processes[-1]
        client = client_of(first)
        lines = [chat_line(f"d{i}", f"fable {i}", max_tokens=32) for i in range(300)]
        batch = client.batches.create(input_file_id=upload(client, jsonl(lines)),
                                      endpoint="/v1/chat/completions", completion_window="24h")
        wait_until(lambda: client.batches.retrieve(batch.id).request_counts.completed > 0,  # type: ignore[union-attr]
                   timeout=120, what="some lines done")
        driver.kill()  # the only pod, and the batch's driver: SIGKILL
        second = fleet.add_api()
        client = client_of(second)
        assert client.batches.retrieve(batch.id).status == "in_progress"
        done = wait_final(client, batch.id, timeout=300)
        assert done.status == "completed", done
        assert done.request_counts is not None and done.request_counts.completed == 300
        output = read_lines(client, done.output_file_id)
        assert [line["custom_id"] for line in output] == [f"d{i}" for i in range(300)]
    finally:
        fleet.stop()


def test_a_batch_whose_input_went_mid_run_fails_and_is_not_retried(
        redis_url: str, workdir: Path, tiny_model_path: Path, s3_endpoint: str) -> None:
    """Its input file deleted mid-run, then its driver pod killed: the next pod that takes it
    up cannot read the input, and the batch fails with that error (it was retried for ever,
    and never expired)."""
    fleet = s3_fleet(redis_url, workdir, tiny_model_path, s3_endpoint)
    try:
        fleet.add_worker(*WORKER)
        first = fleet.add_api()
        fleet.wait_healthy(first)
        driver = fleet.processes[-1]
        client = client_of(first)
        lines = [chat_line(f"g{i}", f"tale {i}", max_tokens=32) for i in range(300)]
        input_id = upload(client, jsonl(lines))
        batch = client.batches.create(input_file_id=input_id,
                                      endpoint="/v1/chat/completions", completion_window="24h")
        wait_until(lambda: client.batches.retrieve(batch.id).request_counts.completed > 0,  # type: ignore[union-attr]
                   timeout=120, what="some lines done")
        assert client.files.delete(input_id).deleted
        driver.kill()
        client = client_of(fleet.add_api())
        done = wait_final(client, batch.id, timeout=120)
        assert done.status == "failed", done
        assert done.errors is not None and done.errors.data
        assert done.errors.data[0].code == "invalid_file"
        assert input_id in (done.errors.data[0].message or "")
    finally:
        fleet.stop()


def test_the_batch_command(batch_fleet: Fleet, tmp_path: Path) -> None:
    api = batch_fleet.api_urls[0]
    source = tmp_path / "lines.jsonl"
    source.write_bytes(jsonl([chat_line(f"cli-{i}", f"hi {i}") for i in range(5)]))

    def llamaq(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "llamaq", "batch", "--url", api, *args],
                              capture_output=True, text=True, timeout=120)

    submitted = llamaq("submit", str(source), "--wait", "--metadata", "who=cli")
    assert submitted.returncode == 0, submitted.stderr
    batch_id = submitted.stdout.split()[0]
    assert batch_id.startswith("batch_") and "completed" in submitted.stdout
    assert "5/5 lines" in submitted.stderr  # the progress bar's last state
    results = llamaq("results", batch_id)
    assert [json.loads(line)["custom_id"] for line in results.stdout.splitlines()] == [
        f"cli-{i}" for i in range(5)]
    assert batch_id in llamaq("list", "--limit", "3").stdout
    assert json.loads(llamaq("status", batch_id).stdout)["metadata"] == {"who": "cli"}
    refused = llamaq("cancel", batch_id)
    assert refused.returncode != 0 and "completed" in refused.stderr
    metrics = httpx.get(f"{api}/metrics").text
    assert "llamaq:batches_in_progress " in metrics
    completed = [line for line in metrics.splitlines()
                 if line.startswith("llamaq:batch_lines_completed_total ")]
    assert completed and float(completed[0].split()[1]) >= 5


def test_embeddings_batch(redis_url: str, workdir: Path, minilm_path: Path,
                          s3_endpoint: str) -> None:
    fleet = s3_fleet(redis_url, workdir, minilm_path, s3_endpoint)
    try:
        fleet.add_worker("--embedding", "-c", "512", "-np", "4", "-t", "1")
        api = fleet.add_api()
        fleet.wait_healthy(api)
        client = client_of(api)
        texts = [f"sentence number {i} about the sea" for i in range(150)]
        lines: list[dict[str, Any]] = [
            {"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
             "body": {"model": "minilm", "input": text}} for i, text in enumerate(texts)]
        lines[3]["body"]["input"] = [texts[3], "a second input of the same line"]
        lines[4]["body"]["encoding_format"] = "base64"
        lines[4]["body"]["input"] = texts[5]  # same text as line 5, as base64
        lines[10]["body"]["input"] = []  # bad: empty
        lines[11]["body"]["dimensions"] = 8  # bad: refused field
        batch = client.batches.create(input_file_id=upload(client, jsonl(lines)),
                                      endpoint="/v1/embeddings", completion_window="24h")
        done = wait_final(client, batch.id, timeout=300)
        assert done.status == "completed", done
        assert done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (148, 2)
        output = {o["custom_id"]: o for o in read_lines(client, done.output_file_id)}
        errors = read_lines(client, done.error_file_id)
        assert [e["custom_id"] for e in errors] == ["e10", "e11"]
        assert all(e["response"]["status_code"] == 400 for e in errors)
        assert len(output) == 148 and "e10" not in output and "e11" not in output
        body = output["e3"]["response"]["body"]
        assert [d["index"] for d in body["data"]] == [0, 1]
        assert body["object"] == "list" and body["usage"]["prompt_tokens"] > 0
        floats = output["e5"]["response"]["body"]["data"][0]["embedding"]
        assert len(floats) == 384
        packed = output["e4"]["response"]["body"]["data"][0]
        assert packed["encoding_format"] == "base64"
        unpacked = np.frombuffer(base64.b64decode(packed["embedding"]), dtype="<f4")
        assert np.allclose(unpacked, floats, atol=1e-5)
        online = httpx.post(f"{api}/v1/embeddings", json={"input": texts[7]}, timeout=60).json()
        batched = output["e7"]["response"]["body"]["data"][0]["embedding"]
        alone = np.array(online["data"][0]["embedding"])
        cosine = float(alone @ np.array(batched) / np.linalg.norm(alone) / np.linalg.norm(batched))
        assert cosine > 0.9999, (cosine, float(np.abs(alone - batched).max()))
    finally:
        fleet.stop()


def test_batch_lines_leave_a_slot_to_online_requests(batch_fleet: Fleet) -> None:
    """The worker (-np 4, --batch-reserve 1 by default) runs at most 3 batch lines at once; an
    online request takes the fourth slot at once, while the batch still runs."""
    api = batch_fleet.api_urls[0]
    client = client_of(api)
    lines = [chat_line(f"p{i}", f"poem {i}", max_tokens=64, ignore_eos=True)
             for i in range(2000)]
    batch = client.batches.create(input_file_id=upload(client, jsonl(lines)),
                                  endpoint="/v1/chat/completions", completion_window="24h")

    def busy() -> int:
        return sum(s["is_processing"] for s in httpx.get(f"{api}/slots").json())

    wait_until(lambda: busy() == 3, timeout=60, what="three slots busy with the batch")
    seen = [busy() for _ in range(40)]  # between two short lines a slot is idle a moment
    assert max(seen) <= 3, seen  # the batch fills what it may (above), and no more
    online = httpx.post(f"{api}/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "now"}], "max_tokens": 4}).json()
    assert online["choices"][0]["message"]["role"] == "assistant"
    assert client.batches.retrieve(batch.id).status == "in_progress"  # it did not wait for it
    client.batches.cancel(batch.id)
    assert wait_final(client, batch.id).status == "cancelled"


def test_an_embedding_worker_killed_mid_batch_loses_nothing(
        redis_url: str, workdir: Path, minilm_path: Path, s3_endpoint: str) -> None:
    fleet = s3_fleet(redis_url, workdir, minilm_path, s3_endpoint)
    try:
        flags = ("--embedding", "-c", "512", "-np", "8", "-t", "1")
        doomed = fleet.add_worker(*flags)
        fleet.add_worker(*flags)
        api = fleet.add_api()
        fleet.wait_healthy(api)
        client = client_of(api)
        lines = [{"custom_id": f"k{i}", "method": "POST", "url": "/v1/embeddings",
                  "body": {"input": f"text {i} of the killed worker test"}} for i in range(640)]
        batch = client.batches.create(input_file_id=upload(client, jsonl(lines)),
                                      endpoint="/v1/embeddings", completion_window="24h")
        wait_until(lambda: client.batches.retrieve(batch.id).request_counts.completed > 0,  # type: ignore[union-attr]
                   timeout=120, what="some lines done")
        doomed.kill()  # SIGKILL, with chunks of the batch in its queue and decodes
        done = wait_final(client, batch.id, timeout=300)
        assert done.status == "completed", done
        assert rerun_jobs(redis_url, fleet) >= 1  # the kill did catch chunks running
        assert read_lines(client, done.error_file_id) == []
        output = read_lines(client, done.output_file_id)
        assert [line["custom_id"] for line in output] == [f"k{i}" for i in range(640)]
        assert all(len(line["response"]["body"]["data"][0]["embedding"]) == 384
                   for line in output)
    finally:
        fleet.stop()


def test_a_batch_that_expires_keeps_what_is_done(batch_fleet: Fleet, redis_url: str) -> None:
    client = client_of(batch_fleet.api_urls[0])
    lines = [chat_line(f"x{i}", f"essay {i}", max_tokens=48) for i in range(300)]
    batch = client.batches.create(input_file_id=upload(client, jsonl(lines)),
                                  endpoint="/v1/chat/completions", completion_window="24h")
    wait_until(lambda: client.batches.retrieve(batch.id).request_counts.completed > 0,  # type: ignore[union-attr]
               timeout=120, what="some lines done")
    store = redis.Redis.from_url(redis_url)
    with store.pipeline() as pipe:  # the 24 h window ends now (as a transaction: no lost write)
        while True:
            try:
                pipe.watch(f"llamaq:batch:{batch.id}")
                record = json.loads(pipe.get(f"llamaq:batch:{batch.id}"))  # type: ignore[arg-type]
                record["expires_at"] = int(time.time()) - 1
                pipe.multi()
                pipe.set(f"llamaq:batch:{batch.id}", json.dumps(record))
                pipe.execute()
                break
            except redis.WatchError:
                continue
    done = wait_final(client, batch.id, timeout=60)
    assert done.status == "expired" and done.expired_at, done
    output, errors = read_lines(client, done.output_file_id), read_lines(client,
                                                                        done.error_file_id)
    assert once_each(output + errors) == {f"x{i}" for i in range(300)}  # each line once
    assert output and errors
    assert all(e["response"] is None and e["error"]["code"] == "batch_expired" for e in errors)
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (len(output),
                                                                           len(errors))
