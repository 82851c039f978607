"""`DELETE /v1/streams/{id}` (ours): stop a streamed response now.

A client that merely goes away leaves its jobs running for a short grace, so that it can resume
the stream with `Last-Event-ID`; a client that means to stop (the web UI's Stop button) says so
here, with the record id that starts every event id of the stream, and the slots free at once.

llama.cpp's web UI sends `X-Conversation-Id` with a chat and calls llama-server's resumable
stream routes: `DELETE /v1/stream?conv_id=` (its Stop) stops the conversation's response here as
above (204, also when there is none); `POST /v1/streams/lookup` answers llama-server's shape
with no session, and `GET /v1/stream?conv_id=` 404 "Stream not found or expired": llamaq resumes
a stream by its SSE event id (`Last-Event-ID`), not by llama-server's byte offset, so the UI
does not reattach to an answer after a reload (docs/endpoints.md, Web UI)."""

from __future__ import annotations

from sanic import Request
from sanic.response import HTTPResponse, empty, json

from api.body import parsed_json, raw_body
from api.routing import Routes
from api.services import services
from scheduler.contract.errors import InvalidRequest, NotFound
from scheduler.streams import StreamRecords

routes = Routes("streams")


@routes.delete("/v1/streams/<record_id:str>", name="stop_stream")
async def stop_stream(request: Request, record_id: str) -> HTTPResponse:
    fleet = services(request).fleet
    record = await StreamRecords(fleet.redis).record(record_id.partition("-")[0])
    request.ctx.tenant.check_owner(record.tenant, f"unknown or expired stream {record_id!r}")
    job_ids = record.job_ids
    for job_id in job_ids:
        await fleet.jobs.cancel(job_id)
    return json({"id": record_id, "stopped": len(job_ids)})


def _conversation(request: Request) -> str:
    conv_id = request.args.get("conv_id") or ""
    if not conv_id:
        raise InvalidRequest("Missing conversation id in path")
    return conv_id


@routes.delete("/v1/stream", name="stop_conversation_stream")
async def stop_conversation_stream(request: Request) -> HTTPResponse:
    conv_id = _conversation(request)
    fleet = services(request).fleet
    record = await StreamRecords(fleet.redis).of_conversation(request.ctx.tenant.name, conv_id)
    for job_id in record.job_ids if record is not None else []:
        await fleet.jobs.cancel(job_id)
    return empty(status=204)


@routes.get("/v1/stream", name="replay_conversation_stream")
async def replay_conversation_stream(request: Request) -> HTTPResponse:
    _conversation(request)
    raise NotFound("Stream not found or expired")


@routes.post("/v1/streams/lookup", name="lookup_conversation_streams")
async def lookup_conversation_streams(request: Request) -> HTTPResponse:
    parsed_json(request, raw_body(request))  # a bad body is a 400, as every body's
    return json([])
