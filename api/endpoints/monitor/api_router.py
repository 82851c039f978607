"""Fleet-wide /slots and /props."""

from __future__ import annotations

from typing import Any

from sanic import Request
from sanic.response import HTTPResponse, json, raw

from api.body import json_body
from api.chat.caps import chat_template_caps
from api.chat.templates import ChatTemplate, reported_source
from api.endpoints.monitor.metrics import CONTENT_TYPE, PRIORITY_COUNTERS, render_metrics
from api.endpoints.monitor.model_series import model_lines, model_series
from api.routing import Routes
from api.services import request_model, services
from api.settings import ApiSettings
from api.tenants.service import TenantScope
from scheduler.contract.errors import InvalidRequest, LlamaqError, NotSupported, Unavailable
from scheduler.contract.jobs import SlotActionJob
from scheduler.contract.results import SlotActionResult
from scheduler.llama_build import llama_build_info, llamaq_version
from scheduler.metrics_window import scrape
from scheduler.registry import ModelMeta, SlotState, WorkerInfo, fleet_sleeping

routes = Routes("monitor")


@routes.get("/slots", name="slots")
async def slots(request: Request) -> HTTPResponse:
    pod = services(request)
    if not pod.settings.slots:
        raise NotSupported("This server does not support slots endpoint. Start it with `--slots`")
    fleet = pod.fleet
    states: list[dict[str, Any]] = []
    for worker in await fleet.workers(request_model(request), fresh=True):
        offset = len(states)
        for state in await fleet.registry.slots(worker.worker_id):
            states.append(_slot_json(state, offset, request.ctx.tenant))
    if request.args.get("fail_on_no_slot") and not any(not s["is_processing"] for s in states):
        raise Unavailable("no slot available")
    return json(states)


@routes.get("/metrics", name="metrics")
async def metrics(request: Request) -> HTTPResponse:
    pod = services(request)
    if not pod.settings.metrics:
        raise NotSupported(
            "This server does not support metrics endpoint. Start it with `--metrics`")
    fleet = pod.fleet
    model_id = request_model(request)
    workers = await fleet.workers(model_id, fresh=True)
    counters = await fleet.registry.metrics_by_worker([w.worker_id for w in workers])
    queue = await fleet.queue_stats(model_id, workers)
    window = await scrape(fleet.redis, model_id, counters)
    started = str(int(pod.started_at))  # this api process's start, Unix seconds
    tenants = await tenant_counts(request)
    per_model = [*model_lines([await model_series(fleet, model_id)], full=False),
                 *fleet.latency.lines([model_id])]
    return raw(render_metrics(list(counters.values()), queue, window, tenants, per_model),
               content_type=CONTENT_TYPE,
               headers={"Process-Start-Time-Unix": started})


@routes.post("/slots/<id_slot>", name="slot_action", guarded=True)
async def slot_action(request: Request, id_slot: str) -> HTTPResponse:
    """save / restore / erase a slot's prompt cache, on the worker that holds the slot; saved
    slots live in object storage, so any worker of the model can restore them."""
    fleet = services(request).fleet
    try:
        slot_id = int(id_slot)
    except ValueError:
        raise InvalidRequest("Invalid slot ID") from None
    action = request.args.get("action", "")
    if action not in ("save", "restore", "erase"):
        raise InvalidRequest("Invalid action")
    if action != "restore":  # a snapshot of whatever the slot holds, or its erasure
        request.ctx.tenant.require_admin(f"{action} of a slot")
    filename: Any = ""
    if action != "erase":
        filename = json_body(request).get("filename")
        if not isinstance(filename, str) or not filename:
            raise InvalidRequest("Invalid filename")
    worker, local_id = await fleet.placement.slot(request_model(request), slot_id)
    stored_as = slot_file_of(request.ctx.tenant, filename) if filename else filename
    result = await fleet.jobs.slot_action(SlotActionJob(
        model=request_model(request), worker_id=worker.worker_id, id_slot=local_id,
        action=action, filename=stored_as,  # type: ignore[arg-type]
        tenant_file=services(request).tenants.directory.enabled,
        cache_salt=request.ctx.tenant.cache_salt))  # a restored slot serves its restorer
    result.filename = filename
    return json(slot_action_json(result, slot_id))


async def tenant_counts(request: Request) -> dict[str, dict[str, int]] | None:
    """Every tenant's counters under --tenants (None without): the file's tenants and the
    default at least, at 0 before their first request. Another tenant than the admin gets
    its own only: a tenant's name and traffic are the admin's to see (ours)."""
    service = services(request).tenants
    if not service.directory.enabled:
        return None
    found = await service.limits.counters()
    for name in service.directory.names():
        found.setdefault(name, {"tokens": 0, "requests": 0, "limited": 0})
    for name, counts in found.items():  # each priority's three series, 0 included
        seen = {key.partition("@")[2] for key in counts if "@" in key}
        for priority in seen or {str(service.directory.by_name(name).default_priority)}:
            for what in PRIORITY_COUNTERS:
                counts.setdefault(f"{what}@{priority}", 0)
    caller: TenantScope = request.ctx.tenant
    return found if caller.sees_all else {caller.name: found.get(caller.name, {})}


def slot_file_of(scope: TenantScope, filename: str) -> str:
    """Under --tenants a saved slot is its tenant's: stored as `<tenant>~<filename>`, so
    another tenant's restore of that name finds nothing (as a missing file); the admin
    tenant names files as they are stored."""
    if scope.sees_all:
        return filename
    if any(c in filename for c in "/\\") or ".." in filename:
        raise InvalidRequest("Invalid filename")
    return f"{scope.name}~{filename}"


def slot_action_json(result: SlotActionResult, slot_id: int) -> dict[str, Any]:
    if result.action == "erase":
        return {"id_slot": slot_id, "n_erased": result.n_tokens}
    if result.action == "save":
        return {"id_slot": slot_id, "filename": result.filename, "n_saved": result.n_tokens,
                "n_written": result.n_bytes, "timings": {"save_ms": result.ms}}
    return {"id_slot": slot_id, "filename": result.filename, "n_restored": result.n_tokens,
            "n_read": result.n_bytes, "timings": {"restore_ms": result.ms}}


@routes.get("/props", name="props")
async def props(request: Request) -> HTTPResponse:
    pod = services(request)
    settings, fleet = pod.settings, pod.fleet
    if pod.router is not None and not getattr(request.ctx, "model_id", None):
        return json(_router_props(request, settings))
    workers = await fleet.placement.workers(request_model(request), fresh=True)
    first = workers[0]
    return json({
        "default_generation_settings": {"params": first.default_settings.to_wire(full=False),
                                        "n_ctx": first.n_ctx_slot},
        "total_slots": sum(w.n_slots for w in workers),
        "model_alias": request_model(request),
        "model_ftype": first.meta.model_ftype,
        "model_path": first.model_path,
        "chat_template": reported_source(settings, first.meta),
        "chat_template_caps": _template_caps(settings, first.meta),
        "modalities": {key: first.meta.modalities.get(key, False)
                       for key in ("vision", "video", "audio")},
        "media_marker": first.meta.media_marker,
        "endpoint_slots": settings.slots,
        "endpoint_props": settings.props,
        "endpoint_metrics": settings.metrics,
        "decisions": _decisions_json(first.meta),
        "build_info": first.build_info,
        "llamaq_version": llamaq_version(),
        **({"fit": first.fit.model_dump()} if first.fit else {}),
        "is_sleeping": fleet_sleeping(workers),
        "ui": settings.ui,
        "ui_settings": pod.ui_settings,
        "bos_token": first.meta.bos_token,
        "eos_token": first.meta.eos_token,
        "cors_proxy_enabled": settings.cors_proxy_on(),
        **({"simulated": True} if any(w.simulated for w in workers) else {}),  # ours
        **_serves(workers),
    })


def _decisions_json(meta: ModelMeta) -> dict[str, Any]:
    """Ours: how /v1/systemone is served: "native" (the model file's llamaq decision keys),
    "prompted" (a text model under the worker's --decisions; it does not advertise
    "decisions" in /v1/models) or "off" (501)."""
    caps = meta.decisions
    if caps is None:
        return {"mode": "off"}
    answer: dict[str, Any] = {"mode": caps.mode, "types": caps.types,
                              "max_options": caps.max_options, "temperatures": caps.temperatures}
    if caps.family is not None:  # the spec's family the file names, and its rules
        answer["family"] = caps.family.model_dump(mode="json")
        if caps.head_tokens is not None:
            answer["head_tokens"] = caps.head_tokens
    return answer


def _serves(workers: list[WorkerInfo]) -> dict[str, Any]:
    """Ours: what the model's workers serve (completion; decisions for a model that serves only
    /v1/systemone; embedding, rerank), and their pooling
    when they embed."""
    capabilities = sorted({c for w in workers for c in w.capabilities()},
                          key=["completion", "decisions", "embedding", "rerank"].index)
    pooling = next((w.pooling for w in workers if w.embedding), None)
    return {"capabilities": capabilities, **({"pooling": pooling} if pooling else {})}


def _router_props(request: Request, settings: ApiSettings) -> dict[str, Any]:
    """`/props` of a router without `?model=`: the router's own (llama-server's shape)."""
    return {
        "role": "router",
        "max_instances": settings.models_max,
        "models_autoload": settings.models_autoload,
        "model_alias": "llama-server",
        "model_path": "none",
        "default_generation_settings": {"params": {}, "n_ctx": 0},
        "ui_settings": services(request).ui_settings,
        "build_info": llama_build_info(),
        "llamaq_version": llamaq_version(),
        "cors_proxy_enabled": settings.cors_proxy_on(),
    }


def _template_caps(settings: ApiSettings, meta: ModelMeta) -> dict[str, bool]:
    """The capabilities of the template that chat requests use (llama.cpp's caps probes)."""
    try:
        source = ChatTemplate.for_model(settings, meta).source
    except LlamaqError:  # a template that cannot be used: /props still answers
        return {}
    return chat_template_caps(source)


def _slot_json(state: SlotState, offset: int, caller: TenantScope) -> dict[str, Any]:
    """A slot as llama-server shows it; under --tenants another tenant's request's `params`
    (its grammar, stop strings, logit_bias) are left out (ours)."""
    if not caller.owns(state.tenant or ""):
        state = state.model_copy(update={"params": None})
    data = state.model_dump(exclude_none=True, exclude={"tenant"})
    data["id"] = state.id + offset
    if "params" in data:  # with the bans' -inf (null) biases, which exclude_none drops
        data["params"] = state.params.to_wire(full=False) if state.params else data["params"]
    return data
