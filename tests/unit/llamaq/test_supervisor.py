"""`llamaq up`'s supervisor with plain processes: restarts with backoff, stops whole."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from llamaq.supervisor import Supervisor, exit_reason

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_exit_reasons() -> None:
    assert exit_reason(-signal.SIGKILL) == "killed by SIGKILL"
    assert exit_reason(3) == "exit status 3"


@pytest.mark.process
def test_a_dead_worker_is_restarted_with_backoff(caplog: pytest.LogCaptureFixture) -> None:
    supervisor = Supervisor(drain_timeout_s=1)
    api = supervisor.start("api", SLEEPER, dict(os.environ))
    worker = supervisor.start("worker", SLEEPER, dict(os.environ), restart=True)
    worker.backoff_s = 0.2
    try:
        first_pid = worker.process.pid
        worker.process.kill()
        worker.process.wait()
        assert supervisor._tick()
        assert "worker died (killed by SIGKILL); restarting it in 0.2 s" in caplog.text
        assert worker.backoff_s == pytest.approx(0.4)  # the next death waits longer
        deadline = time.monotonic() + 5
        while worker.process.pid == first_pid and time.monotonic() < deadline:
            assert supervisor._tick()
            time.sleep(0.05)
        assert worker.process.pid != first_pid and worker.process.poll() is None
        assert api.process.poll() is None  # the api stays up
    finally:
        supervisor.stop_all()
    assert api.process.poll() is not None and worker.process.poll() is not None


@pytest.mark.process
def test_a_dead_api_stops_everything() -> None:
    supervisor = Supervisor(drain_timeout_s=1)
    api = supervisor.start("api", [sys.executable, "-c", "raise SystemExit(2)"],
                           dict(os.environ))
    worker = supervisor.start("worker", SLEEPER, dict(os.environ), restart=True)
    api.process.wait()
    started = time.monotonic()
    assert supervisor.run() == 1
    assert worker.process.poll() is not None
    assert time.monotonic() - started < 3


@pytest.mark.process
def test_sighup_goes_to_the_api(tmp_path: Path) -> None:
    """`llamaq up` hands SIGHUP to its api pod (which reads --tenants again); a worker does
    not get it."""
    marker = f"{tmp_path}/hup"
    catcher = [sys.executable, "-c",
               "import signal, time, pathlib\n"
               f"signal.signal(signal.SIGHUP, lambda *_: pathlib.Path({marker!r}).touch())\n"
               f"pathlib.Path({marker!r} + '.ready').touch()\n"
               "time.sleep(60)"]
    supervisor = Supervisor(drain_timeout_s=1)
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGHUP, signal.SIGINT,
                                                      signal.SIGTERM)}
    api = supervisor.start("api", catcher, dict(os.environ))
    worker = supervisor.start("worker", SLEEPER, dict(os.environ), restart=True)
    try:
        supervisor.handle_signals()
        deadline = time.monotonic() + 10
        while not os.path.exists(marker + ".ready") and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGHUP)
        while not os.path.exists(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.path.exists(marker)
        assert api.process.poll() is None and worker.process.poll() is None
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        supervisor.stop_all()
