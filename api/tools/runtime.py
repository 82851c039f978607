"""Where a call's tools run: the `x-tool-runtime` header, else --tools-runtime, else the pod's
host (llama-server's `make_tools_io` and `server_tools_runtime`).

- `docker-container:ID`, `podman-container:ID`: a running container (the id is checked: one
  that starts with `-` would be an option of the engine);
- `docker:IMAGE`, `podman:IMAGE` (--tools-runtime only): one container per pod, spawned at
  start (`<engine> run --rm -i IMAGE sh`, kept alive by its open stdin), respawned if it dies,
  removed when the pod stops;
- `ssh:TARGET`: a remote POSIX host over ssh, key-based authentication and a trusted host key
  required (api/tools/ssh_io.py); a target that is not ssh's `[user@]host` (one starting with
  `-` would be an option of ssh) is refused as llama-server refuses it.
Anything else is refused: a call never falls back to the host when it asked for an isolate."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import tempfile
from dataclasses import dataclass

from api.tools.container_io import ContainerIO
from api.tools.errors import ToolRuntimeError, ToolRuntimeForbidden
from api.tools.host_io import HostIO
from api.tools.paths import Confinement
from api.tools.ssh_io import SshIO
from api.tools.tools_io import ToolsIO

log = logging.getLogger(__name__)

ENGINES = ("docker", "podman")
CONTAINER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
SSH_TARGET = re.compile(r"[A-Za-z0-9._@][A-Za-z0-9._@-]*")
SPAWN_WAIT_S = 10.0
STOP_WAIT_S = 3.0


@dataclass(frozen=True)
class ContainerSpec:
    engine: str
    arg: str  # an image when spawning, a container id when attaching
    attach: bool


def parse_container(spec: str) -> ContainerSpec | None:
    for engine in ENGINES:
        if spec.startswith(f"{engine}-container:"):
            return ContainerSpec(engine, spec[len(engine) + 11:], True)
        if spec.startswith(f"{engine}:"):
            return ContainerSpec(engine, spec[len(engine) + 1:], False)
    return None


def make_io(runtime: str, cwd: str, confinement: Confinement,
            ssh_config: str | None = None) -> ToolsIO:
    """The IO of one call (ToolRuntimeError: a 500, as llama-server answers); `ssh_config`:
    the ssh runtime's config file (--tools-ssh-config), else ssh's own."""
    if not runtime:
        return HostIO(cwd, confinement)
    container = parse_container(runtime)
    if container is not None:
        if not container.attach:  # spawning belongs to --tools-runtime, a call only attaches
            raise ToolRuntimeError(f"tool runtime must name a running container: {runtime}")
        if not CONTAINER_ID.fullmatch(container.arg):
            raise ToolRuntimeError(f"invalid container id: {container.arg}")
        return ContainerIO(container.engine, container.arg, cwd)
    if runtime.startswith("ssh:"):
        target = runtime[4:]
        if not SSH_TARGET.fullmatch(target) or target.startswith("-"):
            raise ToolRuntimeError(f"invalid ssh target: {target}")
        return SshIO(target, cwd, ssh_config)
    raise ToolRuntimeError(f"unknown tool runtime: {runtime}")


def check_header_runtime(header: str, configured: str, owned: str,
                         allow: list[str]) -> None:
    """ours: a caller's `x-tool-runtime` may name only the runtime the operator set
    (--tools-runtime, or the container it spawned: `owned`) or one --tools-runtime-allow lists
    (an entry ending in `*` is a prefix); anything else is ToolRuntimeForbidden, before the
    header is even parsed."""
    if not header or header in (configured, owned):
        return
    for entry in allow:
        if header == entry or (entry.endswith("*") and header.startswith(entry[:-1])):
            return
    raise ToolRuntimeForbidden(f"tool runtime not allowed: {header} (the operator's "
                               "--tools-runtime-allow does not list it)")


def check_runtime_flag(spec: str) -> None:
    """--tools-runtime at start: a bad one stops the pod (ValueError)."""
    container = parse_container(spec)
    if container is not None and not container.attach:
        if not container.arg:
            raise ValueError(f"--tools-runtime {container.engine}:<image> requires an image "
                             "name")
        return
    try:
        make_io(spec, "", Confinement())
    except ToolRuntimeError as exc:
        raise ValueError(f"--tools-runtime: {exc}") from None


class OwnedContainer:
    """The container of `--tools-runtime docker:IMAGE` / `podman:IMAGE`: one per pod."""

    def __init__(self, engine: str, image: str) -> None:
        self.engine, self.image = engine, image
        self.container_id = ""
        self.proc: asyncio.subprocess.Process | None = None
        self.lock = asyncio.Lock()

    async def spec(self) -> str:
        """`<engine>-container:<id>` of a running container (respawned if it died)."""
        async with self.lock:
            if self.proc is None or self.proc.returncode is not None:
                if self.proc is not None:
                    log.warning("%s tools runtime container %s died, respawning", self.engine,
                                self.container_id)
                await self._spawn()
            return f"{self.engine}-container:{self.container_id}"

    async def _spawn(self) -> None:
        fd, cidfile = tempfile.mkstemp(prefix="llamaq-tools-cid-")
        os.close(fd)
        os.unlink(cidfile)  # the engine refuses a cidfile that exists
        try:
            self.proc = await asyncio.create_subprocess_exec(
                self.engine, "run", "--rm", "-i", "--cidfile", cidfile, self.image, "sh",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL)
        except OSError as exc:
            raise ToolRuntimeError(f"failed to spawn {self.engine} container for tools runtime "
                                   f"(image: {self.image}): {exc}") from None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SPAWN_WAIT_S
        cid = ""
        while not cid and loop.time() < deadline and self.proc.returncode is None:
            with contextlib.suppress(OSError):
                cid = open(cidfile).read().strip()  # noqa: SIM115 (one small read)
            if not cid:
                await asyncio.sleep(0.1)
        with contextlib.suppress(OSError):
            os.unlink(cidfile)
        if not cid:
            await self.close()
            raise ToolRuntimeError(f"timed out waiting for {self.engine} container to start "
                                   f"(image: {self.image})")
        self.container_id = cid

    async def close(self) -> None:
        """Closing its stdin ends the container's shell; --rm removes it."""
        proc, self.proc = self.proc, None
        if proc is None or proc.returncode is not None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), STOP_WAIT_S)
        except TimeoutError:
            proc.kill()
            if self.container_id:
                rm = await asyncio.create_subprocess_exec(
                    self.engine, "rm", "-f", self.container_id,
                    stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
                await rm.wait()
            await proc.wait()


def owned_container(spec: str) -> OwnedContainer | None:
    container = parse_container(spec)
    if container is None or container.attach:
        return None
    return OwnedContainer(container.engine, container.arg)
