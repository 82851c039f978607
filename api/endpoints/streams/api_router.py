"""`DELETE /v1/streams/{id}` (ours): stop a streamed response now.

A client that merely goes away leaves its jobs running for a short grace, so that it can resume
the stream with `Last-Event-ID`; a client that means to stop (the web UI's Stop button) says so
here, with the record id that starts every event id of the stream, and the slots free at once.

llama.cpp's web UI sends `X-Conversation-Id` with a chat and calls llama-server's resumable
stream routes (api/conversation_stream.py keeps the conversation's session): `DELETE
/v1/stream?conv_id=` (its Stop) stops the conversation's response here as above and evicts its
session (204, also when there is none); `POST /v1/streams/lookup` lists the sessions of the ids
asked about; `GET /v1/stream?conv_id=&from=` replays a session's SSE bytes from a byte offset
and follows it to its end, from any api pod."""

from __future__ import annotations

from sanic import Request
from sanic.response import HTTPResponse, empty, json

from api.body import parsed_json, raw_body
from api.routing import Routes
from api.services import services
from api.sse import SSE_HEADERS
from scheduler.contract.errors import InvalidRequest, NotFound
from scheduler.conversation_streams import ConversationStreams
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
    await _sessions(request).evict(conv_id)
    for job_id in record.job_ids if record is not None else []:
        await fleet.jobs.cancel(job_id)
    return empty(status=204)


def _sessions(request: Request) -> ConversationStreams:
    return ConversationStreams(services(request).fleet.redis, request.ctx.tenant.name)


@routes.get("/v1/stream", name="replay_conversation_stream")
async def replay_conversation_stream(request: Request) -> HTTPResponse | None:
    conv_id = _conversation(request)
    sessions = _sessions(request)
    if await sessions.info(conv_id) is None:
        raise NotFound("Stream not found or expired")
    start = request.args.get("from") or "0"
    if not start.isdigit():
        raise InvalidRequest("Invalid 'from' offset")
    response = await request.respond(content_type="text/event-stream", headers=SSE_HEADERS)
    assert response is not None
    async for chunk in sessions.read(conv_id, int(start)):
        await response.send(chunk)
    await response.eof()
    return None


@routes.post("/v1/streams/lookup", name="lookup_conversation_streams")
async def lookup_conversation_streams(request: Request) -> HTTPResponse:
    body = parsed_json(request, raw_body(request))  # a bad body is a 400, as every body's
    asked = body.get("conversation_ids") if isinstance(body, dict) else None
    ids = [i for i in asked if isinstance(i, str) and i] if isinstance(asked, list) else []
    return json([s.json() for s in await _sessions(request).lookup(ids)])
