"""Sending a Redis command without a Task a command (issue 44: per-command CPU).

redis-py's asyncio connection wraps each send in `asyncio.wait_for(…, socket_timeout)`
when a reply timeout is set (scheduler/connections.py sets one on every client), and
`wait_for` makes a Task for each command: ~10–20 µs of CPU a command on this box, on every
command the api pods and workers send. `QuickSend` sends the same bytes under
`asyncio.timeout` instead (a timer, no Task): the same timeout, the same errors, the
connection dropped the same way on a failure."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError


class QuickSend(AbstractConnection):
    """Put first in a redis-py connection class's bases (see `quick`)."""

    async def send_packed_command(self, command: bytes | str | Iterable[bytes],
                                  check_health: bool = True) -> None:
        if not self.is_connected:
            await self.connect()
        elif check_health:
            await self.check_health()
        try:
            if isinstance(command, str):
                command = command.encode()
            if isinstance(command, bytes):
                command = [command]
            writer = self._writer
            assert writer is not None  # connected above
            async with asyncio.timeout(self.socket_timeout or None):
                writer.writelines(command)
                await writer.drain()
        except TimeoutError:  # asyncio's (a builtin OSError): before OSError, as redis-py
            await self.disconnect(nowait=True)
            raise RedisTimeoutError("Timeout writing to socket") from None
        except OSError as e:
            await self.disconnect(nowait=True)
            if len(e.args) == 1:
                err_no, errmsg = "UNKNOWN", e.args[0]
            else:
                err_no, errmsg = e.args[0], e.args[1]
            raise RedisConnectionError(
                f"Error {err_no} while writing to socket. {errmsg}.") from e
        except BaseException:
            # as redis-py: a send cut short leaves the stream in an unknown state
            await self.disconnect(nowait=True)
            raise


def quick(base: type[AbstractConnection]) -> type[AbstractConnection]:
    """`base` (a plain, TLS, Unix socket or Sentinel-managed connection) sending with
    QuickSend (a class a client: clients are opened a few times a process)."""
    if issubclass(base, QuickSend):
        return base
    return type(f"Quick{base.__name__}", (QuickSend, base), {})


def quick_send(client: Any) -> None:
    """Make the connections `client` (a redis-py asyncio client) opens from now on send with
    QuickSend."""
    pool = client.connection_pool
    pool.connection_class = quick(pool.connection_class)
