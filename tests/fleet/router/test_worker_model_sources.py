"""Workers that fetch their model: `-hf` from a local Hugging Face Hub stand-in into an S3 store
(moto), a second worker on "another machine" (its own cache) that pulls it from the store with
no Hub call, a corrupted store copy refused by checksum, `-mu` from a plain HTTP server and
`-dr` from a Docker registry stand-in.
Each serves a real completion from the fetched tiny GGUF."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import pytest
from moto.server import ThreadedMotoServer

from tests.docker_registry import Registry as DockerRegistry
from tests.docker_registry import serve as serve_registry
from tests.model_events import ModelEvents
from tests.model_hosts import ModelHost, serve
from tests.processes import Fleet, wait_until

REPO = "org/tiny-GGUF"
BUCKET = "llamaq-models-test"
KEY = f"fleet/models/hf/{REPO}/tiny-Q4_K_M.gguf"
AWS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
       "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}
WORKER = ("-c", "512", "-np", "1", "-t", "1", "-n", "4")


@pytest.fixture(scope="module")
def moto() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def s3(endpoint: str) -> Any:
    return boto3.session.Session().client("s3", endpoint_url=endpoint, **{
        "aws_access_key_id": "testing", "aws_secret_access_key": "testing",
        "region_name": "us-east-1"})


def complete(url: str) -> dict[str, Any]:
    response = httpx.post(f"{url}/completion", json={"prompt": "hello", "n_predict": 4},
                          timeout=60)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def log_text(fleet: Fleet, index: int) -> str:
    return (fleet.logs / f"worker-{index}.log").read_text(errors="replace")


def test_worker_b_pulls_from_the_store_what_worker_a_fetched_from_the_hub(
        redis_url: str, tmp_path: Path, tiny_model_path: Path, moto: str) -> None:
    hub = ModelHost()
    hub.add(f"{REPO}/tiny-Q4_K_M.gguf", tiny_model_path.read_bytes())
    hub.add(f"{REPO}/tiny-Q8_0.gguf", b"GGUF-not-this-one")
    channel = ModelEvents(redis_url)
    with serve(hub):
        fleet = Fleet(redis_url, tmp_path, ["-hf", REPO, "--store-url", f"s3://{BUCKET}/fleet",
                                            "--s3-endpoint-url", moto],
                      logs=tmp_path / "logs",
                      env={"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": hub.url, **AWS})
        try:
            worker_a = fleet.add_worker("--cache-dir", str(tmp_path / "a"), *WORKER)
            api = fleet.add_api()
            fleet.wait_healthy(api, timeout=120)
            assert complete(api)["tokens_predicted"] > 0
            assert hub.gets("tiny-Q4_K_M.gguf") == 1 and hub.gets("tiny-Q8_0.gguf") == 0
            stored = s3(moto).get_object(Bucket=BUCKET, Key=KEY)["Body"].read()
            assert stored == tiny_model_path.read_bytes()
            progress = [e for e in channel.seen if e["event"] == "download_progress"]
            assert progress and all(e["model"] == REPO for e in progress)
            hub_url = f"{hub.url}/{REPO}/resolve/main/tiny-Q4_K_M.gguf"
            assert progress[-1]["data"][hub_url]["done"] == len(stored)
            assert {"model": REPO, "event": "download_finished"} in channel.seen
            fleet.stop_process(worker_a)
            log_a = log_text(fleet, 0)
            assert "downloading tiny-Q4_K_M.gguf" in log_a and "put in the object store" in log_a

            requests_before = len(hub.requests)
            channel.seen.clear()
            # another machine: its own cache (LLAMA_CACHE wins over LLAMAQ_CACHE_DIR)
            fleet.add_worker(*WORKER, env={"LLAMAQ_CACHE_DIR": str(tmp_path / "ignored"),
                                           "LLAMA_CACHE": str(tmp_path / "b")})
            wait_until(lambda: complete(api)["tokens_predicted"] > 0, timeout=120,
                       what="worker B serving")
            assert len(hub.requests) == requests_before  # not one call to the Hub
            pulled = tmp_path / "b" / "models" / "hf" / REPO / "tiny-Q4_K_M.gguf"
            assert pulled.read_bytes() == tiny_model_path.read_bytes()
            assert not list((tmp_path / "ignored").rglob("*.gguf"))
            source = f"store:models/hf/{REPO}/tiny-Q4_K_M.gguf"
            assert any(source in e.get("data", {}) for e in channel.seen
                       if e["event"] == "download_progress")
            assert "sha256 checked" in log_text(fleet, 2)
        finally:
            fleet.stop()
            channel.close()


def test_a_store_copy_with_a_wrong_checksum_is_refused(
        redis_url: str, tmp_path: Path, tiny_model_path: Path, moto: str) -> None:
    client = s3(moto)
    bucket = "llamaq-corrupt-test"
    client.create_bucket(Bucket=bucket)
    client.put_object(Bucket=bucket, Key=f"models/hf/{REPO}/tiny-Q4_K_M.gguf",
                      Body=tiny_model_path.read_bytes())
    client.put_object(Bucket=bucket, Key=f"models/hf/{REPO}/tiny-Q4_K_M.gguf.sha256",
                      Body=b"0" * 64 + b"\n")
    fleet = Fleet(redis_url, tmp_path, ["-hf", REPO, "--store-url", f"s3://{bucket}",
                                        "--s3-endpoint-url", moto, "--cache-dir",
                                        str(tmp_path / "c")],
                  logs=tmp_path / "logs", env=AWS)
    try:
        worker = fleet.add_worker(*WORKER)
        assert worker.wait(timeout=120) != 0
        log = log_text(fleet, 0)
        assert "checksum mismatch" in log
        assert not list((tmp_path / "c").rglob("*.gguf"))
    finally:
        fleet.stop()


def test_model_url_worker(redis_url: str, tmp_path: Path, tiny_model_path: Path) -> None:
    host = ModelHost()
    host.add("files/tiny-model.gguf", tiny_model_path.read_bytes())
    with serve(host):
        url = f"{host.url}/files/tiny-model.gguf"
        fleet = Fleet(redis_url, tmp_path, ["-mu", url, "--store-url", str(tmp_path / "store"),
                                            "--cache-dir", str(tmp_path / "cache")],
                      logs=tmp_path / "logs")
        try:
            fleet.add_worker(*WORKER)
            api = fleet.add_api()
            fleet.wait_healthy(api, timeout=120)
            models = httpx.get(f"{api}/v1/models", timeout=30).json()
            assert [m["id"] for m in models["data"]] == ["tiny-model.gguf"]
            assert complete(api)["tokens_predicted"] > 0
            assert host.gets("tiny-model.gguf") == 1
            assert list((tmp_path / "store" / "models" / "url").rglob("tiny-model.gguf"))
            loaded = httpx.delete(f"{api}/models", params={"model": "tiny-model.gguf"},
                                  timeout=30)
            assert loaded.status_code == 400
            assert loaded.json()["error"]["message"] == (
                "model 'tiny-model.gguf' is loaded: unload it before deleting it")
        finally:
            fleet.stop()


def test_docker_repo_worker(redis_url: str, tmp_path: Path, tiny_model_path: Path) -> None:
    """-dr from a Docker registry stand-in: token, manifest, the GGUF layer's blob, checked
    against its digest, kept in the store; the model is named as -dr named it."""
    registry = DockerRegistry()
    registry.add("ai/tiny", "Q4_K_M", tiny_model_path.read_bytes())
    with serve_registry(registry):
        fleet = Fleet(redis_url, tmp_path, ["-dr", "tiny:Q4_K_M", "--store-url",
                                            str(tmp_path / "store"), "--cache-dir",
                                            str(tmp_path / "cache")],
                      logs=tmp_path / "logs", env=registry.env())
        try:
            fleet.add_worker(*WORKER)
            api = fleet.add_api()
            fleet.wait_healthy(api, timeout=120)
            models = httpx.get(f"{api}/v1/models", timeout=30).json()
            assert [m["id"] for m in models["data"]] == ["tiny:Q4_K_M"]
            assert complete(api)["tokens_predicted"] > 0
            assert len([r for r in registry.requests if "/blobs/" in r]) == 1
            stored = tmp_path / "store" / "models" / "docker" / "ai" / "tiny"
            assert (stored / "ai_tiny_Q4_K_M.gguf").read_bytes() == tiny_model_path.read_bytes()
        finally:
            fleet.stop()


def test_a_draft_model_from_the_hub(redis_url: str, tmp_path: Path,
                                    tiny_model_path: Path) -> None:
    """-hfd: the draft model of --spec-type draft-simple from the Hub, as -hf fetches a model
    (the default quant rule, the store); it drafts (timings.draft_n)."""
    repo = "org/tiny-draft-GGUF"
    host = ModelHost()
    host.add(f"{repo}/tiny-draft-Q4_K_M.gguf", tiny_model_path.read_bytes())
    host.add(f"{repo}/tiny-draft-F16.gguf", b"GGUF-not-this-one")
    with serve(host):
        fleet = Fleet(redis_url, tmp_path, ["-m", str(tiny_model_path), "--store-url",
                                            str(tmp_path / "store"), "--cache-dir",
                                            str(tmp_path / "cache")],
                      logs=tmp_path / "logs", env={"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": host.url})
        try:
            fleet.add_worker(*WORKER, "--spec-type", "draft-simple", "-hfd", repo)
            api = fleet.add_api()
            fleet.wait_healthy(api, timeout=120)
            [worker] = httpx.get(f"{api}/fleet", timeout=30).json()["workers"]
            assert worker["draft_model"].endswith("/tiny-draft-Q4_K_M.gguf")
            answer = httpx.post(f"{api}/completion", timeout=60, json={
                "prompt": "hello", "n_predict": 8, "temperature": 0, "ignore_eos": True}).json()
            assert answer["timings"].get("draft_n", 0) > 0, answer
            assert host.gets("tiny-draft-Q4_K_M.gguf") == 1
            assert host.gets("tiny-draft-F16.gguf") == 0
            assert (tmp_path / "store" / "models" / "hf" / repo / "tiny-draft-Q4_K_M.gguf"
                    ).is_file()
        finally:
            fleet.stop()


def test_gemma_from_the_local_hub(redis_url: str, tmp_path: Path, gemma_path: Path) -> None:
    """The real model through -hf: the default quant rule picks Q4_K_M, the file is checked
    against the Hub's SHA-256 and loads (Gemma's own chat template is in /props)."""
    repo = "ggml-org/gemma-3-270m-GGUF"
    host = ModelHost()
    host.add(f"{repo}/gemma-3-270m-Q4_K_M.gguf", gemma_path.read_bytes())
    host.add(f"{repo}/gemma-3-270m-F16.gguf", b"GGUF-not-this-one")
    with serve(host):
        fleet = Fleet(redis_url, tmp_path, ["-hf", repo, "--store-url", str(tmp_path / "store"),
                                            "--cache-dir", str(tmp_path / "cache")],
                      logs=tmp_path / "logs", env={"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": host.url})
        try:
            fleet.add_worker("-c", "1024", "-np", "1", "-t", "2")
            api = fleet.add_api()
            fleet.wait_healthy(api, timeout=180)
            props = httpx.get(f"{api}/props", timeout=30).json()
            assert props["model_path"].endswith("/gemma-3-270m-Q4_K_M.gguf")
            [model] = httpx.get(f"{api}/v1/models", timeout=30).json()["data"]
            assert model["id"] == repo and model["meta"]["n_vocab"] == 262144  # Gemma 3's
            response = httpx.post(f"{api}/v1/chat/completions", timeout=120, json={
                "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8,
                "temperature": 0})
            assert response.status_code == 200, response.text
            assert response.json()["choices"][0]["message"]["content"].strip()
            assert host.gets("gemma-3-270m-F16.gguf") == 0
            stored = tmp_path / "store" / "models" / "hf" / repo / "gemma-3-270m-Q4_K_M.gguf"
            assert stored.stat().st_size == gemma_path.stat().st_size
        finally:
            fleet.stop()


def test_hf_pulls_the_repos_mmproj_unless_told_not_to(redis_url: str, tmp_path: Path,
                                                       gemma_path: Path,
                                                       tiny_mmproj_path: Path) -> None:
    """-hf loads the repo's projector with the model (llama-server's --mmproj-auto, on by
    default), through the same store path as the model; --no-mmproj leaves it."""
    repo = "ggml-org/gemma-3-vision-GGUF"
    host = ModelHost()
    host.add(f"{repo}/gemma-3-270m-Q4_K_M.gguf", gemma_path.read_bytes())
    host.add(f"{repo}/mmproj-gemma-3-270m-F16.gguf", tiny_mmproj_path.read_bytes())
    with serve(host):
        for extra, vision in (((), True), (("--no-mmproj",), False)):
            work = tmp_path / ("auto" if vision else "off")
            fleet = Fleet(redis_url, work, ["-hf", repo, "--alias", f"vision-{vision}",
                                            "--store-url", str(tmp_path / "store"),
                                            "--cache-dir", str(work / "cache")],
                          logs=work / "logs",
                          env={"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": host.url})
            try:
                fleet.add_worker("-c", "1024", "-np", "1", "-t", "2", *extra)
                api = fleet.add_api()
                fleet.wait_healthy(api, timeout=180)
                props = httpx.get(f"{api}/props", timeout=30).json()
                assert props["modalities"]["vision"] is vision
            finally:
                fleet.stop()
    assert host.gets("mmproj-gemma-3-270m-F16.gguf") == 1  # the second run: none asked
    stored = tmp_path / "store" / "models" / "hf" / repo / "mmproj-gemma-3-270m-F16.gguf"
    assert stored.read_bytes() == tiny_mmproj_path.read_bytes()


def test_mmproj_url_downloads_the_projector_once(redis_url: str, tmp_path: Path,
                                                 gemma_path: Path,
                                                 tiny_mmproj_path: Path) -> None:
    """-mmu: the projector comes from a URL (cached and stored as -mu's files), a worker that
    restarts on the same store asks nothing again."""
    host = ModelHost()
    host.add("files/mmproj-tiny.gguf", tiny_mmproj_path.read_bytes())
    with serve(host):
        for round_no in (1, 2):
            work = tmp_path / f"round{round_no}"
            fleet = Fleet(redis_url, work, ["-m", str(gemma_path), "--alias", "mmu",
                                            "--store-url", str(tmp_path / "store"),
                                            "--cache-dir", str(work / "cache")],
                          logs=work / "logs")
            try:
                fleet.add_worker("-c", "1024", "-np", "1", "-t", "2",
                                 "-mmu", f"{host.url}/files/mmproj-tiny.gguf")
                api = fleet.add_api()
                fleet.wait_healthy(api, timeout=180)
                props = httpx.get(f"{api}/props", timeout=30).json()
                assert props["modalities"]["vision"] is True
            finally:
                fleet.stop()
    assert host.gets("mmproj-tiny.gguf") == 1


def test_an_adapter_from_the_hub(redis_url: str, tmp_path: Path, gemma_path: Path) -> None:
    """`--lora hf://<user>/<repo>/<file>`: the adapter comes from the Hub through the store, as
    -hf's model files do; GET /lora-adapters names it by that source."""
    from tests.tiny_lora import write_lora

    adapter = write_lora(tmp_path / "adapter.gguf")
    repo = "org/tiny-lora-GGUF"
    host = ModelHost()
    host.add(f"{repo}/lora-gemma3.gguf", adapter.read_bytes())
    source = f"hf://{repo}/lora-gemma3.gguf"
    with serve(host):
        fleet = Fleet(redis_url, tmp_path, ["-m", str(gemma_path), "--alias", "hub-lora",
                                            "--store-url", str(tmp_path / "store"),
                                            "--cache-dir", str(tmp_path / "cache")],
                      logs=tmp_path / "logs", env={"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": host.url})
        try:
            fleet.add_worker("-c", "1024", "-np", "1", "-t", "2", "--lora", source)
            api = fleet.add_api()
            fleet.wait_healthy(api, timeout=180)
            [info] = httpx.get(f"{api}/lora-adapters", timeout=30).json()
            assert info["path"] == source and info["scale"] == 1.0
        finally:
            fleet.stop()
    stored = tmp_path / "store" / "models" / "hf" / repo / "lora-gemma3.gguf"
    assert stored.read_bytes() == adapter.read_bytes()
