"""The --tenants file (ours; JSON): each tenant's name, keys and limits.

```json
{"tenants": [
  {"name": "alice", "keys": ["sk-alice"], "max_concurrent": 2, "requests_per_minute": 60,
   "tokens_per_minute": 20000, "priority": "interactive", "max_file_bytes": 10000000,
   "max_stored_bytes": 100000000, "default_priority": 0, "min_priority": 0,
   "weight": 1},
  {"name": "bob", "keys": ["sk-bob"], "share_cache_with": ["carol"]},
  {"name": "carol", "keys": ["sk-carol"], "share_cache_with": ["bob"]},
  {"name": "ops", "keys": ["sk-ops"], "admin": true}
]}
```

Every limit is optional (absent: none). The keys of --api-key/--api-key-file are the tenant
"default", with no limits (a file may not name a tenant "default")."""

from __future__ import annotations

import json
import re
from typing import Literal, Self

from pydantic import ConfigDict, Field, ValidationError, field_validator, model_validator

from scheduler.contract.deferred import DeferredModel
from scheduler.contract.limits import HARD_LIMITS
from storage.objects import read_object_url

DEFAULT_TENANT = "default"
PRIORITY_LOW, PRIORITY_HIGH = HARD_LIMITS["priority"]
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class Tenant(DeferredModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    keys: tuple[str, ...] = Field(min_length=1)
    admin: bool = False
    """Sees and acts on every tenant's files, batches, streams and saved slots."""
    max_concurrent: int | None = Field(default=None, ge=1)
    """Its jobs running and queued at once, fleet-wide."""
    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)
    """Prompt and generated tokens."""
    priority: Literal["interactive", "batch"] = "interactive"
    """batch: its jobs wait in the background lanes, taken only where interactive work
    leaves room (as batch lines are)."""
    max_file_bytes: int | None = Field(default=None, ge=1)
    max_stored_bytes: int | None = Field(default=None, ge=1)
    """Its files in the store (uploads and batch outputs) together."""
    default_priority: int = Field(default=0, ge=PRIORITY_LOW, le=PRIORITY_HIGH)
    """The `priority` of its requests that name none (lower is served first)."""
    min_priority: int | None = Field(default=None, ge=PRIORITY_LOW, le=PRIORITY_HIGH)
    """The lowest `priority` value (the most urgent) its requests may ask; a request below
    it is a 400 (None: any)."""

    weight: float = Field(default=1.0, ge=0.01, le=100.0)
    """Its share of a model's tokens where jobs wait, against the other tenants' weights
    (weighted fair queueing, docs/fairness.md)."""

    @model_validator(mode="after")
    def _priorities(self) -> Self:
        if self.min_priority is not None and self.default_priority < self.min_priority:
            raise ValueError("default_priority is below min_priority")
        return self
    share_cache_with: tuple[str, ...] = ()
    """The tenants whose cached prompts (slots' KV, the host cache, the KV tier, prefix
    routing) it may reuse and who may reuse its own: a cache group, named whole by each of
    its tenants (`cache_salts`). Absent: its caches are its own."""
    share_lookup_cache: bool = False
    """Its tokens may be learned into -lcd's lookup cache, whose drafts serve every tenant."""

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME_PATTERN.match(value):
            raise ValueError("a tenant's name is 1 to 64 letters, digits, '_', '.' or '-'")
        if value == DEFAULT_TENANT:
            raise ValueError(f"{DEFAULT_TENANT!r} is the tenant of --api-key's keys")
        return value

    @field_validator("keys")
    @classmethod
    def _keys(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any(not key.strip() or key != key.strip() for key in value):
            raise ValueError("a key is not empty and has no surrounding spaces")
        return value

    @property
    def limited(self) -> bool:
        return any(v is not None for v in (self.max_concurrent, self.requests_per_minute,
                                           self.tokens_per_minute))


UNLIMITED = Tenant.model_construct(name=DEFAULT_TENANT, keys=("-",), admin=False,
                                   max_concurrent=None, requests_per_minute=None,
                                   tokens_per_minute=None, priority="interactive",
                                   max_file_bytes=None, max_stored_bytes=None,
                                   default_priority=0, min_priority=None, weight=1.0,
                                   share_cache_with=(), share_lookup_cache=False)
"""The default tenant: --api-key's keys, or everyone when no key is set."""


class TenantsFile(DeferredModel):
    model_config = ConfigDict(extra="forbid")

    tenants: list[Tenant]

    @model_validator(mode="after")
    def _unique(self) -> Self:
        names = [t.name for t in self.tenants]
        if len(set(names)) != len(names):
            raise ValueError("two tenants have one name")
        keys = [k for t in self.tenants for k in t.keys]
        if len(set(keys)) != len(keys):
            raise ValueError("a key belongs to two tenants")
        cache_salts(self.tenants)
        return self


def cache_salts(tenants: list[Tenant]) -> dict[str, str]:
    """Each tenant's cache salt: the names of its cache group (itself and its
    share_cache_with), which every tenant of the group names whole (each names every other:
    a tenant that names bob is not drawn into the tenants bob shares with unless it names
    them too); ValueError otherwise."""
    by_name = {t.name: t for t in tenants}
    groups = {t.name: frozenset((t.name, *t.share_cache_with)) for t in tenants}
    for tenant in tenants:
        for other in tenant.share_cache_with:
            if other == tenant.name:
                raise ValueError(f"{tenant.name}: share_cache_with names the tenant itself")
            if other not in by_name:
                raise ValueError(f"{tenant.name}: share_cache_with names {other!r}, no tenant "
                                 "of the file")
            if groups[other] != groups[tenant.name]:
                raise ValueError(
                    f"{tenant.name} shares caches with {other}, whose share_cache_with names "
                    f"other tenants: a cache group is named whole by each of its tenants ("
                    f"{tenant.name}: {sorted(groups[tenant.name] - {tenant.name})}, {other}: "
                    f"{sorted(groups[other] - {other})})")
    return {name: "+".join(sorted(group)) for name, group in groups.items()}


def parse_tenants(raw: bytes, where: str) -> TenantsFile:
    """ValueError naming `where` and the problem."""
    try:
        return TenantsFile.model_validate(json.loads(raw))
    except json.JSONDecodeError as exc:
        raise ValueError(f"--tenants {where}: not JSON ({exc})") from None
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'file'}: {e['msg']}"
                             for e in exc.errors())
        raise ValueError(f"--tenants {where}: {problems}") from None


def read_tenants(url: str, s3_endpoint_url: str | None = None) -> TenantsFile:
    """The file at `url` (a path or `s3://bucket/key`); ValueError when unreadable or bad."""
    try:
        raw = read_object_url(url, s3_endpoint_url)
    except Exception as exc:  # any store or OS error: named, not raised raw
        raise ValueError(f"--tenants {url}: cannot be read ({type(exc).__name__}: {exc})") \
            from None
    return parse_tenants(raw, url)
