"""A redis-server a test may stop and start again on the same port (outage scenarios)."""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.processes import free_port


@dataclass
class RestartableRedis:
    folder: Path
    port: int = field(default_factory=free_port)
    extra: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is needed for the tests (apt-get install redis-server)"
        self.folder.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.folder), *self.extra],
            stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                if redis.Redis.from_url(self.url).ping():
                    return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def kill(self) -> None:
        """Gone at once, with its data (no persistence)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None


@dataclass
class SentinelGroup:
    """A master, a replica and three sentinels on this machine (Debian's redis-server run with
    `--sentinel`); `url` is llamaq's Sentinel URL for them."""

    folder: Path
    master: RestartableRedis | None = None
    replica: RestartableRedis | None = None
    sentinels: list[subprocess.Popen[bytes]] = field(default_factory=list)
    sentinel_ports: list[int] = field(default_factory=list)

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/mymaster/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "redis-server is needed for the tests (apt-get install redis-server)"
        self.master = RestartableRedis(self.folder / "master")
        self.master.start()
        self.replica = RestartableRedis(self.folder / "replica", extra=(
            "--replicaof", "127.0.0.1", str(self.master.port)))
        self.replica.start()
        for n in range(3):
            port = free_port()
            config = self.folder / f"sentinel-{n}.conf"
            config.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.folder}\n"
                f"sentinel monitor mymaster 127.0.0.1 {self.master.port} 2\n"
                "sentinel down-after-milliseconds mymaster 1000\n"
                "sentinel failover-timeout mymaster 5000\n"
                "sentinel parallel-syncs mymaster 1\n")
            self.sentinels.append(subprocess.Popen([binary, str(config), "--sentinel"],
                                                   stdout=subprocess.DEVNULL))
            self.sentinel_ports.append(port)
        deadline = time.monotonic() + 20
        while not self._sentinels_see_replica():
            if time.monotonic() > deadline:
                raise TimeoutError("sentinels did not find the replica")
            time.sleep(0.2)

    def _sentinels_see_replica(self) -> bool:
        for port in self.sentinel_ports:
            try:
                replicas = redis.Redis(port=port).execute_command(
                    "SENTINEL", "REPLICAS", "mymaster")
            except redis.RedisError:
                return False
            if not replicas:
                return False
        return True

    def master_port(self) -> int:
        _host, port = redis.Redis(port=self.sentinel_ports[0]).execute_command(
            "SENTINEL", "GET-MASTER-ADDR-BY-NAME", "mymaster")
        return int(port)

    def stop(self) -> None:
        for process in self.sentinels:
            process.kill()
            process.wait()
        for node in (self.master, self.replica):
            if node is not None:
                node.kill()
