"""The api pod's tenants: whose key a request carries, the limits it is held to, and what it
owns.

A request's tenant is found once, by its key (constant time over every key), and kept as the
request's `TenantScope`: in `request.ctx.tenant` and, for the code the request runs (the job
client, the batch driver's lines), in the context variable `CURRENT` (one value per task,
not shared state). The job client asks the scope to admit each job (max_concurrent and
tokens_per_minute, fleet-wide in Redis: scheduler/tenant_limits.py), to charge the job's
tokens as its events bring them, and to put a `batch` tenant's jobs in the background lanes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import AsyncIterator
from contextvars import ContextVar
from dataclasses import dataclass, field

from redis.exceptions import RedisError

from api.tenants.config import DEFAULT_TENANT, UNLIMITED, Tenant, TenantsFile, read_tenants
from scheduler.contract import tenant_keys
from scheduler.contract.errors import NotFound, PermissionDenied, RateLimited
from scheduler.contract.jobs import CompletionJob, EmbeddingJob, RerankJob
from scheduler.contract.results import (
    CompletionResult,
    DecisionResult,
    EmbeddingResult,
    EventEnvelope,
    FinalEvent,
    RerankResult,
    StartedEvent,
    TokenEvent,
)
from scheduler.job_events import AnyJob, JobEvents
from scheduler.tenant_limits import Refusal, TenantLimits

log = logging.getLogger(__name__)

CHARGE_EVERY_TOKENS = 32
"""Generated tokens charged in one write (and at the job's end)."""


class TenantDirectory:
    """Keys -> tenants: --api-key's keys are the default tenant, the --tenants file's their
    own. Re-read by `reload` (SIGHUP); a file that no longer reads keeps the tenants it had."""

    def __init__(self, api_keys: frozenset[str], url: str | None = None,
                 s3_endpoint_url: str | None = None) -> None:
        self._api_keys = api_keys
        self._url = url
        self._s3_endpoint_url = s3_endpoint_url
        self._by_name: dict[str, Tenant] = {}
        self._keys: tuple[tuple[bytes, Tenant], ...] = ()
        self._install(read_tenants(url, s3_endpoint_url) if url else TenantsFile(tenants=[]))

    @property
    def enabled(self) -> bool:
        """A --tenants file is given: resources are owned, limits apply."""
        return self._url is not None

    @property
    def auth_on(self) -> bool:
        return bool(self._api_keys) or self.enabled

    def _install(self, found: TenantsFile) -> None:
        clash = self._api_keys & {k for t in found.tenants for k in t.keys}
        if clash:
            raise ValueError("--tenants: a key of --api-key belongs to a tenant too")
        by_key = [(k.encode(), UNLIMITED) for k in sorted(self._api_keys)]
        by_key += [(k.encode(), t) for t in found.tenants for k in t.keys]
        self._keys = tuple(by_key)
        self._by_name = {t.name: t for t in found.tenants}

    def reload(self) -> bool:
        """Read the file again; False (and a logged error) when it does not read or is bad."""
        if self._url is None:
            return True
        try:
            self._install(read_tenants(self._url, self._s3_endpoint_url))
        except ValueError as exc:
            log.error("tenants not reloaded, the previous ones stay: %s", exc)
            return False
        log.info("tenants reloaded: %d", len(self._by_name))
        return True

    def by_key(self, presented: str) -> Tenant | None:
        """The tenant of a key, compared with every key in constant time (the answer's timing
        says nothing of how much of a key was right); with no key configured, the default."""
        if not self.auth_on:
            return UNLIMITED
        given = presented.encode()
        found: Tenant | None = None
        for key, tenant in self._keys:
            if hmac.compare_digest(given, key):
                found = tenant
        return found

    def by_name(self, name: str) -> Tenant:
        """A tenant by name (the owner of a batch); one the file no longer names has no
        limits."""
        if name == DEFAULT_TENANT:
            return UNLIMITED
        return self._by_name.get(name) or Tenant(name=name, keys=("-",))

    def names(self) -> list[str]:
        return [DEFAULT_TENANT, *self._by_name]


@dataclass
class TenantService:
    """The pod's tenants and their fleet-wide limits."""

    directory: TenantDirectory
    limits: TenantLimits
    _held: dict[str, dict[str, int]] = field(default_factory=dict)
    """tenant -> its jobs this pod holds a max_concurrent place for (renewed), each with how
    many holders on this pod (a request and a resume of its stream)."""

    def scope(self, tenant: Tenant, enforce: bool = True) -> TenantScope:
        return TenantScope(tenant, self, enforce)

    async def renew_forever(self) -> None:
        """Renew this pod's holds while their jobs run (a pod that dies lets go)."""
        while True:
            await asyncio.sleep(tenant_keys.TENANT_RENEW_EVERY_S)
            for tenant, job_ids in list(self._held.items()):
                try:
                    await self.limits.renew(tenant, sorted(job_ids))
                except RedisError as exc:  # Redis away: the next round retries
                    log.warning("tenant holds not renewed: %r", exc)

    def _hold(self, tenant: str, job_id: str) -> None:
        held = self._held.setdefault(tenant, {})
        held[job_id] = held.get(job_id, 0) + 1

    def _let_go(self, tenant: str, job_id: str) -> None:
        held = self._held.get(tenant)
        if held is not None and job_id in held:
            held[job_id] -= 1
            if held[job_id] <= 0:
                del held[job_id]
            if not held:
                del self._held[tenant]

    async def refused(self, tenant: Tenant, refusal: Refusal) -> RateLimited:
        await self.limits.count(tenant.name, "limited")
        return RateLimited(f"Rate limit reached for tenant {tenant.name!r}: "
                           f"{refusal.limit} (retry after {refusal.retry_after_s} s)",
                           retry_after_s=refusal.retry_after_s)


@dataclass
class TenantScope:
    """One request's (or one batch's) tenant."""

    tenant: Tenant
    service: TenantService
    enforce: bool = True
    """False for a batch's lines: their tokens count, its limits do not refuse them (the
    batch lane paces them)."""

    @property
    def name(self) -> str:
        return self.tenant.name

    @property
    def sees_all(self) -> bool:
        return self.tenant.admin or not self.service.directory.enabled

    def owns(self, owner: str) -> bool:
        return self.sees_all or owner == self.tenant.name

    def check_owner(self, owner: str, what: str) -> None:
        """Another tenant's object is a 404, as if it did not exist."""
        if not self.owns(owner):
            raise NotFound(what)

    def require_admin(self, what: str) -> None:
        """Under --tenants, what changes the fleet for every tenant (models, global LoRA
        scales, slots, server tools) is the admin tenant's: 403 `permission_error` for
        another (ours). Without --tenants every caller may, as on llama-server."""
        if not self.sees_all:
            raise PermissionDenied(f"{what} is reserved to the admin tenant (--tenants)")

    async def take_request(self) -> None:
        """One of requests_per_minute (429 when none is left); counted for /metrics."""
        await self.service.limits.count(self.name, "requests")
        if self.enforce and self.tenant.requests_per_minute:
            refusal = await self.service.limits.take_request(self.name,
                                                             self.tenant.requests_per_minute)
            if refusal is not None:
                raise await self.service.refused(self.tenant, refusal)

    @contextlib.asynccontextmanager
    async def job(self, job: AnyJob, resumed: bool = False,
                  ended: bool = False) -> AsyncIterator[TokenMeter]:
        """Admit a job (429 when over max_concurrent or out of tokens), hold its place while
        it runs, and meter its tokens.

        `resumed`: a stream's job read again (Last-Event-ID): it holds its place as the
        request did (the request's hold, kept while the stream waited for a resume, is taken
        over; a job whose place lapsed needs a free one) and meters the tokens nobody charged
        yet; an admitted generation is never refused for tokens. `ended`: its log has its
        last event already (a replay holds nothing). A job whose client left while it runs
        (handed off to a resume) keeps its hold until `let_go` (the resume's grace)."""
        tenant = self.tenant
        if not resumed and tenant.priority == "batch" and isinstance(
                job, CompletionJob | EmbeddingJob | RerankJob):
            job.background = True
        holds = self.enforce and tenant.max_concurrent is not None and not ended
        per_minute = 0 if resumed else tenant.tokens_per_minute or 0
        if self.enforce and (holds or per_minute):
            refusal = await self.service.limits.admit_job(
                self.name, job.job_id, per_minute, tenant.max_concurrent or 0 if holds else 0)
            if refusal is not None:
                raise await self.service.refused(tenant, refusal)
        if holds:
            self.service._hold(self.name, job.job_id)
        meter = TokenMeter(self, job.job_id)
        try:
            yield meter
        finally:
            release = holds and not meter.left_running

            async def settle() -> None:
                try:
                    await meter.flush()
                finally:
                    if release:
                        self.service._let_go(self.name, job.job_id)
                        await self.service.limits.release(self.name, job.job_id)
            try:
                await asyncio.shield(settle())
            except RedisError as exc:  # Redis away: the hold lapses by itself
                log.warning("tenant %s: job %s not settled: %r", self.name, job.job_id, exc)

    async def let_go(self, job_ids: list[str], resumed: bool,
                     last_events: dict[str, list[EventEnvelope]]) -> None:
        """A stream's jobs left running for a resume (`job` kept their holds): once the grace
        is over, this pod lets them go; when nobody resumed (the jobs are cancelled) their
        places are freed and the tokens their logs show (`last_events`, newest first) that
        nobody read are charged."""
        for job_id in job_ids:
            if not resumed:
                seen = max((_tokens_of(e.event) for e in last_events.get(job_id, [])),
                           default=0)
                await self.service.limits.charge_job(
                    self.name, self.tenant.tokens_per_minute or 0, job_id, seen)
            if self.enforce and self.tenant.max_concurrent is not None:
                self.service._let_go(self.name, job_id)
                if not resumed:
                    await self.service.limits.release(self.name, job_id)


def _tokens_of(event: object) -> int:
    if isinstance(event, TokenEvent):
        return event.n_prompt_tokens + event.n_decoded
    if isinstance(event, FinalEvent):
        return _final_tokens(event)
    return 0


def _final_tokens(event: FinalEvent) -> int:
    result = event.result
    if isinstance(result, CompletionResult):
        return result.tokens_evaluated + result.tokens_predicted
    if isinstance(result, EmbeddingResult | RerankResult):
        return result.n_tokens
    if isinstance(result, DecisionResult):
        return result.tokens_decoded
    return 0


class TokenMeter:
    """A job's tokens as its events bring them: the prompt as soon as it is known, then the
    output every CHARGE_EVERY_TOKENS tokens, the rest at the end. Each token is charged once
    fleet-wide (the job's count in Redis, scheduler/tenant_limits.py `charge_job`): a resume
    that reads the job's events again charges only what nobody charged."""

    def __init__(self, scope: TenantScope, job_id: str) -> None:
        self._scope = scope
        self._job_id = job_id
        self._prompt = 0
        self._decoded = 0
        self._final = 0
        self.charged = 0
        self.events: JobEvents | None = None
        """The events it meters (set by the job client): whether its client left."""

    @property
    def left_running(self) -> bool:
        """The job runs on for a resume after its reader left (its hold stays)."""
        return self.events is not None and self.events.handed_off \
            and not self.events.finished

    @property
    def seen(self) -> int:
        return max(self._prompt + self._decoded, self._final)

    async def on_event(self, event: TokenEvent | FinalEvent | StartedEvent) -> None:
        if isinstance(event, TokenEvent):
            first = not self._prompt and event.n_prompt_tokens
            self._prompt = max(self._prompt, event.n_prompt_tokens)
            self._decoded = max(self._decoded, event.n_decoded)
            if first or self.seen - self.charged >= CHARGE_EVERY_TOKENS:
                await self.flush()
        elif isinstance(event, FinalEvent):
            self._final = _final_tokens(event)
            await self.flush()

    async def flush(self) -> None:
        seen = self.seen
        if seen > self.charged:
            self.charged = seen
            await self._scope.service.limits.charge_job(
                self._scope.name, self._scope.tenant.tokens_per_minute or 0, self._job_id,
                seen)


CURRENT: ContextVar[TenantScope | None] = ContextVar("llamaq_tenant", default=None)
"""The tenant whose request (or batch) the running task serves."""
