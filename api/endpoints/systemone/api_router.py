"""POST /v1/systemone: typed questions about a state, answered with probabilities by a decision
job (worker/decisions/run.py). An invalid body is a 400 first; then a model that serves no
decisions (neither native nor under the worker's --decisions) is a 501. Images and audio
(`files`, `images`, a state's image_url / input_audio parts) go to prompted decision workers
whose projector takes them, placed before the state (markers in the prefix, the bytes as the
job's media); none such (or a native family, whose media path is not built) is the spec's 501,
naming the request's first media field."""

from __future__ import annotations

from sanic import Request
from sanic.response import HTTPResponse, json

from api.body import parse_body
from api.chat.templates import ChatTemplate, template_kwargs
from api.endpoints.systemone.prompt import decision_job, systemone_input
from api.endpoints.systemone.protocol import SystemOneRequest
from api.endpoints.systemone.render import systemone_json
from api.media.refs import media_refs
from api.media.sources import media_access
from api.routing import Routes
from api.services import request_model, request_settings, services
from scheduler.contract import limits
from scheduler.contract.errors import InvalidRequest, NotSupported
from scheduler.contract.results import DecisionResult, expect_result
from scheduler.decision_meta import DecisionCaps
from scheduler.registry import WorkerInfo

routes = Routes("systemone")


def media_workers(able: list[WorkerInfo], caps: DecisionCaps, where: str,
                  kind: str) -> list[WorkerInfo]:
    """Those of `able` that answer decisions with media of `kind` (image, audio): prompted
    decisions on a worker whose multimodal projector takes them. None: the spec's 501, naming
    the media field `where` (a native family's media, its own path in llama.cpp, are not
    built)."""
    if caps.family is not None:
        raise NotSupported(f"{kind} input is not supported by /v1/systemone here ({where}): "
                           f"llamaq does not build {caps.family.name}'s media path")
    modality = "vision" if kind == "image" else "audio"
    taking = [w for w in able if w.meta.modalities.get(modality)]
    if not taking:
        raise NotSupported(f"{kind} input is not supported by /v1/systemone here ({where}): "
                           "no multimodal projector that takes it is loaded")
    return taking


@routes.post("/v1/systemone", name="systemone", body=SystemOneRequest)
async def answer(request: Request) -> HTTPResponse:
    body = parse_body(request, SystemOneRequest)
    settings = request_settings(request)
    fleet = services(request).fleet
    model_id = request_model(request)
    workers, able = await fleet.placement.deciding(model_id)
    caps = able[0].meta.decisions
    assert caps is not None
    media = body.media_fields()
    for where, kind in media:
        able = media_workers(able, caps, where, kind)
    if body.state is None and not caps.accepts_null_state:
        raise InvalidRequest('"state" must be provided (only lfm2-d1 and lfm2-d1-omni take a '
                             'null state)')
    for qid, question in body.questions.items():
        if question.type not in caps.types:
            raise InvalidRequest(f"question {qid!r}: this model does not answer "
                                 f"{question.type} questions")
        if isinstance(question.criteria, dict) and question.type == "choice" \
                and len(question.criteria) > caps.max_options:
            raise InvalidRequest(f"question {qid!r} has {len(question.criteria)} options; this "
                                 f"model takes at most {caps.max_options}")
    own = settings.chat_template or settings.chat_template_file or able[0].meta.chat_template
    template = ChatTemplate.for_model(settings, able[0].meta) if own else None
    marker = able[0].meta.media_marker if media else ""
    job = decision_job(body, template, model_id,
                       {**template_kwargs(settings), "enable_thinking": False}, marker)
    if caps.family is not None:  # a family of the spec: its worker renders the request itself
        job.systemone = systemone_input(body)
    limits.check_decision(job)
    if media:
        job.media = await media_refs(body.media(),
                                     media_access(services(request).settings, files=False),
                                     services(request).store)
        job.media_marker = marker
    if len(able) < len(workers):  # only some workers serve decisions: one of them
        job.worker_id = (await fleet.placement.pick(able)).worker_id
    result = expect_result(await fleet.jobs.run(job), DecisionResult)
    return json(systemone_json(body, result, model_id))
