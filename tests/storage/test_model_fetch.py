"""Model files from the Hub (-hf, a local Hub stand-in), a URL (-mu) and s3:// URLs, through the
object store: fetched once, put in the store with their SHA-256, pulled by another machine
(another cache) from the store, checked, resumed."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from storage import (
    ChecksumMismatch,
    DownloadCancelled,
    DownloadFailed,
    LocalStore,
    ModelFiles,
    ModelNotFound,
    ObjectStore,
)
from storage.checksum import checksum_key
from storage.hf import HubClient, pick_model, pick_sidecar, split_parts
from storage.models import hf_store_prefix, url_store_key
from storage.s3 import S3Store
from storage.url_fetch import partial_path
from tests.model_hosts import ModelHost, serve

REPO = "org/tiny-GGUF"


def blob(n: int = 200_000, seed: int = 0) -> bytes:
    return b"GGUF" + hashlib.sha256(str(seed).encode()).digest() * (n // 32)


class Recorder:
    """A DownloadListener that keeps what it heard; `stop_at` bytes asks for a pause."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.events: list[tuple[str, int, int]] = []
        self.stop_at = stop_at
        self.lock = threading.Lock()

    def on_progress(self, source: str, done: int, total: int) -> None:
        with self.lock:
            self.events.append((source, done, total))

    def cancelled(self) -> bool:
        return self.stop_at is not None and any(d >= self.stop_at for _, d, _ in self.events)


@pytest.fixture
def hub() -> Iterator[ModelHost]:
    host = ModelHost()
    host.add(f"{REPO}/tiny-Q8_0.gguf", blob(seed=8))
    host.add(f"{REPO}/tiny-Q4_K_M.gguf", blob(seed=4))
    host.add(f"{REPO}/mmproj-tiny-F16.gguf", blob(50_000, seed=16))
    host.add(f"{REPO}/README.md", b"# tiny")
    with serve(host):
        yield host


def machine(store: ObjectStore, cache: Path, endpoint: str, token: str | None = None,
            listener: Recorder | None = None, offline: bool = False) -> ModelFiles:
    """One machine's view: its own cache, the fleet's store, a Hub at `endpoint`."""
    client = HubClient(cache, endpoint=endpoint, token=token, offline=offline)
    return ModelFiles(store, cache, hub=client, listener=listener, offline=offline)


def test_default_quant_rule() -> None:
    files = ["a/m-Q8_0.gguf", "m-IQ2_XS.gguf", "m-q4_k_m.gguf", "mmproj-m-Q4_K_M.gguf",
             "m-Q4_K_M-imatrix.gguf"]
    assert pick_model(sorted(files), "") == "m-q4_k_m.gguf"  # any case, never a sidecar
    assert pick_model(sorted(files), "q8_0") == "a/m-Q8_0.gguf"
    assert pick_model(sorted(files), "IQ2_XS") == "m-IQ2_XS.gguf"
    assert pick_model(sorted(files), "Q5_K_M") is None  # a tag that matches nothing: nothing
    assert pick_model(["x-F16.gguf", "y-Q8_0.gguf"], "") == "y-Q8_0.gguf"
    assert pick_model(["a-BF16.gguf", "b-F16.gguf"], "") == "a-BF16.gguf"  # else the first
    split = ["m-Q4_K_M-00002-of-00002.gguf", "m-Q4_K_M-00001-of-00002.gguf"]
    assert pick_model(sorted(split), "") == "m-Q4_K_M-00001-of-00002.gguf"
    assert split_parts(sorted(split), "m-Q4_K_M-00001-of-00002.gguf") == sorted(split)
    mmprojs = ["mmproj-F16.gguf", "mmproj-Q8_0.gguf", "sub/mmproj-F32.gguf"]
    assert pick_sidecar(mmprojs, "m-Q8_0.gguf", "mmproj", "") == "mmproj-Q8_0.gguf"
    assert pick_sidecar(mmprojs, "sub/m-Q4_0.gguf", "mmproj", "") == "sub/mmproj-F32.gguf"
    assert pick_sidecar(mmprojs, "m-Q4_K_M.gguf", "mmproj", "Q8_0") == "mmproj-Q8_0.gguf"


def test_hf_fetched_once_then_pulled_from_the_store_by_another_machine(
        hub: ModelHost, store: ObjectStore, tmp_path: Path, closed_port: int) -> None:
    heard = Recorder()
    a = machine(store, tmp_path / "a", hub.url, token="hf_secret", listener=heard)
    path = a.from_hf(REPO)
    assert path.read_bytes() == hub.files[f"{REPO}/tiny-Q4_K_M.gguf"].data
    assert all(auth == "Bearer hf_secret" for _, _, _, auth in hub.requests)  # HF_TOKEN
    key = hf_store_prefix(REPO) + "tiny-Q4_K_M.gguf"
    expected = hub.files[f"{REPO}/tiny-Q4_K_M.gguf"].sha256
    assert store.get_bytes(checksum_key(key)).decode().strip() == expected
    assert store.get_bytes(key) == path.read_bytes()
    url = f"{hub.url}/{REPO}/resolve/main/tiny-Q4_K_M.gguf"
    assert heard.events[-1] == (url, len(path.read_bytes()), len(path.read_bytes()))
    assert a.from_hf(REPO) == path  # cached: no second download
    assert hub.gets("tiny-Q4_K_M.gguf") == 1

    heard_b = Recorder()  # machine B: no Hub at all (nothing listens there)
    b = machine(store, tmp_path / "b", f"http://127.0.0.1:{closed_port}", listener=heard_b)
    pulled = b.from_hf(REPO)
    assert pulled == tmp_path / "b" / key
    assert pulled.read_bytes() == path.read_bytes()
    assert heard_b.events[-1][0] == f"store:{key}"
    assert (tmp_path / "b" / (key + ".sha256")).read_text().strip() == expected
    assert hub.gets("tiny-Q4_K_M.gguf") == 1

    c = machine(store, tmp_path / "c", hub.url)  # machine C: Hub reachable, file in the store
    before = len(hub.requests)
    assert c.from_hf(f"{REPO}:Q4_K_M").read_bytes() == path.read_bytes()
    assert len(hub.requests) == before  # the store has what the Hub would pick: no Hub call
    assert c.from_hf(f"{REPO}:q8_0").read_bytes() == hub.files[f"{REPO}/tiny-Q8_0.gguf"].data
    assert hub.gets("tiny-Q8_0.gguf") == 1  # not in the store yet: from the Hub
    with pytest.raises(ModelNotFound, match="Q5_K_M"):
        c.from_hf(f"{REPO}:Q5_K_M")
    with pytest.raises(ModelNotFound):
        c.from_hf("org/absent")


def test_hf_file_and_sidecars(hub: ModelHost, tmp_path: Path) -> None:
    files = machine(LocalStore(tmp_path / "store"), tmp_path / "a", hub.url)
    plan = files.hf_plan(REPO, sidecars=("mmproj", "mtp"))
    assert [f.path for f in plan.model_files] == ["tiny-Q4_K_M.gguf"]
    assert {k: f.path for k, f in plan.sidecars.items()} == {"mmproj": "mmproj-tiny-F16.gguf"}
    path = files.from_hf(REPO, "tiny-Q8_0.gguf")
    assert path.read_bytes() == hub.files[f"{REPO}/tiny-Q8_0.gguf"].data
    with pytest.raises(ModelNotFound, match=r"absent\.gguf"):
        files.from_hf(REPO, "absent.gguf")


def test_hub_checksum_mismatch_is_refused(hub: ModelHost, store: ObjectStore,
                                          tmp_path: Path) -> None:
    hub.files[f"{REPO}/tiny-Q4_K_M.gguf"].sha256 = "0" * 64  # the file does not match
    files = machine(store, tmp_path / "a", hub.url)
    with pytest.raises(ChecksumMismatch, match="checksum mismatch"):
        files.from_hf(REPO)
    assert store.list_keys("models/") == []  # never reaches the store
    assert not [p for p in (tmp_path / "a").rglob("*") if p.is_file() and p.stat().st_size
                == len(hub.files[f"{REPO}/tiny-Q4_K_M.gguf"].data)]  # nor stays in the cache


def test_store_copy_with_a_bad_checksum_is_refused(store: ObjectStore, tmp_path: Path) -> None:
    store.put_bytes("models/m.gguf", blob())
    store.put_bytes(checksum_key("models/m.gguf"), hashlib.sha256(b"other").hexdigest().encode())
    files = ModelFiles(store, tmp_path / "b")
    with pytest.raises(ChecksumMismatch):
        files.resolve("m.gguf")
    assert not (tmp_path / "b" / "models" / "m.gguf").exists()
    store.put_bytes(checksum_key("models/m.gguf"), hashlib.sha256(blob()).hexdigest().encode())
    assert files.resolve("m.gguf").read_bytes() == blob()


def test_model_url_through_the_store(store: ObjectStore, tmp_path: Path,
                                     closed_port: int) -> None:
    host = ModelHost()
    host.add("files/model.gguf", blob(300_000, seed=3))
    with serve(host):
        url = f"{host.url}/files/model.gguf"
        a = machine(store, tmp_path / "a", host.url)
        path = a.from_url(url)
        assert path.read_bytes() == host.files["files/model.gguf"].data
        key = url_store_key(url)
        assert store.get_bytes(checksum_key(key)).decode().strip() == \
            host.files["files/model.gguf"].sha256
        assert a.from_url(url) == path and host.gets("model.gguf") == 1
        with pytest.raises(DownloadFailed, match="404"):
            a.from_url(f"{host.url}/files/absent.gguf")
    b = machine(store, tmp_path / "b", f"http://127.0.0.1:{closed_port}", offline=True)
    assert b.from_url(url).read_bytes() == path.read_bytes()  # the host is gone: the store
    with pytest.raises(ModelNotFound, match="--offline"):
        b.from_url(f"http://127.0.0.1:{closed_port}/other.gguf")
    with pytest.raises(ModelNotFound, match="http"):
        b.from_url("ftp://example.invalid/m.gguf")


def test_model_url_download_resumes(tmp_path: Path) -> None:
    host = ModelHost(cut_after=150_000)
    data = host.add("m.gguf", blob(400_000, seed=5)).data
    with serve(host):
        files = machine(LocalStore(tmp_path / "store"), tmp_path / "a", host.url)
        url = f"{host.url}/m.gguf"
        with pytest.raises(DownloadFailed):
            files.from_url(url)
        partial = partial_path(tmp_path / "a" / url_store_key(url))
        assert partial.stat().st_size == 150_000
        path = files.from_url(url)
    assert host.ranges("m.gguf") == [None, "bytes=150000-"]
    assert path.read_bytes() == data and not partial.exists()


def test_a_paused_hub_download_resumes(hub: ModelHost, tmp_path: Path) -> None:
    big = hub.add(f"{REPO}/big-Q4_K_M.gguf", blob(1_000_000, seed=9))
    hub.files.pop(f"{REPO}/tiny-Q4_K_M.gguf")
    hub.chunk_delay_s = 0.01
    heard = Recorder(stop_at=200_000)
    files = machine(LocalStore(tmp_path / "store"), tmp_path / "a", hub.url, listener=heard)
    with pytest.raises(DownloadCancelled):
        files.from_hf(REPO)
    incomplete = list((tmp_path / "a").rglob("*.downloadInProgress"))
    assert len(incomplete) == 1 and 0 < incomplete[0].stat().st_size < len(big.data)
    heard.stop_at = None
    hub.chunk_delay_s = 0.0
    assert files.from_hf(REPO).read_bytes() == big.data
    first, *rest = hub.ranges("big-Q4_K_M.gguf")
    assert first is None and rest and rest[-1] and rest[-1].startswith("bytes=")
    assert int(rest[-1].removeprefix("bytes=").rstrip("-")) >= 200_000


def test_offline_uses_the_store_when_the_hub_cache_is_empty(
        hub: ModelHost, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    machine(store, tmp_path / "a", hub.url).from_hf(REPO)
    offline = machine(store, tmp_path / "b", hub.url, offline=True)
    before = len(hub.requests)
    assert offline.from_hf(REPO).read_bytes() == hub.files[f"{REPO}/tiny-Q4_K_M.gguf"].data
    assert len(hub.requests) == before  # --offline: not one request to the Hub


def test_s3_url_model(s3_store: S3Store, moto_endpoint: str, tmp_path: Path) -> None:
    s3_store.put_bytes("models/s3.gguf", blob(seed=7))
    url = f"s3://{s3_store.bucket}/{s3_store.prefix}models/s3.gguf"
    files = ModelFiles(LocalStore(tmp_path / "store"), tmp_path / "cache",
                       s3_endpoint_url=moto_endpoint)
    path = files.resolve(url)
    assert path.read_bytes() == blob(seed=7)
    assert path == tmp_path / "cache" / "s3" / s3_store.bucket / "fleet/a/models/s3.gguf"
    with pytest.raises(ModelNotFound):
        files.resolve(f"s3://{s3_store.bucket}/absent.gguf")



def test_stored_models_are_listed_by_name(tmp_path: Path) -> None:
    from storage.model_catalog import file_tag, list_stored_models

    assert file_tag("a/m-q4_k_m-00001-of-00002.gguf") == ("Q4_K_M", 1)
    assert file_tag("m.gguf") == ("", 1)
    store = LocalStore(tmp_path / "store")
    for key in (f"models/hf/{REPO}/tiny-Q4_K_M.gguf", f"models/hf/{REPO}/tiny-Q8_0.gguf",
                f"models/hf/{REPO}/mmproj-tiny-F16.gguf",
                "models/hf/o/big/big-Q2_K-00001-of-00002.gguf",
                "models/hf/o/big/big-Q2_K-00002-of-00002.gguf",
                "models/hf/o/half/h-Q2_K-00001-of-00002.gguf",
                "models/team/pushed.gguf", "models/url/0123/x.gguf"):
        store.put_bytes(key, b"GGUF")
        store.put_bytes(checksum_key(key), b"0" * 64)
    listed = {m.name: m for m in list_stored_models(store)}
    assert sorted(listed) == ["o/big:Q2_K", f"{REPO}:Q4_K_M", f"{REPO}:Q8_0", "team/pushed.gguf"]
    assert listed[f"{REPO}:Q4_K_M"].sidecars == ("mmproj",)
    assert listed["o/big:Q2_K"].keys == ("models/hf/o/big/big-Q2_K-00001-of-00002.gguf",
                                         "models/hf/o/big/big-Q2_K-00002-of-00002.gguf")
    assert listed["team/pushed.gguf"].source == "pushed"


def test_two_workers_on_one_machine_download_once(hub: ModelHost, tmp_path: Path) -> None:
    hub.chunk_delay_s = 0.005
    store = LocalStore(tmp_path / "store")
    results: list[bytes] = []

    def start() -> None:
        results.append(machine(store, tmp_path / "shared", hub.url).from_hf(REPO).read_bytes())

    threads = [threading.Thread(target=start) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert results == [hub.files[f"{REPO}/tiny-Q4_K_M.gguf"].data] * 2
    assert hub.gets("tiny-Q4_K_M.gguf") == 1
