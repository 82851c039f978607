"""Cache-aware routing on a real fleet (issue 12): two workers of the tiny model, real Redis,
real HTTP. A prompt that begins like what a worker holds goes to that worker and reuses its
cache; a routed job that its worker does not take (stopped, killed) still runs elsewhere,
under the lease rules of issue 7."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import make_fleet
from tests.faults import slots_of
from tests.processes import Fleet, wait_until

ONE_SLOT = ("-c", "4096", "-np", "1", "-t", "1", "-n", "4")
SYSTEM = ("You are the help desk of a small harbour. Answer in one sentence, politely, and "
          "name the pier. ") * 12  # ~1100 characters, more than the default --prefix-affinity


@dataclass
class TwoWorkers:
    fleet: Fleet
    api: str
    first: subprocess.Popen[bytes]
    """Fleet slot 0 (registered first)."""
    second: subprocess.Popen[bytes]
    """Fleet slot 1."""


def two_workers(redis_url: str, workdir: Path, model: Path, alias: str,
                worker_flags: tuple[str, ...] = ONE_SLOT) -> TwoWorkers:
    fleet = make_fleet(redis_url, workdir, model, alias)
    first = fleet.add_worker(*worker_flags)
    api = fleet.add_api()
    fleet.wait_healthy(api)
    second = fleet.add_worker(*worker_flags)
    wait_until(lambda: len(slots_of(api)) == 2, timeout=60, what="the second worker")
    return TwoWorkers(fleet, api, first, second)


@pytest.fixture(scope="module")
def pair(redis_url: str, workdir: Path, tiny_model_path: Path) -> Iterator[TwoWorkers]:
    workers = two_workers(redis_url, workdir, tiny_model_path, "tiny-affinity")
    yield workers
    for process in (workers.first, workers.second):
        if process.poll() is None:
            os.kill(process.pid, signal.SIGCONT)
    workers.fleet.stop()


def ask(api: str, question: str, **extra: object) -> dict[str, object]:
    response = httpx.post(f"{api}/completion", json={"prompt": f"{SYSTEM}\nQ: {question}\nA:",
                                                     **extra}, timeout=120)
    assert response.status_code == 200, response.text
    body: dict[str, object] = response.json()
    return body


def api_log(fleet: Fleet) -> str:
    return "".join(p.read_text(errors="replace") for p in fleet.logs.glob("api-*.log"))


def test_questions_behind_one_long_system_prompt_stay_on_the_worker_that_holds_it(
        pair: TwoWorkers) -> None:
    first = ask(pair.api, "Where is the ferry to the island?")
    home = first["id_slot"]
    questions = ["How much is a ticket?", "Is there a cafe?", "When do boats leave?",
                 "Can I bring a bicycle?", "Where do I park?", "Is the pier open at night?"]
    for question in questions:
        answer = ask(pair.api, question)
        assert answer["id_slot"] == home, "the request left the worker holding its prefix"
        timings = answer["timings"]
        assert isinstance(timings, dict)
        assert timings["cache_n"] > 0.8 * (timings["cache_n"] + timings["prompt_n"])


def test_a_routed_job_whose_worker_stalls_runs_on_the_other_worker(pair: TwoWorkers) -> None:
    """The worker holding the prefix is stopped (SIGSTOP: alive in the registry, taking
    nothing): the job routed to it moves to the shared queue and the other worker answers."""
    home = ask(pair.api, "Where is the ferry to the island?")["id_slot"]
    stalled = pair.first if home == 0 else pair.second
    os.kill(stalled.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        answer = ask(pair.api, "Is the harbour open on Sunday?")
        took = time.monotonic() - started
    finally:
        os.kill(stalled.pid, signal.SIGCONT)
    assert answer["id_slot"] != home
    assert took < 10, f"{took:.1f} s"
    assert "moved to the shared queue" in api_log(pair.fleet)


def test_a_routed_job_whose_worker_dies_before_it_sent_anything_runs_again_elsewhere(
        redis_url: str, workdir: Path, tiny_model_path: Path) -> None:
    """Issue 7's rule holds for routed jobs: the worker holding the prefix is killed while it
    runs the (non-stream: nothing sent yet) job; the job runs again on the other worker, from
    the shared queue (nobody polls the dead worker's queue)."""
    workers = two_workers(redis_url, workdir, tiny_model_path, "tiny-affinity-kill")
    try:
        home = ask(workers.api, "Where is the ferry to the island?")["id_slot"]
        victim = workers.first if home == 0 else workers.second
        long_answer = {"n_predict": 1500, "ignore_eos": True}
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            pending = pool.submit(ask, workers.api, "Tell me everything.", **long_answer)
            wait_until(lambda: any(s["is_processing"] for s in slots_of(workers.api)),
                       what="the routed job running")
            busy = [s["id"] for s in slots_of(workers.api) if s["is_processing"]]
            assert busy == [home], "the job did not go to the worker holding its prefix"
            victim.kill()
            answer = pending.result(timeout=120)
        survivor = workers.second if victim is workers.first else workers.first
        index = workers.fleet.processes.index(survivor)
        survivor_log = (workers.fleet.logs / f"worker-{index}.log").read_text(errors="replace")
        assert "running it again on worker" in survivor_log
        assert answer["tokens_predicted"] == 1500
        assert "moved to the shared queue" in api_log(workers.fleet)
    finally:
        workers.fleet.stop()
