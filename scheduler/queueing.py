"""How jobs travel through arq: JSON (never pickle) on the wire. The queue a job goes to is the
kind table's (scheduler/contract/kinds.py queue_for)."""

from __future__ import annotations

import json
from typing import Any


def serialize_job(data: dict[str, Any]) -> bytes:
    """A job, or arq's record of its result. A value JSON has no form for (the exception of a
    job arq could not start: its data expired, its client cancelled it) is written as its
    repr, instead of arq logging a traceback and writing "unable to serialize result"."""
    return json.dumps(data, separators=(",", ":"), default=repr).encode()


def deserialize_job(data: bytes) -> dict[str, Any]:
    decoded: dict[str, Any] = json.loads(data)
    return decoded
