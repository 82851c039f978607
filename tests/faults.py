"""Clients and process helpers for the fault tests and bench/faults.py: streams that record
when they started and how they ended."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class StreamRecord:
    """One streamed completion as its client saw it."""

    status: int = 0
    tokens: int = 0
    first_token_at: float | None = None
    ended_at: float | None = None
    final: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    failure: str | None = None
    """A transport failure (connection cut, timeout): what must never happen."""
    started: threading.Event = field(default_factory=threading.Event)
    content: str = ""
    """The text of its token events, in order."""
    max_gap_s: float = 0.0
    """The longest time between two of its token events (a migration's stall)."""
    max_gap_end_at: float | None = None
    """When the token that ended that longest gap came (time.monotonic())."""
    last_token_at: float | None = None
    token_ids: list[int] = field(default_factory=list)
    """The tokens of its token events, in order."""
    event_id: str | None = None
    """The SSE `id:` of its last event (`<stream record>-<counts>`: names its jobs)."""

    @property
    def outcome(self) -> str:
        if self.final is not None:
            return "answered"
        if self.error is not None:
            return "errored"
        return "lost"


def stream(api: str, body: dict[str, Any], record: StreamRecord, timeout: float = 120) -> None:
    """Run one streamed /completion into `record` (meant for a thread)."""
    try:
        with httpx.stream("POST", f"{api}/completion", json={**body, "stream": True},
                          timeout=timeout) as response:
            record.status = response.status_code
            if response.status_code != 200:
                record.error = json.loads(response.read()).get("error")
                return
            for line in response.iter_lines():
                if line.startswith("id: "):
                    record.event_id = line.removeprefix("id: ")
                if not line.startswith("data: "):
                    continue
                data = json.loads(line.removeprefix("data: "))
                if "error" in data:
                    record.error = data["error"]
                elif data.get("stop"):
                    record.final = data
                else:
                    record.tokens += 1
                    record.content += data.get("content", "")
                    record.token_ids += data.get("tokens", [])
                    now = time.monotonic()
                    if record.last_token_at is not None \
                            and now - record.last_token_at > record.max_gap_s:
                        record.max_gap_s, record.max_gap_end_at = now - record.last_token_at, now
                    record.last_token_at = now
                    if record.first_token_at is None:
                        record.first_token_at = time.monotonic()
                        record.started.set()
    except httpx.HTTPError as error:
        record.failure = repr(error)
    finally:
        record.ended_at = time.monotonic()
        record.started.set()


def start_streams(api: str, bodies: list[dict[str, Any]]) -> tuple[list[StreamRecord],
                                                                    list[threading.Thread]]:
    records = [StreamRecord() for _ in bodies]
    threads = [threading.Thread(target=stream, args=(api, body, record), daemon=True)
               for body, record in zip(bodies, records, strict=True)]
    for thread in threads:
        thread.start()
    return records, threads


def slots_of(api: str) -> list[dict[str, Any]]:
    return list(httpx.get(f"{api}/slots", timeout=10).json())


def processing(api: str) -> int:
    return sum(1 for s in slots_of(api) if s["is_processing"])


def children_of(pid: int) -> list[int]:
    """Pids of the direct children of `pid` (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as file:
            return [int(p) for p in file.read().split()]
    except FileNotFoundError:
        return []


def descendants_of(pid: int) -> list[int]:
    found: list[int] = []
    for child in children_of(pid):
        found += [child, *descendants_of(child)]
    return found


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie waiting for its parent counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as file:
            return file.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
