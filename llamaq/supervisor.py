"""`llamaq up`'s process supervision: restart a dead worker with backoff (and say why it
died), stop everything whole on SIGTERM/SIGINT, hand SIGHUP to the api pod (it reads its
--tenants file again)."""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from dataclasses import dataclass, field

from llamaq.pdeathsig import die_with_parent

log = logging.getLogger(__name__)

BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
HEALTHY_AFTER_S = 60.0
"""A worker that ran this long before dying restarts after the first backoff again."""
KILL_AFTER_S = 5.0
"""How long past the drain timeout a child may take to exit before SIGKILL."""
TICK_S = 0.1


@dataclass
class Child:
    name: str
    command: list[str]
    process: subprocess.Popen[bytes]
    env: dict[str, str] | None = None
    restart: bool = False
    started_at: float = field(default_factory=time.monotonic)
    backoff_s: float = BACKOFF_FIRST_S
    restart_at: float | None = None


def exit_reason(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


class Supervisor:
    def __init__(self, drain_timeout_s: float) -> None:
        self._drain_timeout_s = drain_timeout_s
        self._children: list[Child] = []
        self._stopping = False

    def handle_signals(self) -> None:
        def stop(*_: object) -> None:
            self._stopping = True

        def hang_up(*_: object) -> None:
            for child in self._children:
                if child.name == "api" and child.process.poll() is None:
                    child.process.send_signal(signal.SIGHUP)

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGHUP, hang_up)

    def adopt(self, child: Child) -> None:
        self._children.append(child)

    def start(self, name: str, command: list[str], env: dict[str, str],
              restart: bool = False) -> Child:
        child = Child(name, command, self._spawn(command, env), env, restart)
        self._children.append(child)
        return child

    @staticmethod
    def _spawn(command: list[str], env: dict[str, str] | None) -> subprocess.Popen[bytes]:
        return subprocess.Popen(command, env=env, preexec_fn=die_with_parent)

    def run(self) -> int:
        """Supervise until a signal (exit status 0) or until a child that is not restarted
        dies (1); then stop everything."""
        status = 0
        while not self._stopping:
            if not self._tick():
                status = 1
                break
            time.sleep(TICK_S)
        self.stop_all()
        return status

    def _tick(self) -> bool:
        now = time.monotonic()
        for child in self._children:
            if child.restart_at is not None:
                if now >= child.restart_at:
                    log.info("restarting %s", child.name)
                    child.process = self._spawn(child.command, child.env)
                    child.started_at, child.restart_at = now, None
                continue
            code = child.process.poll()
            if code is None:
                continue
            if not child.restart:
                log.error("%s stopped (%s); stopping everything", child.name, exit_reason(code))
                return False
            if now - child.started_at >= HEALTHY_AFTER_S:
                child.backoff_s = BACKOFF_FIRST_S
            log.error("%s died (%s); restarting it in %.1f s", child.name, exit_reason(code),
                      child.backoff_s)
            child.restart_at = now + child.backoff_s
            child.backoff_s = min(child.backoff_s * 2, BACKOFF_MAX_S)
        return True

    def stop_all(self) -> None:
        """SIGTERM to api and workers together (they drain), then Redis; SIGKILL for any that
        outlive the drain timeout."""
        log.info("stopping")
        services = [c for c in self._children if c.name != "redis"]
        self._stop(services, self._drain_timeout_s + KILL_AFTER_S)
        self._stop([c for c in self._children if c.name == "redis"], KILL_AFTER_S)

    @staticmethod
    def _stop(children: list[Child], grace_s: float) -> None:
        started = time.monotonic()
        for child in children:
            if child.process.poll() is None:
                child.process.terminate()
        for child in children:
            try:
                child.process.wait(timeout=max(0.0, started + grace_s - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in %.0f s; killing it", child.name, grace_s)
                child.process.kill()
                child.process.wait()
            log.info("%s stopped after %.1f s", child.name, time.monotonic() - started)
