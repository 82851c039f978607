"""A round-robin TCP proxy for tests, as a load balancer in front of api pods (the compose
nginx's role): each client connection goes to the next upstream; one that does not answer
gets a 502 (the proxy does not retry: what retries is the client's)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

BAD_GATEWAY = b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class RoundRobinProxy:
    def __init__(self, upstreams: list[tuple[str, int]]) -> None:
        self._upstreams = upstreams
        self._next = 0
        self.port = 0
        self.bad_gateways = 0
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

    @contextlib.contextmanager
    def running(self) -> Iterator[RoundRobinProxy]:
        self._thread.start()
        self._ready.wait(10)
        try:
            yield self
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)


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
