"""`GET /lora-adapters` and `POST /lora-adapters`: the model's LoRA adapters (its workers'
--lora, --lora-scaled) and their global scales, for every worker of the model at once.

GET answers from any api pod with the registry entry of the model's first live worker (every
worker of a model loads the same adapter flags); POST stores the new scales on Redis, tells the
model's workers and answers once they show them (scheduler/lora_scales.py). Router mode: the
model is `?model=` or the body's (api/router.py).
"""

from __future__ import annotations

import logging

from sanic import Request
from sanic.response import HTTPResponse, json

from api.body import load_json, raw_body
from api.routing import Routes
from api.services import request_model, services
from scheduler.contract.errors import InvalidRequest
from scheduler.contract.jobs import parse_lora_request, scales_of
from scheduler.lora_scales import set_scales

log = logging.getLogger(__name__)
routes = Routes("lora")


@routes.get("/lora-adapters")
async def lora_adapters(request: Request) -> HTTPResponse:
    fleet = services(request).fleet
    workers = await fleet.placement.workers(request_model(request), fresh=True)
    return json([adapter.wire() for adapter in workers[0].lora])


@routes.post("/lora-adapters", guarded=True, admin="setting the LoRA adapters' scales")
async def set_lora_adapters(request: Request) -> HTTPResponse:
    """llama-server's: the body is an array of {id, scale}; adapters not named go to 0 and
    unknown ids are ignored; `[]` turns every adapter off."""
    body = json_body_list(request)
    fleet = services(request).fleet
    model_id = request_model(request)
    workers = await fleet.placement.workers(model_id, fresh=True)
    scales = scales_of(len(workers[0].lora), parse_lora_request(body))
    if not await set_scales(fleet.redis, model_id, scales,
                            lambda: fleet.workers(model_id, fresh=True)):
        log.warning("LoRA scales of %s: not every worker showed them within the wait; they "
                    "take them from Redis", model_id)
    return json({"success": True})


def json_body_list(request: Request) -> list[object]:
    raw = raw_body(request)
    body = load_json(raw) if raw.strip() else None
    if not isinstance(body, list):
        raise InvalidRequest("Request body must be an array")
    return body
