"""A file upload (`multipart/form-data` with `file` and `purpose`) read as it arrives: the
multipart parser (python-multipart, streaming) is fed each part of the body, the file's bytes
go to a temporary file on disk as they come, and its size is checked as it grows. Nothing of
the file is held in memory whole, and the event loop does a little work per part instead of
parsing hundreds of MB in one go; the object store then takes the file from disk (S3: a
multipart upload)."""

from __future__ import annotations

import asyncio
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from python_multipart.multipart import MultipartParser, parse_options_header
from sanic import Request

from api.services import services
from scheduler.contract.errors import InvalidRequest

FIELD_MAX_BYTES = 4096
"""A form field other than the file (purpose) is short."""


@dataclass
class Upload:
    """What the form held: its fields (but the file), and the file on disk."""

    fields: dict[str, str] = field(default_factory=dict)
    filename: str | None = None
    path: Path | None = None
    size: int = 0


class _Form:
    """python-multipart's callbacks: headers of each part, then its data."""

    def __init__(self, folder: Path, max_file_bytes: int, too_big: InvalidRequest) -> None:
        self.upload = Upload()
        self._folder = folder
        self._max = max_file_bytes
        self._too_big = too_big
        self._header_field = b""
        self._header_value = b""
        self._headers: dict[bytes, bytes] = {}
        self._name: str | None = None
        self._value = bytearray()
        self._file: IO[bytes] | None = None

    def on_part_begin(self) -> None:
        self._headers, self._name, self._value = {}, None, bytearray()

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_field += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def on_header_end(self) -> None:
        self._headers[self._header_field.lower()] = self._header_value
        self._header_field, self._header_value = b"", b""

    def on_headers_finished(self) -> None:
        _, options = parse_options_header(self._headers.get(b"content-disposition", b""))
        name = options.get(b"name")
        self._name = name.decode(errors="replace") if name is not None else ""
        if self._name == "file":
            if self.upload.path is not None:
                raise InvalidRequest("The form has two 'file' parts")
            filename = options.get(b"filename")
            self.upload.filename = filename.decode(errors="replace") if filename else None
            self.upload.path = self._folder / "content"
            self._file = self.upload.path.open("wb")

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._file is not None:
            self.upload.size += end - start
            if self.upload.size > self._max:
                raise self._too_big
            self._file.write(data[start:end])
            return
        self._value += data[start:end]
        if len(self._value) > FIELD_MAX_BYTES:
            raise InvalidRequest(f"The form field {self._name!r} is longer than "
                                 f"{FIELD_MAX_BYTES} bytes")

    def on_part_end(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        elif self._name is not None:
            self.upload.fields[self._name] = self._value.decode(errors="replace")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


async def read_upload(request: Request, folder: Path, max_file_bytes: int,
                      too_big: InvalidRequest, max_body_bytes: int) -> Upload:
    """Stream the request's multipart body into `folder` (the file) and the fields; each
    part of the body must come within --body-timeout; a file past `max_file_bytes` is
    refused (`too_big`) as soon as it grows past it, the rest not read."""
    content_type, options = parse_options_header(request.headers.get("content-type", ""))
    boundary = options.get(b"boundary")
    if content_type != b"multipart/form-data" or not boundary:
        raise InvalidRequest("The body must be multipart/form-data with `file` and `purpose`")
    form = _Form(folder, max_file_bytes, too_big)
    parser = MultipartParser(boundary, {  # type: ignore[arg-type]
        name: getattr(form, name) for name in (
            "on_part_begin", "on_header_field", "on_header_value", "on_header_end",
            "on_headers_finished", "on_part_data", "on_part_end")})
    body_timeout = services(request).settings.body_timeout
    received = 0
    try:
        while True:
            try:
                part = await asyncio.wait_for(request.stream.read(),  # type: ignore[union-attr]
                                              body_timeout)
            except TimeoutError:
                raise InvalidRequest(f"no part of the upload came for {body_timeout:g} s "
                                     "(--body-timeout)", status=408) from None
            if part is None:
                break
            received += len(part)
            if received > max_body_bytes:
                raise too_big
            try:
                parser.write(part)
            except InvalidRequest:
                raise
            except Exception as exc:  # the parser's errors: a malformed body
                raise InvalidRequest(f"The multipart body is malformed: {exc}") from None
        parser.finalize()
    finally:
        form.close()
    return form.upload


def upload_folder() -> tempfile.TemporaryDirectory[str]:
    return tempfile.TemporaryDirectory(prefix="llamaq-upload-")
