"""The OpenAI Batch API (ours: llama-server has none): `POST /v1/batches`, `GET /v1/batches`,
`GET /v1/batches/{id}`, `POST /v1/batches/{id}/cancel`. A batch is a record in Redis
(scheduler/batches.py); the api pods' drivers run it (api/batch/driver.py)."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, ValidationError, field_validator
from sanic import Request
from sanic.response import HTTPResponse, json

from api.body import json_body
from api.endpoints.batches.served import SERVED
from api.endpoints.files.api_router import owned_meta, refuse_on_a_router, tenant_of
from api.errors import validation_message
from api.routing import Routes
from api.services import services
from scheduler.batches import (
    COMPLETION_WINDOW_S,
    LIST_LIMIT_MAX,
    MAX_METADATA_PAIRS,
    Batches,
    BatchRecord,
    now,
)
from scheduler.contract.deferred import DeferredModel
from scheduler.contract.errors import InvalidRequest

routes = Routes("batches")
routes.blueprint.on_request(refuse_on_a_router)


class CreateBatch(DeferredModel):
    model_config = ConfigDict(extra="forbid")

    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, value: str) -> str:
        if value not in SERVED:
            raise ValueError(f"endpoint {value!r} is not supported; a batch may run: "
                             + ", ".join(SERVED))
        return value

    @field_validator("completion_window")
    @classmethod
    def _window(cls, value: str) -> str:
        if value != "24h":
            raise ValueError("completion_window must be '24h'")
        return value

    @field_validator("metadata")
    @classmethod
    def _metadata(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return value
        if len(value) > MAX_METADATA_PAIRS:
            raise ValueError(f"metadata may have at most {MAX_METADATA_PAIRS} pairs")
        for key, item in value.items():
            if len(key) > 64 or len(item) > 512:
                raise ValueError("metadata keys are at most 64 characters and values 512")
        return value


def store_of(request: Request) -> Batches:
    return Batches(services(request).fleet.redis)


@routes.post("/v1/batches", name="create_batch")
async def create_batch(request: Request) -> HTTPResponse:
    try:
        body = CreateBatch.model_validate(json_body(request))
    except ValidationError as exc:
        raise InvalidRequest(validation_message(exc)) from None
    meta = await owned_meta(request, body.input_file_id)
    if meta.purpose != "batch":
        raise InvalidRequest(f"File {body.input_file_id} has purpose {meta.purpose!r}; a "
                             "batch reads only files uploaded with purpose 'batch'")
    created = now()
    record = BatchRecord(endpoint=body.endpoint, input_file_id=body.input_file_id,
                         completion_window=body.completion_window, metadata=body.metadata,
                         created_at=created, expires_at=created + COMPLETION_WINDOW_S,
                         fleet_model=services(request).settings.model_id(),
                         owner=tenant_of(request).name)
    await store_of(request).create(record)
    return json(record.to_wire())


@routes.get("/v1/batches", name="list_batches")
async def list_batches(request: Request) -> HTTPResponse:
    try:
        limit = int(request.args.get("limit", "20"))
    except ValueError:
        raise InvalidRequest("limit must be an integer") from None
    if not 1 <= limit <= LIST_LIMIT_MAX:
        raise InvalidRequest(f"limit must be between 1 and {LIST_LIMIT_MAX}")
    store = store_of(request)
    scope = tenant_of(request)
    records, has_more = await store.page(request.args.get("after"), limit,
                                         None if scope.sees_all else scope.name)
    data = [(await store.with_counts(r)).to_wire() for r in records]
    return json(page_json(data, has_more))


async def owned_batch(request: Request, batch_id: str) -> BatchRecord:
    """Another tenant's batch is a 404, as a missing one."""
    record = await store_of(request).get(batch_id)
    tenant_of(request).check_owner(record.owner, f"No batch found with id '{batch_id}'")
    return record


def page_json(data: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": has_more}


@routes.get("/v1/batches/<batch_id:str>", name="get_batch")
async def get_batch(request: Request, batch_id: str) -> HTTPResponse:
    store = store_of(request)
    return json((await store.with_counts(await owned_batch(request, batch_id))).to_wire())


@routes.post("/v1/batches/<batch_id:str>/cancel", name="cancel_batch")
async def cancel_batch(request: Request, batch_id: str) -> HTTPResponse:
    store = store_of(request)
    await owned_batch(request, batch_id)

    def cancelling(record: BatchRecord) -> BatchRecord | None:
        if record.status not in ("validating", "in_progress"):
            return None
        record.status, record.cancelling_at = "cancelling", now()
        return record

    record = await store.update(batch_id, cancelling)
    if record.status not in ("cancelling", "cancelled"):
        raise InvalidRequest(f"Cannot cancel a batch with status '{record.status}'.")
    return json((await store.with_counts(record)).to_wire())
