"""`DELETE /v1/streams/{id}` (ours): stop a streamed response now.

A client that merely goes away leaves its jobs running for a short grace, so that it can resume
the stream with `Last-Event-ID`; a client that means to stop (the web UI's Stop button) says so
here, with the record id that starts every event id of the stream, and the slots free at once."""

from __future__ import annotations

from sanic import Request
from sanic.response import HTTPResponse, json

from api.routing import Routes
from api.services import services
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
