"""`GET /fleet` (ours): the model's workers with their slots and counters, and the queue depth,
for the web UI's fleet page. Needs the API key like every endpoint but the page itself."""

from __future__ import annotations

from typing import Any

from sanic import Request
from sanic.response import HTTPResponse, json

from api.endpoints.monitor.api_router import tenant_counts
from api.fleet import Fleet
from api.routing import Routes
from api.services import services
from api.settings import ApiSettings
from api.tenants.service import TenantScope
from scheduler.registry import WorkerInfo

routes = Routes("fleet_view")


@routes.get("/fleet", name="fleet")
async def fleet_status(request: Request) -> HTTPResponse:
    pod = services(request)
    settings, fleet, router = pod.settings, pod.fleet, pod.router
    model_ids = [settings.model_id()] if router is None else list(router.catalog.entries)
    out: list[dict[str, Any]] = []
    queued, oldest = 0, 0.0
    for model_id in model_ids:  # router mode: every model's workers
        workers = await fleet.workers(model_id, fresh=True)
        out += await _workers_json(fleet, settings, workers)
        queue = await fleet.queue_stats(model_id, workers)
        queued, oldest = queued + queue.depth, max(oldest, queue.oldest_s)
    return json({"model": None if router else model_ids[0], "workers": out,
                 "queued": queued, "oldest_queued_s": oldest,
                 "tenants": await _tenants_json(request)})


async def _tenants_json(request: Request) -> list[dict[str, Any]] | None:
    """Under --tenants: each tenant's counters, its jobs running and queued now, and its
    limits (the admin tenant and a server without --tenants see all; another tenant only
    itself)."""
    counts = await tenant_counts(request)
    if counts is None:
        return None
    service = services(request).tenants
    scope: TenantScope = request.ctx.tenant
    out = []
    for name, counters in sorted(counts.items()):
        if not scope.owns(name):
            continue
        tenant = service.directory.by_name(name)
        out.append({"name": name, **counters, "active": await service.limits.active(name),
                    "limits": tenant.model_dump(include={
                        "max_concurrent", "requests_per_minute", "tokens_per_minute",
                        "priority", "max_file_bytes", "max_stored_bytes", "admin",
                        "default_priority", "min_priority", "weight"})})
    return out


async def _workers_json(fleet: Fleet, settings: ApiSettings,
                        workers: list[WorkerInfo]) -> list[dict[str, Any]]:
    """One model's workers, their slots numbered fleet-wide as /slots numbers them."""
    out: list[dict[str, Any]] = []
    offset = 0
    for worker in workers:
        counters = await fleet.registry.metrics([worker.worker_id])
        slots: list[dict[str, Any]] | None = None
        if settings.slots:  # --no-slots hides slot states here as at /slots
            slots = []
            for state in await fleet.registry.slots(worker.worker_id):
                slot = state.model_dump(exclude_none=True, exclude={"params", "tenant"})
                slot["id"] = state.id + offset
                slots.append(slot)
        offset += worker.n_slots
        out.append({
            "worker_id": worker.worker_id,
            "model_id": worker.model_id,
            "model_path": worker.model_path,
            "draft_model": worker.draft_model,
            "n_slots": worker.n_slots,
            "n_ctx_slot": worker.n_ctx_slot,
            "started_at": worker.started_at,
            "fit": worker.fit.model_dump() if worker.fit else None,
            "slots": slots,
            "metrics": counters[0].model_dump() if counters else None,
        })
    return out
