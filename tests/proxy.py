"""TCP proxies for tests, each on its own thread and event loop:

- `RoundRobinProxy`, a load balancer in front of api pods (the compose nginx's role): each
  client connection goes to the next upstream; one that does not answer gets a 502 (the proxy
  does not retry: what retries is the client's);
- `CuttableLink`, a link to one upstream (Redis) that a test cuts as a network partition does."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from typing import Self

BAD_GATEWAY = b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class ThreadedProxy:
    """A TCP server on 127.0.0.1 (a free port) whose connections `_handle` serves."""

    def __init__(self) -> None:
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    @contextlib.contextmanager
    def running(self) -> Iterator[Self]:
        self._thread.start()
        self._ready.wait(10)
        try:
            yield self
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)


class RoundRobinProxy(ThreadedProxy):
    def __init__(self, upstreams: list[tuple[str, int]]) -> None:
        super().__init__()
        self._upstreams = upstreams
        self._next = 0
        self.bad_gateways = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, port = self._upstreams[self._next % len(self._upstreams)]
        self._next += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            self.bad_gateways += 1
            writer.write(BAD_GATEWAY)
            with contextlib.suppress(OSError):
                await writer.drain()
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))


class CuttableLink(ThreadedProxy):
    """While cut, nothing crosses: bytes are swallowed and a new connection is never answered
    (no reset, no close: a partition, not a crash). The connections that were open when it
    was cut stay dead after `heal()`, as when a NAT or a load balancer lost their state; new
    connections work again."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        super().__init__()
        self._upstream = upstream
        self._epoch = 0
        """Connections of an older epoch than this are dead (`cut` starts a new one)."""
        self._cut = False

    def cut(self) -> None:
        self._cut = True
        self._epoch += 1

    def heal(self) -> None:
        self._cut = False

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._cut:
            await self._swallow(reader)
            return
        epoch = self._epoch
        up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        await asyncio.gather(self._carry(reader, up_writer, epoch),
                             self._carry(up_reader, writer, epoch))

    async def _carry(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     epoch: int) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                if epoch != self._epoch:  # cut since: this connection is gone for good
                    await self._swallow(reader)
                    return
                writer.write(data)
                await writer.drain()
            writer.close()  # an end closed while the link was up: the other end sees it

    @staticmethod
    async def _swallow(reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(OSError):
            while await reader.read(65536):
                pass


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
               delay_s: float = 0.0) -> None:
    """Copy `reader` to `writer` until either end closes, each chunk `delay_s` late."""
    try:
        while data := await reader.read(65536):
            if delay_s:
                await asyncio.sleep(delay_s)
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            writer.close()
