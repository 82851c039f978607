"""Security of an api pod: CORS as the spec defines it (a list matched per request), /health
public under any prefix, TLS with --ssl-key-file/--ssl-cert-file, and storage errors that name
no bucket, endpoint or path."""

from __future__ import annotations

import datetime
import ipaddress
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.conftest import make_fleet
from tests.processes import Fleet, free_port, wait_until


@pytest.fixture
def pods(redis_url: str, workdir: Path, gemma_path: Path, api: str) -> Iterator[Fleet]:
    """Extra api pods in front of the session's worker (`gemma`)."""
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma")
    yield fleet
    fleet.stop()


def allow_origin(url: str, origin: str) -> str | None:
    return httpx.get(f"{url}/health", headers={"Origin": origin}).headers.get(
        "access-control-allow-origin")


def test_a_list_of_origins_is_matched_per_request(pods: Fleet) -> None:
    url = pods.add_api("--cors-origins", "http://a.test,https://b.test:8443")
    assert allow_origin(url, "http://a.test") == "http://a.test"
    assert allow_origin(url, "https://b.test:8443") == "https://b.test:8443"
    assert allow_origin(url, "http://evil.test") is None
    assert allow_origin(url, "http://a.test.evil.test") is None
    preflight = httpx.options(f"{url}/completion", headers={
        "Origin": "https://b.test:8443", "Access-Control-Request-Method": "POST"})
    assert preflight.headers["access-control-allow-origin"] == "https://b.test:8443"
    assert preflight.headers["vary"] == "Origin"


def test_localhost_reflects_only_local_origins(pods: Fleet) -> None:
    url = pods.add_api("--cors-origins", "localhost")
    for origin in ("http://localhost:5173", "http://127.0.0.1:8080", "https://[::1]"):
        assert allow_origin(url, origin) == origin
    for origin in ("http://localhost.evil.test", "http://evil.test", "null"):
        assert allow_origin(url, origin) is None


def test_star_without_credentials_is_a_star(pods: Fleet) -> None:
    url = pods.add_api("--no-cors-credentials")
    assert allow_origin(url, "http://any.test") == "*"


def test_health_is_public_under_an_api_prefix(pods: Fleet) -> None:
    url = pods.add_api("--api-prefix", "/llm", "--api-key", "sekrit")
    for path in ("/llm/health", "/llm/v1/health"):
        assert httpx.get(f"{url}{path}").status_code == 200, path
    assert httpx.get(f"{url}/llm/v1/models").status_code == 401
    ok = httpx.get(f"{url}/llm/v1/models", headers={"Authorization": "Bearer sekrit"})
    assert ok.status_code == 200


def self_signed(folder: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    key_file, cert_file = folder / "key.pem", folder / "cert.pem"
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key_file, cert_file


def test_https_with_a_self_signed_certificate(pods: Fleet, tmp_path: Path) -> None:
    key_file, cert_file = self_signed(tmp_path)
    port = free_port()
    pods._spawn("api", ["--port", str(port), "--ssl-key-file", str(key_file),
                        "--ssl-cert-file", str(cert_file)])
    trusted = ssl.create_default_context(cafile=str(cert_file))
    url = f"https://127.0.0.1:{port}"
    wait_until(lambda: httpx.get(f"{url}/health", verify=trusted).status_code == 200,
               what="the https api")
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)  # no plain HTTP
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health")  # an untrusted certificate is refused by the client
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none",
                           http_client=openai.DefaultHttpxClient(verify=trusted))
    reply = client.chat.completions.create(
        model="gemma", messages=[{"role": "user", "content": "Say hi"}], max_tokens=4,
        temperature=0)
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.completion_tokens > 0


def test_one_tls_file_without_the_other_is_refused(pods: Fleet, tmp_path: Path) -> None:
    key_file, _ = self_signed(tmp_path)
    process = pods._spawn("api", ["--port", str(free_port()), "--ssl-key-file", str(key_file)])
    assert process.wait(timeout=60) == 2


S3_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                  "AWS_DEFAULT_REGION": "us-east-1"}
"""So that the worker reaches for the endpoint (without credentials boto3 fails before it
tries, a configuration error: 500)."""


def test_storage_errors_name_no_bucket_endpoint_or_path(redis_url: str, workdir: Path,
                                                         gemma_path: Path) -> None:
    """A slot save to an S3 endpoint that does not answer: the client gets a 503 that says
    so, and neither the answer nor the worker's INFO log names the bucket or the endpoint."""
    fleet = make_fleet(redis_url, workdir, gemma_path, "gemma-s3down")
    port = free_port()
    try:
        fleet.add_worker("-c", "1024", "-np", "1", "-t", "1", "--slot-save-path",
                         "s3://secret-bucket-x/private/prefix", "--s3-endpoint-url",
                         f"http://127.0.0.1:{port}", env=S3_CREDENTIALS)
        api = fleet.add_api()
        fleet.wait_healthy(api)
        response = httpx.post(f"{api}/slots/0?action=save", json={"filename": "a.bin"},
                              timeout=120)
        assert response.status_code == 503, response.text
        message = response.json()["error"]["message"]
        assert message.startswith("object storage:")
        logs = "".join(p.read_text(errors="replace") for p in fleet.logs.glob("worker-*.log"))
        for secret in ("secret-bucket-x", "private/prefix", f"127.0.0.1:{port}", "s3://"):
            assert secret not in message, (secret, message)
            assert secret not in logs, (secret, logs[-2000:])
    finally:
        fleet.stop()


def test_https_with_a_certificate_without_subject_alt_name(pods: Fleet, tmp_path: Path) -> None:
    """The common way to make one (openssl req -x509 -subj /CN=...): no subjectAltName, which
    Sanic's certificate shorthand cannot read; llama-server serves with it."""
    key_file, cert_file = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-keyout", str(key_file), "-out", str(cert_file)],
                   check=True, capture_output=True)
    port = free_port()
    api = pods._spawn("api", ["--port", str(port), "--ssl-key-file", str(key_file),
                              "--ssl-cert-file", str(cert_file)])
    url = f"https://127.0.0.1:{port}"
    wait_until(lambda: api.poll() is not None
               or httpx.get(f"{url}/health", verify=False).status_code == 200,
               what="the https api")
    assert api.poll() is None, "the api stopped"
    assert httpx.get(f"{url}/health", verify=False).json() == {"status": "ok"}


@pytest.mark.process
def test_a_certificate_that_cannot_load_stops_the_api_with_a_message(tmp_path: Path) -> None:
    (tmp_path / "bad.pem").write_text("not a certificate")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_", "LLAMAQ_"))}
    done = subprocess.run([sys.executable, "-m", "llamaq", "api", "--port", str(free_port()),
                           "--ssl-key-file", str(tmp_path / "bad.pem"), "--ssl-cert-file",
                           str(tmp_path / "bad.pem")], capture_output=True, text=True,
                          timeout=60, env={**env, "LLAMAQ_REDIS_URL": "redis://127.0.0.1:1/0"})
    assert done.returncode != 0
    assert "cannot load --ssl-cert-file/--ssl-key-file" in done.stderr


def test_reuse_port_lets_two_pods_share_one_port(pods: Fleet) -> None:
    port = free_port()
    first = pods._spawn("api", ["--port", str(port), "--reuse-port"])
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: httpx.get(f"{url}/health").status_code == 200, what="the first pod")
    second = pods._spawn("api", ["--port", str(port), "--reuse-port"])
    second_log = pods.logs / f"api-{len(pods.processes) - 1}.log"
    wait_until(lambda: second.poll() is not None or "Worker ready" in second_log.read_text(),
               what="the second pod serving (past its bind) or stopped")
    assert second.poll() is None, "the second pod could not bind the shared port"
    first.terminate()
    first.wait(timeout=30)
    wait_until(lambda: httpx.get(f"{url}/health").status_code == 200, what="the second pod")


def slow_request(url: str, path: str, headers: dict[str, str]) -> tuple[float, bytes]:
    """Send a request's headers with a body of 100 bytes announced, then nothing: how long
    until the server answers, and its answer's first bytes."""
    host, port = url.removeprefix("http://").split(":")
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}", "Content-Length: 100",
             *(f"{k}: {v}" for k, v in headers.items()), "", ""]
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        started = time.monotonic()
        sock.sendall("\r\n".join(lines).encode())
        answer = sock.recv(200)
        return time.monotonic() - started, answer


def test_a_body_that_never_comes_is_ended_whoever_sends_it(pods: Fleet) -> None:
    """Headers, then nothing: without a key the 401 comes at once, before the body; with a
    key the wait is bounded by --body-timeout (it was -to, 3600 s), for a streamed file upload
    too."""
    url = pods.add_api("--api-key", "sekrit", "--body-timeout", "2")
    elapsed, answer = slow_request(url, "/completion", {"Content-Type": "application/json"})
    assert answer.startswith(b"HTTP/1.1 401") and elapsed < 1.5, (elapsed, answer)
    auth = {"Authorization": "Bearer sekrit", "Content-Type": "application/json"}
    elapsed, answer = slow_request(url, "/completion", auth)
    assert answer.startswith(b"HTTP/1.1 408") and 1.5 < elapsed < 10, (elapsed, answer)
    upload = {"Authorization": "Bearer sekrit",
              "Content-Type": "multipart/form-data; boundary=x"}
    elapsed, answer = slow_request(url, "/v1/files", upload)
    assert answer.startswith(b"HTTP/1.1 408") and 1.5 < elapsed < 10, (elapsed, answer)


def test_a_pod_queues_a_burst_of_connections_while_its_loop_is_busy(pods: Fleet) -> None:
    """The listen queue (llamaq/processes.py LISTEN_BACKLOG) holds a burst of 500 connections
    while the pod accepts none (stopped here): with Sanic's 100, the 102nd on waited out a SYN
    retry or was reset; all 500 complete their handshake and are served once it resumes."""
    if int(Path("/proc/sys/net/core/somaxconn").read_text()) < 500:
        pytest.skip("the kernel caps every listen queue under 500 (net.core.somaxconn)")
    url = pods.add_api()
    host, port = url.removeprefix("http://").split(":")
    pod = pods.processes[-1]
    pod.send_signal(signal.SIGSTOP)
    sockets: list[socket.socket] = []
    try:
        for _ in range(500):
            sock = socket.socket()
            sock.settimeout(0.5)  # under a SYN retry (1 s): a full queue shows as a timeout
            sock.connect((host, int(port)))
            sockets.append(sock)
    finally:
        pod.send_signal(signal.SIGCONT)
    for sock in sockets[::50]:
        sock.sendall(f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        sock.settimeout(30)
        assert sock.recv(20).startswith(b"HTTP/1.1 "), "a queued connection was not served"
    for sock in sockets:
        sock.close()
