"""/embedding, /embeddings, /v1/embeddings and /rerank (with /reranking, /v1/rerank,
/v1/reranking): the inputs of a request in one job, on the model's embedding workers; requests
that arrive while this pod's embedding job for the model is in flight go together in the next
one (api/embedding_batcher.py).

A model serves what its workers were started for (scheduler/registry.py
WorkerInfo.capabilities): embeddings on a completion model, or a rerank on a model without rank
pooling, is llama-server's 501."""

from __future__ import annotations

from sanic import Request
from sanic.response import HTTPResponse, json

from api.body import parse_body
from api.endpoints.embeddings.protocol import EmbeddingsRequest, RerankRequest
from api.endpoints.embeddings.render import native_embeddings_json, oai_embeddings_json, rerank_json
from api.media.embeddings import has_media, resolve_inputs
from api.media.sources import media_access
from api.routing import Routes
from api.services import request_model, request_settings, services
from scheduler.contract.errors import InvalidRequest

routes = Routes("embeddings")


async def _embeddings(request: Request, oai_route: bool) -> HTTPResponse:
    fleet = services(request).fleet
    model_id = request_model(request)
    worker = await fleet.placement.serving(model_id, "embedding")
    if oai_route and worker.pooling == "none":
        raise InvalidRequest("Pooling type 'none' is not OAI compatible. Please use a "
                             "different pooling type")
    body = parse_body(request, EmbeddingsRequest)
    inputs = None
    if has_media(body.inputs):
        inputs = await resolve_inputs(body.inputs, worker.meta, services(request).store,
                                      media_access(request_settings(request)))
    result = await fleet.embeddings.embed(body.to_job(model_id, inputs))
    if not body.answers_oai(oai_route):
        return json(native_embeddings_json(result))
    model = body.model if isinstance(body.model, str) else model_id
    return json(oai_embeddings_json(result, model, body.base64))


@routes.post("/embedding", "/embeddings", body=EmbeddingsRequest)
async def native_embeddings(request: Request) -> HTTPResponse:
    return await _embeddings(request, oai_route=False)


@routes.post("/v1/embeddings", body=EmbeddingsRequest)
async def oai_embeddings(request: Request) -> HTTPResponse:
    return await _embeddings(request, oai_route=True)


@routes.post("/rerank", "/reranking", "/v1/rerank", "/v1/reranking", body=RerankRequest)
async def rerank(request: Request) -> HTTPResponse:
    fleet = services(request).fleet
    model_id = request_model(request)
    await fleet.placement.serving(model_id, "rerank")
    body = parse_body(request, RerankRequest)
    result = await fleet.jobs.run_rerank(body.to_job(model_id))
    model = body.model if isinstance(body.model, str) else model_id
    return json(rerank_json(result, model, body.documents, body.top_n, body.tei,
                            body.return_text))
