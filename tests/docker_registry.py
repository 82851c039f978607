"""A Docker registry stand-in for `-dr` (storage/docker_hub.py): a token service, manifests and
blobs over HTTP on a free port, the paths and headers Docker Hub's model registry answers, so
tests never reach the internet. Point a worker at it with `env()`."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

TOKEN = "registry-token"
GGUF_TYPE = "application/vnd.docker.ai.gguf.v3"


class Registry:
    def __init__(self) -> None:
        self.images: dict[tuple[str, str], bytes] = {}
        self.requests: list[str] = []
        self.url = ""

    def add(self, repo: str, tag: str, data: bytes) -> str:
        """An image `repo:tag` whose one GGUF layer is `data`; returns the layer's digest."""
        self.images[(repo, tag)] = data
        return "sha256:" + hashlib.sha256(data).hexdigest()

    def env(self) -> dict[str, str]:
        return {"LLAMAQ_DOCKER_REGISTRY": self.url, "LLAMAQ_DOCKER_AUTH": f"{self.url}/token"}

    def manifest(self, repo: str, tag: str) -> bytes | None:
        data = self.images.get((repo, tag))
        if data is None:
            return None
        return json.dumps({"schemaVersion": 2, "layers": [
            {"mediaType": "application/vnd.docker.ai.license", "digest": "sha256:" + "0" * 64},
            {"mediaType": GGUF_TYPE, "size": len(data),
             "digest": "sha256:" + hashlib.sha256(data).hexdigest()}]}).encode()

    def blob(self, repo: str, digest: str) -> bytes | None:
        return next((data for (name, _), data in self.images.items() if name == repo
                     and "sha256:" + hashlib.sha256(data).hexdigest() == digest), None)


def _handler(registry: Registry) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            registry.requests.append(parts.path)
            if parts.path == "/token":
                scope = parse_qs(parts.query).get("scope", [""])[0]
                ok = scope.startswith("repository:") and scope.endswith(":pull")
                self._send(200 if ok else 400, json.dumps({"token": TOKEN}).encode())
                return
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self._send(401, b'{"errors": [{"code": "UNAUTHORIZED"}]}')
                return
            path = parts.path.removeprefix("/v2/")
            repo, kind, last = path.rsplit("/", 2) if path.count("/") >= 2 else ("", "", "")
            found = registry.manifest(repo, last) if kind == "manifests" else \
                registry.blob(repo, last) if kind == "blobs" else None
            self._send(404 if found is None else 200, found or b'{"errors": []}')

        def _send(self, status: int, payload: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    return Handler


@contextmanager
def serve(registry: Registry) -> Iterator[Registry]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(registry))
    registry.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield registry
    finally:
        server.shutdown()
        server.server_close()
