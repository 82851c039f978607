"""Fixtures: a real moto S3 server on a free 127.0.0.1 port, and stores of both kinds."""

import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from moto.server import ThreadedMotoServer

from storage import LocalStore, ObjectStore
from storage.s3 import S3Store


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))


@pytest.fixture
def bucket_name() -> str:
    """A bucket name no other test uses (the moto server lives for the whole session)."""
    return f"llamaq-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def s3_store(moto_endpoint: str, aws_env: None, bucket_name: str) -> S3Store:
    return S3Store(bucket_name, "fleet/a", moto_endpoint)


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ObjectStore:
    if request.param == "local":
        return LocalStore(tmp_path / "store")
    s3: S3Store = request.getfixturevalue("s3_store")
    return s3


@pytest.fixture
def closed_port() -> int:
    """A 127.0.0.1 port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port
