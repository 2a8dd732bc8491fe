"""One data node's connection in the capture agent: its socket and its sans-I/O
:class:`~dcp_cdc.agent.consumer.ConsumerConnection`, opened with the handshake
(:class:`Link`, all that a one-off question such as ``dcp-cdc status``'s needs); the
session of capture files a run adds, and the two tasks between them (:class:`Node`); and the
backoff shared by every placement waiting for a node that cannot be reached
(:class:`Backoff`).

The socket reader hands each run of captured frames to a bounded queue and only then tells
the core ``consumed()``, so a lagging writer stops the acknowledgements and flow control stops
the node (docs/protocol/dcp.md §7.6); a full queue also stops the reads. Every wait has a timeout. The file
writer closes a file (fsync'd and published: renamed into a landing folder, or uploaded to an
object store, in a worker thread so the sockets keep being served) before it commits the
checkpoint that covers its frames.

What a node does with the events it reads, and which vbuckets it streams, is the
placement's (:mod:`dcp_cdc.agent.placement`), seen here only through :class:`NodeOwner`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import ssl
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from dcp_cdc.agent.consumer import ConsumerConnection
from dcp_cdc.agent.consumer_events import NEED_DATA, AgentEvent, HighSeqnos, NeedData, Ready
from dcp_cdc.agent.handshake import ConsumerSettings
from dcp_cdc.agent.landing_store import LandingStore
from dcp_cdc.agent.positions import VbPosition
from dcp_cdc.agent.settings import MAX_BACKOFF_S, CaptureSettings, CaptureSummary
from dcp_cdc.agent.tls import closed_after_handshake, tls_failure
from dcp_cdc.agent.writer import SessionWriter, rfc3339
from dcp_cdc.config.capture import HostPort
from dcp_cdc.errors import CaptureConnectionError, ConnectionLostError, ProtocolError

log = logging.getLogger(__name__)

READ_BYTES = 1 << 16
QUEUE_ITEMS = 64
"""Runs of frames (≤ 64 KiB each) between a socket reader and its file writer."""
CLOSE_WAIT_S = 1.0
"""How long closing a node waits for its socket reader to end, and for the socket to close."""


async def stop_task(task: asyncio.Task[None], timeout: float) -> None:
    """Cancel ``task`` and wait at most ``timeout`` seconds for it to end.

    Every wait in the agent is ``asyncio.timeout`` rather than ``asyncio.wait_for``: on
    Python 3.11, ``wait_for`` returns the result of a read that completes in the same loop
    turn as a cancellation and drops the cancellation (CPython gh-86296, fixed in 3.12); a
    reader that lost its cancel then waited forever on a socket with no stream left, and a
    capture never ended. The bounded wait here is the second guard."""
    task.cancel()
    with contextlib.suppress(BaseException):
        await asyncio.wait({task}, timeout=timeout)
    if not task.done():
        log.warning("capture: task %s did not stop within %.0f s", task.get_name(), timeout)


class Dialler(Protocol):
    """What opening a :class:`Link` needs: the capture settings (user, password, timeouts),
    the TLS context, and a session id to name the DCP connection by (a node closes an
    earlier connection of the same name, so every name is new)."""

    settings: CaptureSettings
    ssl_context: ssl.SSLContext | None
    tls: bool

    def next_session_id(self, index: int, started: float | None = None) -> str: ...


class NodeOwner(Dialler, Protocol):
    """What a :class:`Node` needs from the run it belongs to (the placement)."""

    landing: LandingStore
    scheme: str
    summary: CaptureSummary
    stopping: bool

    def session_start(self) -> float: ...

    def commit(self, positions: dict[int, VbPosition]) -> None: ...

    def fail(self, exc: BaseException) -> None: ...

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None: ...

    async def node_lost(self, node: Node, why: str) -> None: ...

    async def on_event(self, node: Node, event: AgentEvent) -> None: ...


@dataclass
class _Frames:
    data: bytes
    positions: dict[int, VbPosition]


@dataclass
class _Flush:
    """Close the open file and commit; ``new_session`` then starts another session."""

    done: asyncio.Future[None]
    new_session: bool = False
    last: bool = False


class Link:
    """One DCP connection to a data node: its socket and its sans-I/O core, opened by
    :meth:`connect` (TCP, TLS and the handshake). A run's :class:`Node` streams on it; a
    one-off question (:meth:`high_seqnos`, what ``dcp-cdc status`` asks) needs no more."""

    def __init__(self, agent: Dialler, endpoint: HostPort, index: int) -> None:
        self.agent = agent
        self.endpoint = endpoint
        self.index = index
        self.conn: ConsumerConnection | None = None
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    @property
    def label(self) -> str:
        return self.endpoint.label

    async def connect(self) -> Ready:
        """TCP (+ TLS) and the handshake; typed errors name this node."""
        s = self.agent.settings
        node = self.label
        try:
            async with asyncio.timeout(s.connect_timeout_s):
                self.reader, self.writer = await asyncio.open_connection(
                    self.endpoint.host,
                    self.endpoint.port,
                    ssl=self.agent.ssl_context,
                    server_hostname=self.endpoint.host if self.agent.ssl_context else None,
                    limit=READ_BYTES * 4,
                )
        except ssl.SSLError as exc:
            raise tls_failure(node, exc, client_certificate=s.client_certificate) from None
        except TimeoutError:
            raise CaptureConnectionError(
                node, f"no connection within {s.connect_timeout_s:g} s"
            ) from None
        except OSError as exc:
            raise CaptureConnectionError(node, f"cannot connect: {exc.strerror or exc}") from None
        self.conn = ConsumerConnection(
            ConsumerSettings(
                node=node,
                bucket=s.bucket,
                username=s.username,
                password=s.password,
                tls=self.agent.tls,
                client_certificate=s.client_certificate,
                connection_name=f"dcp-cdc:{s.agent_id}:{self.agent.next_session_id(self.index)}",
                buffer_bytes=s.buffer_bytes,
                noop_interval_s=s.noop_interval_s,
            )
        )
        deadline = time.monotonic() + s.connect_timeout_s
        reader = self.reader
        assert reader is not None
        answered = False  # a node that refuses a client certificate ends before any reply
        while True:
            try:
                await self._send()
            except ConnectionLostError as exc:
                if isinstance(exc.__cause__, ssl.SSLError):
                    raise self._tls_refusal(exc.__cause__) from None
                if self.agent.tls and not answered:
                    raise self._closed_after_tls("closed the connection") from None
                raise CaptureConnectionError(node, f"handshake: {exc.cause}") from None
            event = self.conn.next_event()
            if isinstance(event, Ready):
                return event
            if event is not NEED_DATA:
                continue  # ControlRefused: recorded in the features already
            left = deadline - time.monotonic()
            try:
                async with asyncio.timeout(max(left, 0.001)):
                    data = await reader.read(READ_BYTES)
            except TimeoutError:
                raise CaptureConnectionError(
                    node, f"handshake not finished within {s.connect_timeout_s:g} s"
                ) from None
            except ssl.SSLError as exc:
                raise self._tls_refusal(exc) from None
            except OSError as exc:
                if self.agent.tls and not answered:
                    raise self._closed_after_tls("reset the connection") from None
                raise CaptureConnectionError(node, f"handshake: {exc.strerror or exc}") from None
            if not data:
                if self.agent.tls and not answered:
                    raise self._closed_after_tls("closed the connection")
                raise CaptureConnectionError(
                    node, "the node closed the connection in the handshake"
                )
            answered = True
            try:
                self.conn.receive_data(data)
            except ProtocolError as exc:
                raise CaptureConnectionError(node, str(exc)) from None

    def _tls_refusal(self, exc: ssl.SSLError) -> CaptureConnectionError:
        return tls_failure(
            self.label, exc, client_certificate=self.agent.settings.client_certificate
        )

    def _closed_after_tls(self, what: str) -> CaptureConnectionError:
        return closed_after_handshake(
            self.label, what, client_certificate=self.agent.settings.client_certificate
        )

    async def send(self) -> None:
        """Write what the core has queued to the socket, waiting (at most the connect timeout)
        until the socket takes it; :class:`ConnectionLostError` when it does not."""
        await self._send()

    async def _send(self) -> None:
        assert self.conn is not None and self.writer is not None
        out = self.conn.data_to_send()
        if out:
            self.writer.write(out)
            try:
                async with asyncio.timeout(self.agent.settings.connect_timeout_s):
                    await self.writer.drain()
            except TimeoutError:
                raise ConnectionLostError(
                    self.label, "the node does not read what we send"
                ) from None
            except OSError as exc:  # the cause kept: the handshake tells a TLS refusal by it
                raise ConnectionLostError(self.label, str(exc)) from exc

    async def high_seqnos(self) -> dict[int, int]:
        """GET_ALL_VB_SEQNOS once, on a link that :meth:`connect` opened and nothing streams
        on: the high seqno of each vbucket active on this node. Bounded by the connect
        timeout; typed errors name this node."""
        assert self.conn is not None and self.reader is not None
        s = self.agent.settings
        self.conn.request_high_seqnos()
        deadline = time.monotonic() + s.connect_timeout_s
        while True:
            try:
                await self._send()
            except ConnectionLostError as exc:
                raise CaptureConnectionError(self.label, exc.cause) from None
            event = self.conn.next_event()
            if isinstance(event, HighSeqnos):
                return dict(event.seqnos)
            if event is not NEED_DATA:
                continue  # a cluster-map notification: not what was asked
            try:
                async with asyncio.timeout(max(deadline - time.monotonic(), 0.001)):
                    data = await self.reader.read(READ_BYTES)
            except TimeoutError:
                raise CaptureConnectionError(
                    self.label, f"no high seqnos within {s.connect_timeout_s:g} s"
                ) from None
            except OSError as exc:
                raise CaptureConnectionError(self.label, exc.strerror or str(exc)) from None
            if not data:
                raise CaptureConnectionError(self.label, "the node closed the connection")
            try:
                self.conn.receive_data(data)
            except ProtocolError as exc:
                raise CaptureConnectionError(self.label, str(exc)) from None

    async def close(self) -> None:
        """Close the socket, waiting for it a bounded time."""
        if self.writer is not None:
            self.writer.close()
        await self._closed()

    async def _closed(self) -> None:
        if self.writer is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(CLOSE_WAIT_S):
                    await self.writer.wait_closed()


class Node(Link):
    """A link a run streams on: its session of capture files and the two tasks between the
    socket and the files (the socket reader and the file writer)."""

    agent: NodeOwner

    def __init__(self, agent: NodeOwner, endpoint: HostPort, index: int) -> None:
        super().__init__(agent, endpoint, index)
        self.queue: asyncio.Queue[_Frames | _Flush] = asyncio.Queue(QUEUE_ITEMS)
        self.owned: set[int] = set()
        self.session: SessionWriter | None = None
        self.session_started = 0.0
        self.last_positions: dict[int, VbPosition] = {}
        self.read_task: asyncio.Task[None] | None = None
        """The socket reader (:meth:`start`): feeds the core, queues the frames, hands the
        events to the placement."""
        self.write_task: asyncio.Task[None] | None = None
        """The file writer (:meth:`start`): writes the queued frames, closes files, commits."""
        self.dead = False
        self.recorded = asyncio.Event()
        """Set when :meth:`~ConsumerConnection.record_cluster_state` finished on this node."""

    def new_session(self) -> None:
        """A fresh session of files (the writer task switches to it in queue order)."""
        assert self.conn is not None
        self.session_started = self.agent.session_start()
        s = self.agent.settings
        session_id = self.agent.next_session_id(self.index, self.session_started)
        self.session = SessionWriter(
            self.agent.landing,
            s.staging,
            bucket=s.bucket,
            session_id=session_id,
            collections=self.conn.collections,
            features=self.conn.features,
            source=f"{self.agent.scheme}://{self.label}",
            started_at=rfc3339(self.session_started),
            rotate_bytes=s.rotate_bytes,
            rotate_seconds=s.rotate_seconds,
        )
        self.agent.summary.sessions += 1

    def start(self) -> None:
        self.read_task = asyncio.create_task(self._read_loop(), name=f"read {self.label}")
        self.write_task = asyncio.create_task(self._write_loop(), name=f"write {self.label}")

    @property
    def reader_ended(self) -> bool:
        """Whether the socket reader started and has ended (the connection is of no more use)."""
        return self.read_task is not None and self.read_task.done()

    async def stop_reader(self) -> None:
        """Stop the socket reader, waiting for it at most :data:`CLOSE_WAIT_S`."""
        if self.read_task is not None:
            await stop_task(self.read_task, CLOSE_WAIT_S)

    async def _read_loop(self) -> None:
        assert self.conn is not None and self.reader is not None
        conn = self.conn
        silence = 2 * self.agent.settings.noop_interval_s
        try:
            while True:
                try:
                    timeout = silence if conn.any_streaming() else None
                    async with asyncio.timeout(timeout):
                        data = await self.reader.read(READ_BYTES)
                except TimeoutError:
                    raise ConnectionLostError(
                        self.label, f"silent for {silence} s (2 × the noop interval)"
                    ) from None
                except OSError as exc:
                    raise ConnectionLostError(self.label, exc.strerror or str(exc)) from None
                if not data:
                    raise ConnectionLostError(self.label, "the node closed the connection")
                counted = conn.frames_received
                try:
                    conn.receive_data(data)
                except ProtocolError as exc:
                    raise CaptureConnectionError(self.label, str(exc)) from None
                summary = self.agent.summary  # plain ints, read by a metrics scrape
                summary.frames_received += conn.frames_received - counted
                summary.bytes_received += len(data)
                capture = conn.take_capture()
                if capture:
                    await self.queue.put(_Frames(capture, conn.positions()))
                    conn.consumed(len(capture))
                    self.agent.summary.bytes_captured += len(capture)
                await self._send()
                while not isinstance(event := conn.next_event(), NeedData):
                    await self.agent.on_event(self, event)
                await self._send()
        except ConnectionLostError as exc:
            if not self.agent.stopping:
                self.agent.spawn(self.agent.node_lost(self, exc.cause))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self.agent.fail(exc)

    async def _write_loop(self) -> None:
        poll = min(1.0, self.agent.settings.rotate_seconds / 4)
        try:
            while True:
                try:
                    async with asyncio.timeout(poll):
                        item = await self.queue.get()
                except TimeoutError:
                    if self.session is not None and self.session.due(time.time()):
                        await self._close_and_commit()
                    continue
                if isinstance(item, _Frames):
                    assert self.session is not None
                    now = time.time()
                    self.session.write(item.data, now)
                    self.last_positions = item.positions
                    if self.session.due(now):
                        await self._close_and_commit()
                    continue
                await self._close_and_commit()
                if item.new_session:
                    self.new_session()
                item.done.set_result(None)
                if item.last:
                    return
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self.agent.fail(exc)

    async def _close_and_commit(self) -> None:
        """Publish the open file, then commit the positions it reaches: never the other way
        round. A publish that fails raises (the run fails) and commits nothing."""
        if self.session is None:
            return
        size = self.session.file_bytes
        path = await asyncio.to_thread(self.session.close_file)
        if path is not None:
            self.agent.summary.files.append(path)
            self.agent.summary.bytes_durable += size
        self.agent.commit({vb: p for vb, p in self.last_positions.items() if vb in self.owned})

    async def flush(self, *, new_session: bool = False, last: bool = False) -> None:
        """Wait until every frame queued so far is in a closed file and committed."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await self.queue.put(_Flush(done, new_session=new_session, last=last))
        waits: set[asyncio.Future[Any]] = {done}
        if self.write_task is not None:
            waits.add(self.write_task)
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        if not done.done():
            raise CaptureConnectionError(self.label, "the capture writer stopped")

    async def close(self) -> None:
        """Stop the socket reader and close the socket. Bounded: the socket closes first, so a
        reader that missed its cancellation still ends (EOF), and the wait for it has a limit."""
        if self.writer is not None:
            self.writer.close()
        await self.stop_reader()
        await self._closed()


@dataclass
class _Down:
    """A node the agent cannot reach: since when, and when every placement tries it next."""

    since: float
    attempts: int = 0
    next_try: float = 0.0
    cause: str = ""


class Backoff:
    """The nodes that cannot be reached, each on one jittered, exponential backoff shared by
    every placement that waits for it."""

    def __init__(self, settings: CaptureSettings) -> None:
        self.settings = settings
        self.down: dict[HostPort, _Down] = {}
        self.rng = random.Random()

    def reached(self, endpoint: HostPort) -> None:
        """``endpoint`` answered: its next failure starts a new backoff."""
        self.down.pop(endpoint, None)

    def failed(self, endpoint: HostPort, cause: str) -> None:
        """A connection attempt to ``endpoint`` failed: the next one waits, for every
        placement at once (exponential, with jitter, at most :data:`MAX_BACKOFF_S`)."""
        now = time.monotonic()
        down = self.down.setdefault(endpoint, _Down(since=now))
        down.attempts += 1
        down.cause = cause
        delay = min(MAX_BACKOFF_S, self.settings.backoff_s * 2 ** (down.attempts - 1))
        down.next_try = now + delay * self.rng.uniform(0.5, 1.0)
        left = self.settings.reconnect_timeout_s - (now - down.since)
        log.warning(
            "capture: %s: %s; trying again in %.1f s (giving up in %.0f s)",
            endpoint.label,
            cause,
            down.next_try - now,
            max(left, 0.0),
        )

    async def wait(self, endpoint: HostPort) -> None:
        """Until ``endpoint`` may be tried again; :class:`CaptureConnectionError` once it has
        been down for longer than ``reconnect_timeout_s``."""
        down = self.down.get(endpoint)
        if down is None:  # failed after its handshake (a send): try again after a backoff
            await asyncio.sleep(self.settings.backoff_s)
            return
        now = time.monotonic()
        if now - down.since >= self.settings.reconnect_timeout_s:
            raise CaptureConnectionError(
                endpoint.label,
                f"unreachable for {now - down.since:.0f} s after {down.attempts} attempts "
                f"(reconnect_timeout_s = {self.settings.reconnect_timeout_s:g}): {down.cause}",
            ) from None
        await asyncio.sleep(max(0.0, down.next_try - now))
