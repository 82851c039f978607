"""Ours: `GET /fleet`, the model's workers with their slots and counters, and the queue depth,
for the fleet page (it needs the API key like every endpoint but the page itself), which a
browser's navigation to `/fleet` gets (`page.html`; not with --no-ui);
`GET /fleet/metrics`, the per-model series of every model the pod knows, for Prometheus
(api/endpoints/monitor/model_series.py); `GET /ready`, the pod's readiness (no key).

`/ready` means "this pod can take requests": Redis answers and the pod is not draining (503
then, from the middleware), with or without workers: a request for a model with no worker is
held while one starts (api/cold_start.py). llama-server's `/health` keeps its meaning for the
clients that read it: 200 once a worker of the model serves (503 "Loading model" before). A
Kubernetes readiness probe reads `/ready`: on `/health` an api pod of a model scaled to zero
would leave its Service, and no request could arrive to wake a worker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from redis.exceptions import RedisError
from sanic import Request
from sanic.response import HTTPResponse, json, raw

from api.endpoints.monitor.api_router import tenant_counts
from api.endpoints.monitor.metrics import CONTENT_TYPE, tenant_lines
from api.endpoints.monitor.model_series import model_lines, model_series
from api.endpoints.ui.api_router import send, wants_page
from api.endpoints.ui.bundle import REVALIDATE, static_file
from api.fleet import Fleet
from api.routing import Routes
from api.services import services
from api.settings import ApiSettings
from api.tenants.service import TenantScope
from scheduler.contract.errors import NotSupported, RedisUnreachable
from scheduler.registry import WorkerInfo

routes = Routes("fleet_view")
PAGE = static_file("fleet.html", (Path(__file__).parent / "page.html").read_bytes(), REVALIDATE)


@routes.get("/ready", name="ready")
async def ready(request: Request) -> HTTPResponse:
    try:
        await services(request).fleet.redis.ping()  # type: ignore[misc]
    except RedisError:
        raise RedisUnreachable() from None
    return json({"status": "ok"})


@routes.get("/fleet/metrics", name="fleet_metrics")
async def fleet_metrics(request: Request) -> HTTPResponse:
    """`llamaq:redis_up` 1 and the series of every model; 0 alone when Redis is away."""
    pod = services(request)
    if not pod.settings.metrics:
        raise NotSupported(
            "This server does not support metrics endpoint. Start it with `--metrics`")
    up = ["# HELP llamaq:redis_up Whether this api pod reaches Redis.",
          "# TYPE llamaq:redis_up gauge"]
    model_ids = _model_ids(request)
    try:
        items = [await model_series(pod.fleet, m) for m in model_ids]
        tenants = await tenant_counts(request)
    except RedisError:
        return raw("\n".join([*up, "llamaq:redis_up 0"]) + "\n", content_type=CONTENT_TYPE)
    lines = [*up, "llamaq:redis_up 1", *model_lines(items),
             *pod.fleet.latency.lines(model_ids)]
    if tenants is not None:
        lines += tenant_lines(tenants)
    return raw("\n".join(lines) + "\n", content_type=CONTENT_TYPE)


def _model_ids(request: Request) -> list[str]:
    """The pod's model, or a router's catalog (its names, in order)."""
    pod = services(request)
    if pod.router is None:
        return [pod.settings.model_id()]
    return sorted(pod.router.catalog.entries)


@routes.get("/fleet", name="fleet", ctx_page=True)
async def fleet_status(request: Request) -> HTTPResponse:
    pod = services(request)
    if pod.settings.ui and wants_page(request):
        return await send(request, PAGE, page=True)
    settings, fleet, router = pod.settings, pod.fleet, pod.router
    model_ids = [settings.model_id()] if router is None else list(router.catalog.entries)
    out: list[dict[str, Any]] = []
    queued, oldest, preempted = 0, 0.0, 0
    for model_id in model_ids:  # router mode: every model's workers
        workers = await fleet.workers(model_id, fresh=True)
        out += await _workers_json(fleet, settings, workers)
        queue = await fleet.queue_stats(model_id, workers)
        queued, oldest = queued + queue.depth, max(oldest, queue.oldest_s)
        preempted += queue.preempted
    return json({"model": None if router else model_ids[0], "workers": out,
                 "queued": queued, "oldest_queued_s": oldest, "preempted": preempted,
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
        out.append({"name": name, **counters, "priorities": priorities_json(counters),
                    "active": await service.limits.active(name),
                    "limits": tenant.model_dump(include={
                        "max_concurrent", "requests_per_minute", "tokens_per_minute",
                        "priority", "max_file_bytes", "max_stored_bytes", "admin",
                        "default_priority", "min_priority", "weight"})})
    return out


def priorities_json(counters: dict[str, int]) -> list[dict[str, Any]]:
    """A tenant's waits and preemptions per priority (docs/fairness.md), from its counters'
    `waited_ms@<p>`, `started@<p>`, `preempted@<p>`: the completions that started, their
    wait in the queues (total and mean, seconds) and the times they gave their slot up."""
    found: dict[int, dict[str, int]] = {}
    for key, value in counters.items():
        what, _, priority = key.partition("@")
        if priority and what in ("waited_ms", "started", "preempted"):
            found.setdefault(int(priority), {})[what] = value
    return [{"priority": priority, "started": c.get("started", 0),
             "waited_s": c.get("waited_ms", 0) / 1000,
             "mean_wait_s": c.get("waited_ms", 0) / 1000 / max(c.get("started", 0), 1),
             "preempted": c.get("preempted", 0)}
            for priority, c in sorted(found.items())]


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
            "simulated": worker.simulated,
            "fit": worker.fit.model_dump() if worker.fit else None,
            "slots": slots,
            "metrics": counters[0].model_dump() if counters else None,
        })
    return out
