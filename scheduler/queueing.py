"""How jobs travel through arq: JSON (never pickle) on the wire. The queue a job goes to is the
kind table's (scheduler/contract/kinds.py queue_for)."""

from __future__ import annotations

import json
from typing import Any


def serialize_job(data: dict[str, Any]) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


def deserialize_job(data: bytes) -> dict[str, Any]:
    decoded: dict[str, Any] = json.loads(data)
    return decoded
