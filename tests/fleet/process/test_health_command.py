"""`llamaq health`, the containers' healthcheck: a worker's heartbeat, an api's /health."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import cast

import pytest
import redis

from scheduler.contract import keys
from tests.processes import free_port

pytestmark = pytest.mark.process  # starts llamaq or redis-server (tests/lanes.py)


def health(*args: str, redis_url: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LLAMAQ_REDIS_URL": redis_url or "redis://127.0.0.1:1/0"}
    return subprocess.run([sys.executable, "-m", "llamaq", "health", *args], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def live_worker_id(redis_url: str) -> str:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    worker_ids = cast(list[str], client.zrange(keys.model_workers("gemma"), 0, 0))
    assert worker_ids and client.exists(keys.worker_info(worker_ids[0]))
    return worker_ids[0]


def test_worker_heartbeat(redis_url: str, api: str, tmp_path: Path) -> None:
    worker_id = live_worker_id(redis_url)
    assert health("--worker", worker_id, redis_url=redis_url).returncode == 0
    id_file = tmp_path / "worker-id"
    id_file.write_text(worker_id + "\n")
    assert health("--worker-file", str(id_file), redis_url=redis_url).returncode == 0

    gone = health("--worker", "no-such-worker", redis_url=redis_url)
    assert gone.returncode == 1
    assert "worker no-such-worker: no heartbeat" in gone.stderr
    unreachable = health("--worker", worker_id, redis_url=f"redis://127.0.0.1:{free_port()}/0")
    assert unreachable.returncode == 1 and "redis:" in unreachable.stderr
    missing = health("--worker-file", str(tmp_path / "absent"), redis_url=redis_url)
    assert missing.returncode == 1 and "absent" in missing.stderr


def test_url(api: str) -> None:
    assert health("--url", f"{api}/health").returncode == 0
    not_found = health("--url", f"{api}/no-such-page")
    assert not_found.returncode == 1 and "HTTP 404" in not_found.stderr
    closed = health("--url", f"http://127.0.0.1:{free_port()}/health")
    assert closed.returncode == 1


def test_needs_one_target() -> None:
    assert health().returncode == 2
