
"""The OpenAI Files API (ours: llama-server has none), for batch input and output files:
`POST /v1/files`, `GET /v1/files`, `GET /v1/files/{id}`, `GET /v1/files/{id}/content`,
`DELETE /v1/files/{id}`. Files live in the object store (storage/files.py), never in Redis."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TypeVar

from sanic import Request
from sanic.response import HTTPResponse, json

from api.endpoints.files.upload import read_upload, upload_folder
from api.routing import Routes
from api.services import services
from api.tenants.service import TenantScope
from scheduler.batches import MAX_INPUT_BYTES, new_file_id, now
from scheduler.contract.errors import InvalidRequest, NotFound, NotSupported
from storage import ObjectNotFound
from storage.files import FileStore, StoredFile

routes = Routes("files")


def refuse_on_a_router(request: Request) -> None:
    """A batch runs on the model of the pod that took it (api/batch/driver.py), and a router pod
    has none: refused by name rather than accepted and never run."""
    if services(request).settings.router_mode():
        raise NotSupported("the Files and Batch API (/v1/files, /v1/batches) is not served in "
                           "router mode: send it to an api pod started with a model (-m)")


routes.blueprint.on_request(refuse_on_a_router)

UPLOAD_LIMIT = MAX_INPUT_BYTES + (1 << 20)
"""A multipart body: the file (200 MB, OpenAI's limit for batch input) and the form around it."""
PURPOSES = ("batch",)
CONTENT_PART = 1 << 20
T = TypeVar("T")


def file_store(request: Request) -> FileStore:
    return FileStore(services(request).store)


def tenant_of(request: Request) -> TenantScope:
    scope: TenantScope = request.ctx.tenant
    return scope


async def owned_meta(request: Request, file_id: str) -> StoredFile:
    """The file's description; another tenant's file is a 404, as a missing one."""
    store = file_store(request)
    meta = await in_thread(lambda: store.meta(file_id), file_id)
    tenant_of(request).check_owner(meta.owner, f"No such File object: {file_id}")
    return meta


@contextlib.asynccontextmanager
async def room_for(request: Request, file_id: str, size: int) -> AsyncIterator[None]:
    """The tenant's max_file_bytes and max_stored_bytes (its files together, with its uploads
    in flight: the upload is reserved in Redis first, so uploads that arrive together cannot
    pass one check together); the reservation ends with the block (the file stored)."""
    scope = tenant_of(request)
    tenant = scope.tenant
    if tenant.max_file_bytes is not None and size > tenant.max_file_bytes:
        raise InvalidRequest(f"The file is larger than {tenant.max_file_bytes} bytes, the "
                             f"limit of a file of tenant {tenant.name!r} (max_file_bytes)",
                             status=413)
    if tenant.max_stored_bytes is None:
        yield
        return
    limits = scope.service.limits
    in_flight = await limits.reserve_upload(tenant.name, file_id, size)
    try:
        found = await asyncio.to_thread(file_store(request).list)  # read after reserving
        mine = {f.id: f.bytes for f in found if f.owner == tenant.name}
        stored = sum(mine.values())
        pending = sum(n for other, n in in_flight.items() if other not in mine)
        if stored + pending + size > tenant.max_stored_bytes:
            raise InvalidRequest(f"Tenant {tenant.name!r} stores {stored} bytes of files "
                                 f"({pending} more being uploaded); this one would pass its "
                                 f"max_stored_bytes ({tenant.max_stored_bytes})", status=413)
        yield
    finally:
        await limits.end_upload(tenant.name, file_id, size)


async def in_thread(call: Callable[[], T], missing: str) -> T:
    """A store call off the event loop; a missing object is the API's 404."""
    try:
        return await asyncio.to_thread(call)
    except ObjectNotFound:
        raise NotFound(f"No such File object: {missing}") from None


@routes.post("/v1/files", name="upload_file", stream=True)
async def upload_file(request: Request) -> HTTPResponse:
    """Streamed (api/endpoints/files/upload.py): the file goes to disk as it arrives, then to
    the store from there, never held in memory whole."""
    tenant = tenant_of(request).tenant
    most = MAX_INPUT_BYTES
    too_big = InvalidRequest(f"The file is larger than {MAX_INPUT_BYTES} bytes, the limit of "
                             "a batch input file")
    if tenant.max_file_bytes is not None and tenant.max_file_bytes < most:
        most = tenant.max_file_bytes
        too_big = InvalidRequest(f"The file is larger than {most} bytes, the limit of a file "
                                 f"of tenant {tenant.name!r} (max_file_bytes)", status=413)
    with upload_folder() as folder:
        upload = await read_upload(request, Path(folder), most, too_big, UPLOAD_LIMIT)
        purpose = upload.fields.get("purpose")
        if purpose is None:
            raise InvalidRequest("Missing required parameter: 'purpose'")
        if purpose not in PURPOSES:
            raise InvalidRequest(f"purpose {purpose!r} is not supported; llamaq accepts files "
                                 "for: " + ", ".join(PURPOSES))
        unknown = sorted(set(upload.fields) - {"purpose"})
        if unknown:
            raise InvalidRequest(f"Unknown parameter: '{unknown[0]}' (not supported)")
        if upload.path is None:
            raise InvalidRequest("Missing required parameter: 'file'")
        meta = StoredFile(id=new_file_id(), bytes=upload.size, created_at=now(),
                          filename=upload.filename or "upload.jsonl", purpose=purpose,
                          owner=tenant_of(request).name)
        store = file_store(request)
        path = upload.path
        async with room_for(request, meta.id, upload.size):
            await asyncio.to_thread(store.put_path, meta, path)
    return json(meta.to_wire())


@routes.get("/v1/files", name="list_files")
async def list_files(request: Request) -> HTTPResponse:
    purpose = request.args.get("purpose")
    order = request.args.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest("order must be 'asc' or 'desc'")
    try:
        limit = int(request.args.get("limit", "10000"))
    except ValueError:
        raise InvalidRequest("limit must be an integer") from None
    if not 1 <= limit <= 10000:
        raise InvalidRequest("limit must be between 1 and 10000")
    found = await asyncio.to_thread(file_store(request).list)
    scope = tenant_of(request)
    found = [f for f in found if (purpose is None or f.purpose == purpose)
             and scope.owns(f.owner)]
    found.sort(key=lambda f: (f.created_at, f.id), reverse=order == "desc")
    after = request.args.get("after")
    if after:
        ids = [f.id for f in found]
        if after not in ids:
            raise NotFound(f"No such File object: {after}")
        found = found[ids.index(after) + 1:]
    page = found[:limit]
    return json({"object": "list", "data": [f.to_wire() for f in page],
                 "first_id": page[0].id if page else None,
                 "last_id": page[-1].id if page else None, "has_more": len(found) > limit})


@routes.get("/v1/files/<file_id:str>", name="get_file")
async def get_file(request: Request, file_id: str) -> HTTPResponse:
    return json((await owned_meta(request, file_id)).to_wire())


@routes.get("/v1/files/<file_id:str>/content", name="get_file_content")
async def get_file_content(request: Request, file_id: str) -> None:
    """Streamed from a local copy: an output file (20,000 embeddings are ~150 MB) is never
    held in memory."""
    store = file_store(request)
    await owned_meta(request, file_id)
    with tempfile.TemporaryDirectory(prefix="llamaq-file-") as folder:
        path = Path(folder) / "content"
        await in_thread(lambda: store.content_to(file_id, path), file_id)
        response = await request.respond(content_type="application/octet-stream")
        with path.open("rb") as content:
            while part := await asyncio.to_thread(content.read, CONTENT_PART):
                await response.send(part)
        await response.eof()


@routes.delete("/v1/files/<file_id:str>", name="delete_file")
async def delete_file(request: Request, file_id: str) -> HTTPResponse:
    store = file_store(request)
    await owned_meta(request, file_id)
    await in_thread(lambda: store.delete(file_id), file_id)
    return json({"id": file_id, "object": "file", "deleted": True})


