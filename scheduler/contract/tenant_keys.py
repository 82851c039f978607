"""The Redis keys of --tenants: fleet-wide limits and counters (scheduler/tenant_limits.py);
the rest of llamaq's keys are in scheduler/contract/keys.py."""

from __future__ import annotations

from scheduler.contract.keys import PREFIX


def tenant_requests(tenant: str) -> str:
    """Hash `level`, `at_ms`: the tenant's requests_per_minute bucket (refilled by Redis TIME)."""
    return f"{PREFIX}:tenant:{tenant}:requests"


def tenant_tokens(tenant: str) -> str:
    """Hash `level`, `at_ms`: the tenant's tokens_per_minute bucket (prompt and generated
    tokens charged as they are known; it may go below zero: a debt paid by waiting)."""
    return f"{PREFIX}:tenant:{tenant}:tokens"


def tenant_active(tenant: str) -> str:
    """Sorted set of the tenant's running and queued jobs (score: when its hold lapses, ms of
    Redis TIME), for max_concurrent; the api pod waiting for a job renews its hold."""
    return f"{PREFIX}:tenant:{tenant}:active"


def tenant_job_charged(job_id: str) -> str:
    """String: how many of the job's tokens (prompt and output) are charged to its tenant
    already, so that whoever reads its events (the request's pod, a resume's, the pod that
    let an abandoned stream go) charges each token once."""
    return f"{PREFIX}:tenant:job:{job_id}:charged"


def tenant_uploads(tenant: str) -> str:
    """Sorted set of the tenant's uploads in flight, `<file id>:<bytes>` (score: when the
    reservation lapses, ms of Redis TIME), so that uploads that arrive together count each
    other against max_stored_bytes."""
    return f"{PREFIX}:tenant:{tenant}:uploads"


TENANT_UPLOAD_HOLD_S = 3600.0
"""How long an upload's reservation lasts at most (a pod that died mid-upload lets go)."""
TENANT_COUNTERS = f"{PREFIX}:tenants:counters"
"""Hash of per-tenant counters: `tokens:<tenant>`, `requests:<tenant>`, `limited:<tenant>`; per
priority `waited_ms:`, `started:`, `preempted:<tenant>:<priority>` (/metrics, the fleet page)."""
TENANT_BUCKET_TTL_S = 120
"""A bucket untouched this long is full again: it expires."""
TENANT_HOLD_S = 30.0
"""How long a job's max_concurrent hold lasts without renewal (a pod that died lets go)."""
TENANT_RENEW_EVERY_S = 10.0
