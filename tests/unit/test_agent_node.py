"""A node's socket reader stops when it is told to, whatever the timing.

The capture demo once hung for 20 minutes at the end of a run: a cancel that met a read
completing in the same loop turn was dropped by Python 3.11's ``asyncio.wait_for`` (CPython
gh-86296), the reader went on, found no stream left and waited on the socket with no timeout,
and the shutdown waited for the reader. These tests make that turn happen on purpose.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import pytest

from dcp_cdc.agent.consumer_events import NEED_DATA
from dcp_cdc.agent.node import Node, stop_task
from dcp_cdc.config.capture import HostPort


class _Core:
    """A consumer core that streams one vbucket until it has read something, then none (the
    shape of a shutdown: the last STREAM_END arrives as the cancel does)."""

    def __init__(self) -> None:
        self.read = 0
        self.frames_received = 0

    def any_streaming(self) -> bool:
        return not self.read

    def receive_data(self, data: bytes) -> None:
        self.read += len(data)

    def take_capture(self) -> bytes:
        return b""

    def next_event(self) -> Any:
        return NEED_DATA

    def data_to_send(self) -> bytes:
        return b""


def _node(failures: list[BaseException]) -> Node:
    owner: Any = SimpleNamespace(
        settings=SimpleNamespace(noop_interval_s=30.0, rotate_seconds=60.0),
        stopping=True,
        summary=SimpleNamespace(bytes_captured=0, frames_received=0, bytes_received=0),
        spawn=lambda coro: coro.close(),
        fail=failures.append,
    )
    node = Node(owner, HostPort("127.0.0.1", 11210), 0)
    node.conn = _Core()  # type: ignore[assignment]
    node.reader = asyncio.StreamReader()
    node.writer = SimpleNamespace()  # type: ignore[assignment]  # the core has nothing to send
    return node


@pytest.mark.parametrize("turns", range(6))
def test_a_cancel_in_the_turns_a_read_completes_still_stops_the_reader(turns: int) -> None:
    """The cancel comes 0-5 loop turns after the data: one of them is the turn between the
    read's end and the reader's wake-up, where ``wait_for`` dropped it."""

    failures: list[BaseException] = []

    async def main() -> bool:
        node = _node(failures)
        reader = asyncio.create_task(node._read_loop())
        await asyncio.sleep(0.01)  # the reader waits on the socket (with the silence timeout)
        assert node.reader is not None
        node.reader.feed_data(b"last frames")
        for _ in range(turns):
            await asyncio.sleep(0)
        reader.cancel()
        done, _ = await asyncio.wait({reader}, timeout=2.0)
        if not done:
            node.reader.feed_eof()
        return bool(done)

    stopped = asyncio.run(main())
    assert not failures
    assert stopped, "the socket reader went on after its cancel"


def test_stop_task_gives_up_on_a_task_that_ignores_its_cancel() -> None:
    async def stubborn() -> None:
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                continue  # what a lost cancel looks like from outside

    async def main() -> tuple[float, bool]:
        task = asyncio.create_task(stubborn())
        await asyncio.sleep(0)
        started = time.monotonic()
        await stop_task(task, 0.2)
        waited, done = time.monotonic() - started, task.done()
        task.get_coro().close()  # type: ignore[union-attr]
        return waited, done

    waited, done = asyncio.run(main())
    assert not done and waited < 5.0
