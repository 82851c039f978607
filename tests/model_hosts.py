"""Local stand-ins for where model files come from, on 127.0.0.1 (nothing is downloaded from the
internet): a plain file server (`-mu`) and a server that speaks the part of the Hugging Face Hub
API huggingface-hub uses (`HF_ENDPOINT`): the tree listing and `resolve` downloads, with Range
requests, ETags, X-Repo-Commit and LFS SHA-256s."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"
CHUNK = 64 * 1024


@dataclass
class HostedFile:
    data: bytes
    sha256: str = ""
    """What the listing announces (defaults to the real SHA-256; set it wrong to test a
    corrupted file)."""

    def __post_init__(self) -> None:
        self.sha256 = self.sha256 or hashlib.sha256(self.data).hexdigest()


@dataclass
class ModelHost:
    """Files by path (`org/repo/file.gguf` for the hub, any path for plain files), what was
    asked (method, path, Range, Authorization), and knobs to slow or cut a transfer."""

    files: dict[str, HostedFile] = field(default_factory=dict)
    requests: list[tuple[str, str, str | None, str | None]] = field(default_factory=list)
    chunk_delay_s: float = 0.0
    cut_after: int | None = None
    """Close the connection after this many bytes of a GET (once), as a dropped link does."""
    url: str = ""

    def add(self, path: str, data: bytes, sha256: str = "") -> HostedFile:
        self.files[path] = HostedFile(data, sha256)
        return self.files[path]

    def ranges(self, suffix: str) -> list[str | None]:
        return [r for m, p, r, _ in self.requests if m == "GET" and p.endswith(suffix)]

    def gets(self, suffix: str) -> int:
        return len(self.ranges(suffix))


_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?P<sub>/.*)?$")


def _handler(host: ModelHost) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            return None

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def do_GET(self) -> None:
            self._serve(body=True)

        def _serve(self, body: bool) -> None:
            path = unquote(urlsplit(self.path).path)
            host.requests.append((self.command, path, self.headers.get("Range"),
                                  self.headers.get("Authorization")))
            if tree := _TREE.match(path):
                self._tree(tree["repo"])
                return
            resolve = _RESOLVE.match(path)
            key = f"{resolve['repo']}/{resolve['path']}" if resolve else path.lstrip("/")
            hosted = host.files.get(key)
            if hosted is None:
                self._send(404, b'{"error": "not found"}', {"X-Error-Code": "EntryNotFound",
                                                             "X-Repo-Commit": COMMIT})
                return
            self._file(hosted, body, is_hub=resolve is not None)

        def _tree(self, repo: str) -> None:
            entries = [
                {"type": "file", "oid": hashlib.sha1(f.data).hexdigest(), "size": len(f.data),
                 "path": p.removeprefix(repo + "/"),
                 "lfs": {"oid": f.sha256, "size": len(f.data), "pointerSize": 134}}
                for p, f in sorted(host.files.items()) if p.startswith(repo + "/")]
            if not entries:
                self._send(404, b'{"error": "Repository not found"}',
                           {"X-Error-Code": "RepoNotFound"})
                return
            self._send(200, json.dumps(entries).encode(), {"Content-Type": "application/json"})

        def _file(self, hosted: HostedFile, body: bool, is_hub: bool) -> None:
            data = hosted.data
            start = 0
            match = re.match(r"bytes=(\d+)-", self.headers.get("Range") or "")
            headers = {"Accept-Ranges": "bytes", "ETag": f'"{hosted.sha256}"'}
            if is_hub:
                headers |= {"X-Repo-Commit": COMMIT, "X-Linked-Etag": f'"{hosted.sha256}"',
                            "X-Linked-Size": str(len(data))}
            status = 200
            if match and body:
                start = int(match[1])
                if start >= len(data):
                    self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
                    return
                status = 206
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data) - start))
            self.end_headers()
            if not body:
                return
            cut = host.cut_after
            sent = 0
            for offset in range(start, len(data), CHUNK):
                piece = data[offset:offset + CHUNK]
                if cut is not None and sent + len(piece) > cut:
                    host.cut_after = None  # once
                    self.wfile.write(piece[:max(0, cut - sent)])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(piece)
                sent += len(piece)
                if host.chunk_delay_s:
                    time.sleep(host.chunk_delay_s)

        def _send(self, status: int, payload: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    return Handler


@contextmanager
def serve(host: ModelHost) -> Iterator[ModelHost]:
    """Serve `host` on a free 127.0.0.1 port for the block (`host.url` is its base URL)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(host))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield host
    finally:
        server.shutdown()
        server.server_close()
