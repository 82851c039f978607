"""/embedding, /embeddings, /v1/embeddings and /rerank (with /reranking, /v1/rerank,
/v1/reranking): one job per request, all its inputs in it, on the model's embedding workers.

A model serves what its workers were started for (scheduler/registry.py
WorkerInfo.capabilities): embeddings on a completion model, or a rerank on a model without rank
pooling, is llama-server's 501."""

from __future__ import annotations

from sanic import Blueprint, Request
from sanic.response import HTTPResponse, json

from api.body import json_body
from api.endpoints.embeddings.protocol import embedding_request, rerank_request
from api.endpoints.embeddings.render import native_embeddings_json, oai_embeddings_json, rerank_json
from api.fleet import Fleet
from api.router import request_model
from scheduler.errors import InvalidRequest, NotSupported, Unavailable
from scheduler.registry import WorkerInfo

embeddings = Blueprint("embeddings")

NATIVE = ("/embedding", "/embeddings")
OAI = ("/v1/embeddings",)
RERANK = ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking")
NO_EMBEDDINGS = "This server does not support embeddings. Start it with `--embeddings`"
NO_RERANK = "This server does not support reranking. Start it with `--reranking`"


async def _serving(request: Request, capability: str) -> tuple[str, WorkerInfo]:
    """The model and a live worker of it that serves `capability`; 501 when none does."""
    fleet: Fleet = request.app.ctx.fleet
    model_id = request_model(request)
    workers = await fleet.workers(model_id)
    if not workers:
        raise Unavailable("Loading model")
    for worker in workers:
        if capability in worker.capabilities():
            return model_id, worker
    raise NotSupported(NO_RERANK if capability == "rerank" else NO_EMBEDDINGS)


async def _embeddings(request: Request, oai_route: bool) -> HTTPResponse:
    model_id, worker = await _serving(request, "embedding")
    if oai_route and worker.pooling == "none":
        raise InvalidRequest("Pooling type 'none' is not OAI compatible. Please use a "
                             "different pooling type")
    body = embedding_request(json_body(request), oai_route)
    fleet: Fleet = request.app.ctx.fleet
    result = await fleet.jobs.run_embedding(body.to_job(model_id))
    if not body.oai:
        return json(native_embeddings_json(result))
    model = body.model if isinstance(body.model, str) else model_id
    return json(oai_embeddings_json(result, model, body.base64))


async def native_embeddings(request: Request) -> HTTPResponse:
    return await _embeddings(request, oai_route=False)


async def oai_embeddings(request: Request) -> HTTPResponse:
    return await _embeddings(request, oai_route=True)


async def rerank(request: Request) -> HTTPResponse:
    model_id, _ = await _serving(request, "rerank")
    body = rerank_request(json_body(request))
    fleet: Fleet = request.app.ctx.fleet
    result = await fleet.jobs.run_rerank(body.to_job(model_id))
    model = body.model if isinstance(body.model, str) else model_id
    return json(rerank_json(result, model, body.documents, body.top_n, body.tei,
                            body.return_text))


for _path in NATIVE:
    embeddings.add_route(native_embeddings, _path, methods=["POST"],
                         name=f"embeddings{_path.replace('/', '_')}")
for _path in OAI:
    embeddings.add_route(oai_embeddings, _path, methods=["POST"],
                         name=f"embeddings{_path.replace('/', '_')}")
for _path in RERANK:
    embeddings.add_route(rerank, _path, methods=["POST"], name=f"rerank{_path.replace('/', '_')}")
