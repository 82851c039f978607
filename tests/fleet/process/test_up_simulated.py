"""`llamaq up --simulate -np N` (issue 44): a one-command simulated fleet without -m serves
a model named `simulated`, and every view of it says the worker is simulated: /props,
/slots, /metrics, the fleet page's JSON; slot save and restore work as files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.processes import free_port, start_redis, wait_until

pytestmark = pytest.mark.process  # starts llamaq and redis-server (tests/lanes.py)


def test_up_simulate_is_a_fleet_that_says_it_is_simulated(tmp_path: Path) -> None:
    redis_process, redis_url = start_redis(tmp_path / "redis")
    port = free_port()
    env = {**os.environ, "LLAMAQ_REDIS_URL": redis_url}
    up = subprocess.Popen(
        [sys.executable, "-m", "llamaq", "up", "--simulate", "-np", "8", "--sim-itl-ms", "2",
         "--port", str(port), "--metrics", "--slot-save-path", str(tmp_path / "slots"),
         "--store-url", str(tmp_path / "store"), "--cache-dir", str(tmp_path / "cache")],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "up.log").open("w"))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: httpx.get(f"{url}/props").json().get("total_slots") == 8, 120,
                   what="llamaq up --simulate")
        props = httpx.get(f"{url}/props").json()
        assert props["simulated"] is True and props["model_alias"] == "simulated"
        assert props["model_ftype"] == "simulated"
        body = {"prompt": "one two three", "n_predict": 6, "id_slot": 2}
        first = httpx.post(f"{url}/completion", json=body, timeout=60).json()
        again = httpx.post(f"{url}/completion", json=body, timeout=60).json()
        assert first["content"] == again["content"] and first["tokens_predicted"] == 6
        assert again["timings"]["cache_n"] > 0  # the slot kept the prompt
        slots = httpx.get(f"{url}/slots").json()
        assert len(slots) == 8 and all(s["simulated"] is True for s in slots)
        metrics = httpx.get(f"{url}/metrics").text
        assert "llamaq:workers_simulated 1" in metrics
        fleet = httpx.get(f"{url}/fleet").json()
        assert [w["simulated"] for w in fleet["workers"]] == [True]
        saved = httpx.post(f"{url}/slots/2?action=save", json={"filename": "s.bin"},
                           timeout=60).json()
        assert saved["n_saved"] == first["tokens_cached"]
        restored = httpx.post(f"{url}/slots/5?action=restore", json={"filename": "s.bin"},
                              timeout=60).json()
        assert restored["n_restored"] == saved["n_saved"]
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(timeout=60)
        redis_process.terminate()
        redis_process.wait()
