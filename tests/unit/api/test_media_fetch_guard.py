"""Issue 43 item 11: a media URL reaches no private, loopback, link-local or metadata address
unless --fetch-allow lists it, checked after DNS and on every redirect hop before anything is
sent there; one deadline bounds a whole fetch (a slow-drip server is cut); every failure is the
same error. Real sockets on this machine (servers in threads), api/media/sources.py's
`download` and api/net/."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from api.media.sources import DOWNLOAD_FAILED, download
from api.net.policy import FetchPolicy, parse_networks
from scheduler.contract.errors import ServerError

IMAGE = b"\x89PNG\r\n\x1a\n" + b"p" * 64


class Listener:
    """A TCP port that counts the connections made to it (and answers none)."""

    def __init__(self, host: str) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind((host, 0))
        self.sock.listen(8)
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.running = True
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while self.running:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.running = False
        self.thread.join()
        self.sock.close()


def handler(elsewhere: int) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/image":
                self.send_response(200)
                self.send_header("Content-Length", str(len(IMAGE)))
                self.end_headers()
                self.wfile.write(IMAGE)
            elif self.path == "/redirect":
                self.send_response(302)
                self.send_header("Location", f"http://127.0.0.2:{elsewhere}/x.png")
                self.end_headers()
            elif self.path == "/drip":  # each byte well inside a per-read timeout
                self.send_response(200)
                self.send_header("Content-Length", "1000")
                self.end_headers()
                for _ in range(1000):
                    try:
                        self.wfile.write(b"x")
                        self.wfile.flush()
                    except OSError:
                        return
                    time.sleep(0.2)
            else:
                self.send_error(404)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


@pytest.fixture()
def elsewhere() -> Iterator[Listener]:
    listener = Listener("127.0.0.2")
    yield listener
    listener.close()


@pytest.fixture()
def origin(elsewhere: Listener) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(elsewhere.port))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


LOCAL = FetchPolicy(parse_networks(["127.0.0.1"]), deadline_s=1.5)


def fails(url: str, policy: FetchPolicy) -> float:
    """The seconds a failing download took; its error is the one of every failure."""
    started = time.monotonic()
    with pytest.raises(ServerError) as caught:
        asyncio.run(download(url, policy))
    assert (caught.value.status, caught.value.message) == (500, DOWNLOAD_FAILED)
    return time.monotonic() - started


def test_an_allowed_origin_is_fetched(origin: str) -> None:
    assert asyncio.run(download(f"{origin}/image", LOCAL)) == IMAGE


def test_private_addresses_are_refused_before_any_connection() -> None:
    loopback = Listener("127.0.0.1")
    try:
        for url in (f"http://127.0.0.1:{loopback.port}/a.png",
                    f"http://localhost:{loopback.port}/a.png",
                    f"http://2130706433:{loopback.port}/a.png",  # 127.0.0.1 as a number
                    f"http://[::ffff:127.0.0.1]:{loopback.port}/a.png",
                    "http://169.254.169.254/latest/meta-data/",  # the cloud metadata service
                    "http://10.1.2.3/a.png", "http://192.168.0.1/a.png",
                    "http://100.64.0.1/a.png", "http://0.0.0.0/a.png", "http://[fd00::1]/a.png"):
            assert fails(url, FetchPolicy()) < 1.0, url  # refused, not timed out connecting
        assert loopback.accepted == 0
    finally:
        loopback.close()


def test_a_redirect_to_loopback_is_refused(origin: str, elsewhere: Listener) -> None:
    fails(f"{origin}/redirect", LOCAL)  # 127.0.0.1 is allowed, 127.0.0.2 is not
    assert elsewhere.accepted == 0


@pytest.mark.serial  # cut between 1.4 s and 3 s: alone (tests/lanes.py)
def test_a_slow_drip_is_cut_at_the_deadline(origin: str) -> None:
    took = fails(f"{origin}/drip", LOCAL)
    assert 1.4 < took < 3.0


def test_every_failure_is_the_same_error(origin: str) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()
    for url in (f"{origin}/missing.png", f"http://127.0.0.1:{port}/x.png", "http://nope.invalid/",
                "http://[::1", f"{origin}/redirect"):
        fails(url, LOCAL)
    fails(f"{origin}/image", FetchPolicy())  # the same origin, not allowed


def test_the_policy() -> None:
    policy = FetchPolicy(parse_networks(["10.0.0.0/8", "fd00::1"]))
    assert policy.permits(ipaddress.ip_address("10.9.8.7"))
    assert policy.permits(ipaddress.ip_address("::ffff:10.9.8.7"))
    assert policy.permits(ipaddress.ip_address("fd00::1"))
    assert not policy.permits(ipaddress.ip_address("fd00::2"))
    assert not policy.permits(ipaddress.ip_address("127.0.0.1"))
    assert not policy.permits(ipaddress.ip_address("64:ff9b::7f00:1"))  # NAT64 of 127.0.0.1
    assert not policy.permits(ipaddress.ip_address("224.0.0.1"))
    assert policy.permits(ipaddress.ip_address("93.184.216.34"))
    with pytest.raises(ValueError, match="--fetch-allow: not an address or network: x"):
        parse_networks(["x"])
