"""-dr's registry client (storage/docker_hub.py) and ModelFiles.from_docker against a registry
stand-in on a local port: the reference's defaults, the GGUF layer found and checked by its
digest, the object store's copy used when the registry fails, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage import open_store
from storage.docker_hub import DockerModel, Registry, gguf_digest
from storage.errors import ModelNotFound
from storage.models import ModelFiles
from tests.docker_registry import Registry as RegistryStandIn
from tests.docker_registry import serve


def test_the_reference_defaults_to_namespace_ai_and_tag_latest() -> None:
    assert DockerModel.parse("smollm2") == DockerModel("ai/smollm2", "latest")
    assert DockerModel.parse("ai/smollm2:135M-Q4_0") == DockerModel("ai/smollm2", "135M-Q4_0")
    assert DockerModel.parse("me/model:q8").file_name() == "me_model_q8.gguf"
    for bad in ("", ":tag", "model:"):
        with pytest.raises(ModelNotFound, match="expected"):
            DockerModel.parse(bad)


def test_the_manifest_names_its_gguf_layer() -> None:
    digest = "AB" * 32
    manifest = {"layers": [{"mediaType": "text/plain", "digest": "sha256:" + "0" * 64},
                           {"mediaType": "application/vnd.docker.ai.gguf.v3",
                            "digest": f"sha256:{digest}"}]}
    assert gguf_digest(manifest, "m") == digest.lower()
    with pytest.raises(ModelNotFound, match="no GGUF layer"):
        gguf_digest({"layers": []}, "m")
    with pytest.raises(ModelNotFound, match="invalid layer digest"):
        gguf_digest({"layers": [{"mediaType": "x.gguf", "digest": "md5:00"}]}, "m")


def files(tmp_path: Path, cache: str) -> ModelFiles:
    return ModelFiles(open_store(str(tmp_path / "store")), tmp_path / cache)


def test_a_model_comes_from_the_registry_once_then_from_the_store(tmp_path: Path) -> None:
    data = b"GGUF" + bytes(range(256)) * 64
    with serve(RegistryStandIn()) as stand_in:
        stand_in.add("ai/tiny", "Q4_0", data)
        registry = Registry(stand_in.url, f"{stand_in.url}/token")
        path = files(tmp_path, "a").from_docker("tiny:Q4_0", registry)
        assert path.read_bytes() == data and path.name == "ai_tiny_Q4_0.gguf"
        blobs = [r for r in stand_in.requests if "/blobs/" in r]
        assert len(blobs) == 1
        # another machine: the store answers, the registry is asked only for the digest
        again = files(tmp_path, "b").from_docker("tiny:Q4_0", registry)
        assert again.read_bytes() == data
        assert len([r for r in stand_in.requests if "/blobs/" in r]) == 1
        with pytest.raises(ModelNotFound, match="manifest request answered HTTP 404"):
            files(tmp_path, "c").from_docker("ai/absent", registry)
    # the registry gone: the store's copy
    gone = Registry("http://127.0.0.1:9", "http://127.0.0.1:9/token")
    assert files(tmp_path, "d").from_docker("tiny:Q4_0", gone).read_bytes() == data
    with pytest.raises(ModelNotFound, match="ai/other:latest"):
        files(tmp_path, "e").from_docker("other", gone)
