"""A stream's pings from a timer (api/streaming.py `_Pings`, issue 44): a ping after the
interval without a send, none while events go out, a failed ping ends the stream's task."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from api.streaming import PING, PING_EARLY_S, _Pings


class Sent:
    def __init__(self, fail: bool = False) -> None:
        self.data: list[str] = []
        self.at: list[float] = []
        self.fail = fail

    async def send(self, data: str = "") -> None:
        if self.fail:
            raise ConnectionResetError("the client went away")
        self.data.append(data)
        self.at.append(asyncio.get_running_loop().time())

    async def eof(self) -> None:
        return None


async def test_a_silent_stream_gets_a_ping_each_interval() -> None:
    out = Sent()
    started = asyncio.get_running_loop().time()
    pings = _Pings(out, 0.05)
    async with asyncio.timeout(10):
        while len(out.data) < 3:
            await asyncio.sleep(0.01)
    await pings.settle()
    assert set(out.data) == {PING}
    gaps = [b - a for a, b in zip([started, *out.at], out.at, strict=False)]
    assert all(gap >= 0.05 - PING_EARLY_S for gap in gaps), gaps


async def test_no_ping_while_events_go_out() -> None:
    out = Sent()
    pings = _Pings(out, 1.0)
    for _ in range(10):
        await asyncio.sleep(0.02)
        await out.send("data: {}\n\n")
        pings.sent()
    await pings.settle()
    assert PING not in out.data


async def test_no_ping_when_disabled_or_after_settling() -> None:
    out = Sent()
    for pings in (_Pings(out, 0), _Pings(out, -1)):
        await asyncio.sleep(0.02)
        pings.cancel()
    pings = _Pings(out, 0.02)
    await pings.settle()
    await asyncio.sleep(0.06)
    assert out.data == []


async def test_a_failed_ping_cancels_the_stream_task() -> None:
    async def stream() -> None:
        pings = _Pings(Sent(fail=True), 0.02)
        try:
            await asyncio.sleep(5)  # waiting for an event that does not come
        finally:
            pings.cancel()

    task = asyncio.ensure_future(stream())
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(2):
            await task
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert task.cancelled()
