"""A worker starved of CPU past its job's lease (SIGSTOP for longer than JOB_LEASE_S, then
SIGCONT), not dead: its stream ends with its whole text, no token lost or twice, and no error,
never a hang. While it is stopped its lease lapses; once it runs again it finds the lease gone,
stops that run and sends nothing more for it (worker/wires/fenced_write.py), and the job, left
in its queue (worker/process/arq_worker.py finish_job), continues from its event log. Real
Redis, a real api and a real simulated worker process, a real HTTP stream."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from scheduler.contract import keys
from tests.fleet.faults.test_faults_simulated import expected_text
from tests.processes import Fleet, wait_until

N_PREDICT = 40
PROMPT = "a starved worker tells its tale"


def stream(url: str, seen: dict[str, Any], tokens: threading.Event) -> None:
    try:
        with httpx.stream("POST", f"{url}/completion", json={
                "prompt": PROMPT, "n_predict": N_PREDICT, "stream": True}, timeout=60) as response:
            for line in response.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = json.loads(line.removeprefix("data: "))
                if "error" in data:
                    seen["error"] = data["error"]
                seen["text"] += data.get("content", "")
                seen["events"] += 1
                if seen["events"] >= 5:
                    tokens.set()
                if data.get("stop"):
                    seen["final"] = data
    except Exception as error:  # recorded: the test asserts there is none
        seen["error"] = repr(error)
    finally:
        tokens.set()


def test_a_worker_stopped_past_its_lease_ends_its_stream_whole(
        redis_url: str, tmp_path: Path) -> None:
    fleet = Fleet(redis_url, tmp_path, ["-m", "simulated", "--store-url", str(tmp_path / "store"),
                                        "--cache-dir", str(tmp_path / "cache")],
                  logs=tmp_path / "logs")
    try:
        # one slot: the stopped run holds it, so the job's next run starts only after it ended
        worker = fleet.add_worker("--simulate", "--sim-workers", "1", "-np", "1",
                                  "--sim-itl-ms", "100", "--sim-eos-tokens", "1000",
                                  "--poll-delay", "0.2")
        url = fleet.add_api()
        wait_until(lambda: httpx.get(f"{url}/props").json().get("total_slots") == 1, 120,
                   what="the simulated worker")
        seen: dict[str, Any] = {"text": "", "final": None, "error": None, "events": 0}
        tokens = threading.Event()
        client = threading.Thread(target=stream, args=(url, seen, tokens))
        client.start()
        assert tokens.wait(60), "no tokens"
        worker.send_signal(signal.SIGSTOP)
        time.sleep(keys.JOB_LEASE_S + 2)
        worker.send_signal(signal.SIGCONT)
        client.join(90)
        assert not client.is_alive(), "the stream hangs"
        assert seen["error"] is None, seen["error"]
        assert seen["final"] is not None, f"no final event after {seen['text']!r}"
        assert seen["text"] == expected_text(PROMPT, N_PREDICT)
        assert seen["final"]["tokens_predicted"] == N_PREDICT
    finally:
        fleet.stop()
