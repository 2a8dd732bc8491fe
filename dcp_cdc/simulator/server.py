"""The test DCP producer over TCP: one asyncio listener per simulated node (docs/protocol/dcp.md §4–§7).

:class:`ProducerServer` binds ``nodes`` ports on 127.0.0.1 (and TLS ports with a certificate),
loads the simulated bucket, serves it through :class:`~dcp_cdc.simulator.producer.ProducerConnection`
and runs a live workload while it serves. Faults are methods (``failover``, ``rebalance``,
``too_slow``, ``drop_collection``, ``cut_node``, ``stall``); the truth is written with
:func:`dcp_cdc.simulator.truth.write_truth`. Use it in-process (``async with ProducerServer(...)``)
or as a command::

    python -m dcp_cdc.simulator.server --nodes 4 --vbuckets 64 --scenario mixed --seed 1 \\
        --docs 2000 --ops 5000 --port-file ports.json --truth-out out/

which serves until SIGTERM or Ctrl-C (SIGINT), writing the truth then. ``--user U
--password-env VAR`` (or ``--password-file F``) adds a user whose password stays off the
command line (``--users U:PASSWORD``, repeatable, is for tests). A line-based control port
(in the port file) takes ``failover VB`` (or ``failover VB LOST BACK GROW``: a new branch shorter than what consumers
hold), ``rebalance VB NODE``, ``too_slow VB``, ``drop_collection CID``, ``cut_node NODE``,
``cut_requests NODE N`` (a reset at the Nth stream request), ``restart_node NODE MS`` (down
for MS milliseconds, then back on its ports), ``slow_seqnos MS`` (GET_ALL_VB_SEQNOS replies
late), ``stall VB [N]`` (VB's streams send nothing while it takes changes, N of them now;
answers its high seqno) and ``unstall VB``, ``changes N``, ``truth``, and ``steady RATE`` /
``halt`` (a steady workload of RATE changes a second, its ticks appended to ``--ticks-out``,
until halted). ``--bulk-docs N
--body-bytes B`` adds N small documents made in bulk (:mod:`dcp_cdc.simulator.bulk`) for benchmarks,
``--bulk-shape realistic`` realistic ones instead (:mod:`dcp_cdc.simulator.realistic`).
``--tls-cert C --tls-key K`` adds a TLS port to every node; ``--tls-client-ca CA`` then asks
for client certificates (mutual TLS) and maps each to a user by ``--client-cert-auth``
(:mod:`dcp_cdc.simulator.tls`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import json
import os
import signal
import socket
import ssl
import struct
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import cast

from dcp_cdc.config.capture import read_password
from dcp_cdc.errors import ConfigError, ProtocolError
from dcp_cdc.simulator.cluster import BULK_SHAPES, ProducerCluster
from dcp_cdc.simulator.model import Collection, Scope
from dcp_cdc.simulator.producer import ProducerConnection
from dcp_cdc.simulator.state import SimConfig, Simulation
from dcp_cdc.simulator.tls import ClientCertAuth, TlsSession, server_context
from dcp_cdc.simulator.truth import write_truth

HOST = "127.0.0.1"
WRITE_HIGH_WATER = 4 << 20
TIMER_S = 0.2
UNDO_KEPT = 256
"""Seqnos of each vbucket's recent history kept undoable, so that a failover may rewind
below what consumers already hold (``failover(..., back=N)``)."""


class _NodeProtocol(asyncio.Protocol):
    """One client connection: socket bytes to and from the sans-I/O connection; on a TLS port
    through a :class:`~dcp_cdc.simulator.tls.TlsSession`, the connection made once its
    handshake is done (and its client certificate, if any, accepted)."""

    def __init__(self, server: ProducerServer, node: int, tls: bool) -> None:
        self.server = server
        self.node = node
        self.tls = tls
        self.session: TlsSession | None = None
        self.conn: ProducerConnection | None = None
        self.transport: asyncio.Transport | None = None
        self.paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        self.server.protocols.add(self)
        if self.tls:
            assert self.server.tls_context is not None
            self.session = TlsSession(self.server.tls_context)
        else:
            self.conn = ProducerConnection(self.server.cluster, self.node)

    def _write(self, data: bytes) -> None:
        assert self.transport is not None
        if self.session is None:
            self.transport.write(data)
            return
        self.session.send(data)
        self.transport.write(self.session.to_send())

    def _tls_received(self, data: bytes) -> bytes | None:
        """The plaintext of ``data``; None when the connection ends (a refused handshake,
        whose alert is sent first, or a refused client certificate)."""
        session, transport = self.session, self.transport
        assert session is not None and transport is not None
        was_established = session.established
        try:
            plain = session.receive(data)
        except ssl.SSLError:
            transport.write(session.to_send())  # the alert, as an OpenSSL server sends it
            self._close()
            return None
        out = session.to_send()
        if out:
            transport.write(out)
        if session.established and not was_established and not self._accept():
            self._close()  # as kv_engine: no reply, the connection closes
            return None
        return plain

    def _accept(self) -> bool:
        """The handshake is done: the connection, authenticated as the user its client
        certificate maps to, if it presented one. False: the certificate maps to no rule, or
        to a user the cluster does not have."""
        assert self.session is not None
        cert, auth = self.session.peer_certificate(), self.server.client_certs
        user = None
        if cert is not None and auth is not None:
            user = auth.user_of(cert)
            if user is None or not self.server.cluster.has_user(user):
                return False
        self.conn = ProducerConnection(self.server.cluster, self.node, tls=True)
        if user is not None:
            self.conn.authenticate_by_certificate(user)
        return True

    def data_received(self, data: bytes) -> None:
        if self.session is not None:
            plain = self._tls_received(data)
            if not plain:
                return
            data = plain
        assert self.conn is not None
        try:
            self.conn.receive_data(data)
        except ProtocolError:
            self._close()
            return
        if self.conn.delayed:
            loop = asyncio.get_running_loop()
            for delay, req, value in self.conn.delayed:
                loop.call_later(delay, self._reply_later, req, value)
            self.conn.delayed.clear()
        self.flush()

    def _reply_later(self, req: tuple[int, ...], value: bytes) -> None:
        if self.conn is not None and self.transport is not None and not self.conn.closed:
            self.conn.reply_later(req, value)
            self.flush()

    def flush(self) -> None:
        conn, transport = self.conn, self.transport
        if conn is None or transport is None or transport.is_closing():
            return
        while not self.paused and conn.has_work:
            out = conn.data_to_send()
            if out:
                self._write(out)
            if conn.closed:
                if conn.reset:
                    self.reset()
                else:
                    self._close()
                return
            if not out:
                return

    def _close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def reset(self) -> None:
        """End the connection with a TCP RST (SO_LINGER 0), as a crashed node's kernel does."""
        if self.transport is None:
            return
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.conn is not None:
            self.server.cluster.detach(self.conn)
        self.server.protocols.discard(self)


class ProducerServer:
    """A simulated Couchbase cluster of ``nodes`` data nodes serving DCP for one bucket.

    The bucket keeps ``clock`` (nanoseconds since the epoch; the wall clock by default): it
    is made at that clock's time (``config.start_ns`` gives way to it) and dates each change
    by it, so its CAS times and expiries are today's and a TTL counts from the change, as on
    a cluster; the TTL pager expires what that clock says is due. ``clock=None`` serves
    simulated time from ``config.start_ns`` instead, which the workload advances by 5 s
    every 100 changes (TTLs fall due within a short run).
    """

    def __init__(
        self,
        config: SimConfig,
        *,
        nodes: int = 4,
        users: Mapping[str, str] | None = None,
        tls_context: ssl.SSLContext | None = None,
        client_certs: ClientCertAuth | None = None,
        refuse_optional_controls: bool = False,
        bulk_docs: int = 0,
        body_bytes: int = 64,
        bulk_shape: str = "small",
        clock: Callable[[], int] | None = time.time_ns,
    ) -> None:
        if clock is not None:
            config = dataclasses.replace(config, start_ns=clock())
        self.config = config
        self.sim = Simulation(config, clock=clock)
        self.sim.ttl_share = 0.15
        self.colls = self.sim.setup(history=True, max_ttl=7200)
        self.cluster = ProducerCluster(
            self.sim,
            nodes=nodes,
            users=users or {"Administrator": "password"},
            refuse_optional_controls=refuse_optional_controls,
            seed=config.seed,
        )
        if bulk_docs:
            self.cluster.add_bulk(bulk_docs, body_bytes, bulk_shape)
        if client_certs is not None:
            if tls_context is None:
                raise ValueError("client certificates need a TLS context")
            client_certs.apply(tls_context)
        self.tls_context = tls_context
        self.client_certs = client_certs
        """Client-certificate authentication on the TLS ports; None: a certificate is
        neither asked for nor read."""
        self.protocols: set[_NodeProtocol] = set()
        self._servers: list[asyncio.AbstractServer] = []
        self._listeners: dict[int, list[asyncio.AbstractServer]] = {}
        self.restarts = 0
        self._timer: asyncio.Task[None] | None = None
        self.workload_done = asyncio.Event()
        self.ops_done = 0

    # --- life cycle --------------------------------------------------------------------------

    @property
    def ports(self) -> list[int]:
        return list(self.cluster.ports)

    @property
    def tls_ports(self) -> list[int | None]:
        return list(self.cluster.tls_ports)

    @property
    def connection_string(self) -> str:
        return "couchbase://" + ",".join(f"{HOST}:{p}" for p in self.cluster.ports)

    async def start(self) -> None:
        for node in range(self.cluster.nodes):
            await self._listen(node)
        self._timer = asyncio.create_task(self._tick())

    async def _listen(self, node: int) -> None:
        """``node``'s listeners, on its ports (new ones at the first start)."""
        loop = asyncio.get_running_loop()
        srv = await loop.create_server(
            lambda node=node: _NodeProtocol(self, node, False),  # type: ignore[misc]
            HOST,
            self.cluster.ports[node],
        )
        listeners: list[asyncio.AbstractServer] = [srv]
        self.cluster.ports[node] = srv.sockets[0].getsockname()[1]
        if self.tls_context is not None:
            tsrv = await loop.create_server(  # TLS by the protocol's own TlsSession
                lambda node=node: _NodeProtocol(self, node, True),  # type: ignore[misc]
                HOST,
                self.cluster.tls_ports[node] or 0,
            )
            listeners.append(tsrv)
            self.cluster.tls_ports[node] = tsrv.sockets[0].getsockname()[1]
        self._listeners[node] = listeners
        self._servers.extend(listeners)

    async def restart_node(self, node: int, down_s: float) -> int:
        """``node`` crashes (its connections reset, nothing listens on its ports) and comes
        back on the same ports after ``down_s`` seconds, with the same vbuckets: a restart or
        an upgrade. Returns how many connections were reset."""
        if not 0 <= node < self.cluster.nodes:
            raise ValueError(f"restart_node: node {node} is not one of 0..{self.cluster.nodes - 1}")
        for srv in self._listeners.pop(node, []):
            srv.close()
            self._servers.remove(srv)
        reset = [p for p in self.protocols if p.node == node]
        for proto in reset:
            proto.reset()
        await asyncio.sleep(down_s)
        await self._listen(node)
        self.restarts += 1
        return len(reset)

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._timer
        for srv in self._servers:
            srv.close()
        for proto in list(self.protocols):
            if proto.transport is not None:
                proto.transport.abort()
        for srv in self._servers:
            await srv.wait_closed()
        self._servers = []

    async def __aenter__(self) -> ProducerServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(TIMER_S)
            now = loop.time()
            for proto in list(self.protocols):
                if proto.conn is not None:
                    proto.conn.on_timer(now)
            self.kick()

    def kick(self) -> None:
        """Send what changes and faults queued, on every connection."""
        for proto in list(self.protocols):
            proto.flush()

    # --- the live workload ---------------------------------------------------------------

    async def run_workload(
        self, ops: int, *, batch: int = 200, pause_s: float = 0.0, manifest: bool = True
    ) -> None:
        """``ops`` live changes (updates, creates, deletes; the TTL pager; with ``manifest``,
        a scope and a collection created and modified half-way), ``batch`` at a time, each
        batch reaching the open streams as memory snapshots before the next. A second
        workload on the same server passes ``manifest=False``: the scope exists by then."""
        manifest_at = ops // 2 if manifest else -1
        done = 0
        while done < ops:
            n = min(batch, ops - done)
            cids = self._collection_ids()
            if done <= manifest_at < done + n:  # right after change number manifest_at
                self._changes(manifest_at - done + 1, done, cids)
                self._grow_manifest()
                self._changes(done + n - manifest_at - 1, manifest_at + 1, cids)
            else:
                self._changes(n, done, cids)
            done += n
            self.ops_done = done
            self.kick()
            await asyncio.sleep(pause_s)
        self.workload_done.set()

    def _collection_ids(self) -> list[int]:
        return [c.collection_id for c in self.sim.bucket.live_collections()]

    def _changes(self, n: int, done: int, cids: list[int]) -> None:
        """``n`` random live changes to ``cids`` after ``done`` others, the TTL pager run
        every 100th (on simulated time, 5 s pass first); then each vbucket's undo log is
        trimmed to its high seqno."""
        sim, bucket = self.sim, self.sim.bucket
        for i in range(n):
            sim.random_op(cids)
            if (done + i) % 100 == 99:
                if bucket.clock is None:
                    bucket.advance(5)
                sim.pager()
        for vb in bucket.vbuckets:
            bucket.trim_undo(vb, vb.high_seqno - UNDO_KEPT)

    async def steady_workload(
        self,
        rate: float,
        stop: asyncio.Event,
        *,
        tick_s: float = 0.02,
        sent: Callable[[float, list[int]], None] | None = None,
    ) -> None:
        """Live changes at ``rate`` a second until ``stop`` is set (updates, creates, deletes;
        the TTL pager). Every ``tick_s`` the changes due are made and reach the open streams;
        then ``sent(wall time, high seqno of every vbucket)`` is called."""
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate}")
        loop = asyncio.get_running_loop()
        bucket = self.sim.bucket
        started, done = loop.time(), 0
        while not stop.is_set():
            due = int((loop.time() - started) * rate) - done
            self._changes(due, done, self._collection_ids())
            done += due
            self.ops_done += due
            self.kick()
            if sent is not None:
                sent(time.time(), [vb.high_seqno for vb in bucket.vbuckets])
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(tick_s):
                    await stop.wait()

    def _grow_manifest(self) -> None:
        """A scope and a collection created, then the collection modified (max TTL)."""
        sim, bucket = self.sim, self.sim.bucket
        scope = cast(Scope, sim.manifest(lambda: bucket.create_scope("tenant-b%1")))
        coll = cast(
            Collection,
            sim.manifest(lambda: bucket.create_collection(scope.scope_id, "orders-2026")),
        )
        cid = coll.collection_id
        sim.manifest(lambda: bucket.modify_collection(cid, max_ttl=600))

    # --- faults ----------------------------------------------------------------------------

    def failover(self, vbid: int, *, lost: int = 12, back: int = 0, grow: int = 0) -> int:
        point = self.cluster.failover(vbid, lost=lost, back=back, grow=grow)
        self.kick()
        return point

    def changes(self, n: int) -> None:
        """``n`` live changes now (after the workload, between captures)."""
        self._changes(n, self.ops_done, self._collection_ids())
        self.ops_done += n
        self.kick()

    def rebalance(self, vbid: int, to_node: int) -> None:
        self.cluster.rebalance(vbid, to_node)
        self.kick()

    def too_slow(self, vbid: int) -> int:
        n = self.cluster.too_slow(vbid)
        self.kick()
        return n

    def drop_collection(self, collection_id: int) -> None:
        self.cluster.drop_collection(collection_id)
        self.kick()

    def cut_node(self, node: int) -> int:
        n = self.cluster.cut_node(node)
        self.kick()
        return n

    def stall(self, vbid: int, changes: int = 0) -> int:
        """``vbid``'s streams stop sending while it takes changes (``changes`` of them now);
        returns its high seqno. :meth:`unstall` lets them go."""
        high = self.cluster.stall(vbid, changes)
        self.kick()
        return high

    def unstall(self, vbid: int) -> None:
        self.cluster.unstall(vbid)
        self.kick()

    # --- truth -------------------------------------------------------------------------------

    def write_truth(self, out: Path) -> Path:
        """``out/truth/{documents.jsonl,summary.json}``: the bucket as it is now. Bulk
        documents are not listed: the summary's ``bulk`` says what they are
        (:meth:`~dcp_cdc.simulator.bulk.NumberedDocs.describe`)."""
        consistent = {vb.vbid: vb.high_seqno for vb in self.sim.bucket.vbuckets}
        bulk = self.cluster.bulk
        return write_truth(
            self.sim,
            out,
            consistent=consistent,
            sessions=self.cluster.sessions,
            bulk=None if bulk is None else bulk.describe(),
        )


# --- the command line ---------------------------------------------------------------------


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m dcp_cdc.simulator.server", description=__doc__)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--vbuckets", type=int, default=64)
    p.add_argument(
        "--collections",
        type=int,
        default=SimConfig.collections,
        help="user collections in scope inventory (beside _default), 1 to 64",
    )
    p.add_argument("--scenario", default="mixed")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--docs", type=int, default=2000)
    p.add_argument("--ops", type=int, default=5000)
    p.add_argument("--bucket", default="travel-sample")
    p.add_argument("--batch", type=int, default=200)
    p.add_argument("--pause", type=float, default=0.01, help="seconds between workload batches")
    p.add_argument("--port-file", type=Path, required=True)
    p.add_argument("--truth-out", type=Path)
    p.add_argument(
        "--ticks-out",
        type=Path,
        help="the steady workload's ticks, a JSON line each: [wall time, high seqno per vbucket]",
    )
    p.add_argument("--tls-cert", type=Path, help="the nodes' certificate (PEM): TLS ports too")
    p.add_argument("--tls-key", type=Path, help="its private key (PEM)")
    p.add_argument(
        "--tls-client-ca",
        type=Path,
        help="client certificates (mutual TLS): the CA that signs them; a certificate maps "
        "to a user of --users by --client-cert-auth",
    )
    p.add_argument(
        "--client-cert-auth",
        default='{"state": "mandatory", "prefixes": [{"path": "subject.cn"}]}',
        help="as Couchbase's /settings/clientCertAuth: state enable|mandatory and the rules "
        "(path subject.cn|san.dnsname|san.email|san.uri, prefix, delimiter) that map a "
        "certificate to a user",
    )
    p.add_argument(
        "--user",
        help="a user whose password --password-env or --password-file gives (kept off the "
        "command line, which `ps` shows)",
    )
    secret = p.add_mutually_exclusive_group()
    secret.add_argument(
        "--password-env", metavar="VAR", help="the variable holding --user's password"
    )
    secret.add_argument("--password-file", metavar="FILE", help="a file holding --user's password")
    p.add_argument(
        "--users",
        action="append",
        default=[],
        help="user:password (repeatable; for tests: `ps` shows it)",
    )
    p.add_argument("--refuse-optional-controls", action="store_true")
    p.add_argument(
        "--bulk-docs",
        type=int,
        default=0,
        help="add N bulk documents for benchmarks (--bulk-shape); the truth does not list "
        "them, its summary says what they are",
    )
    p.add_argument("--body-bytes", type=int, default=64, help="size of a bulk document's body")
    p.add_argument(
        "--bulk-shape",
        choices=BULK_SHAPES,
        default="small",
        help="small: fixed tiny bodies in collection 0 (--body-bytes); realistic: nested "
        "JSON of 0.5-4 KB, Snappy, some XATTRs and binary, four collections in two scopes",
    )
    args = p.parse_args(argv)
    args.logins = dict(u.split(":", 1) for u in args.users)
    if (args.user is None) != (args.password_env is None and args.password_file is None):
        p.error("--user: give it with --password-env or --password-file, and they with it")
    if args.user is not None:
        try:
            args.logins[args.user] = read_password(
                args.password_env,
                args.password_file,
                what=f"--user {args.user}",
                settings=("--password-env", "--password-file"),
            )
        except ConfigError as exc:
            p.error(str(exc))
    if args.tls_client_ca and not args.tls_cert:
        p.error("--tls-client-ca: client certificates need TLS (--tls-cert, --tls-key)")
    if args.tls_client_ca:
        try:
            args.client_certs = ClientCertAuth.from_json(args.tls_client_ca, args.client_cert_auth)
        except ValueError as exc:
            p.error(f"--client-cert-auth: {exc}")
    else:
        args.client_certs = None
    return args


class _Steady:
    """The control port's ``steady RATE`` and ``halt``: one steady workload at a time, its
    ticks appended to ``ticks_out``."""

    def __init__(self, server: ProducerServer, ticks_out: Path | None) -> None:
        self.server, self.ticks_out = server, ticks_out
        self.task: asyncio.Task[None] | None = None
        self.stop = asyncio.Event()

    def start(self, rate: int) -> str:
        if self.ticks_out is None:
            return "error steady needs --ticks-out"
        if self.task is not None:
            return "error a steady workload runs already"
        out = self.ticks_out.open("a", encoding="utf-8")

        def sent(at: float, highs: list[int]) -> None:
            out.write(json.dumps([at, highs]) + "\n")
            out.flush()  # a reader tails the file

        async def run() -> None:
            try:
                await self.server.steady_workload(rate, self.stop, sent=sent)
            finally:
                out.close()

        self.task = asyncio.create_task(run())
        return "ok"

    async def halt(self) -> str:
        if self.task is None:
            return "error no steady workload runs"
        self.stop.set()
        await self.task
        self.task, self.stop = None, asyncio.Event()  # another steady workload may follow
        return f"ok {self.server.ops_done}"


async def _control(
    server: ProducerServer, truth_out: Path | None, line: str, steady: _Steady | None = None
) -> str:
    words = line.split()
    if not words:
        return "error empty command"
    cmd, args = words[0], [int(w) for w in words[1:] if w.lstrip("-").isdigit()]
    if cmd == "failover" and len(args) == 1:
        return f"ok {server.failover(args[0])}"
    if cmd == "failover" and len(args) == 4:  # VB LOST BACK GROW
        return f"ok {server.failover(args[0], lost=args[1], back=args[2], grow=args[3])}"
    if cmd == "changes" and len(args) == 1:
        server.changes(args[0])
        return f"ok {server.ops_done}"
    if cmd == "cut_requests" and len(args) == 2:
        server.cluster.cut_after_requests(args[0], args[1])
        return "ok"
    if cmd == "slow_seqnos" and len(args) == 1:  # milliseconds
        server.cluster.slow_seqnos(args[0] / 1000)
        return "ok"
    if cmd == "restart_node" and len(args) == 2:  # NODE, milliseconds down (answers at once)
        asyncio.get_running_loop().create_task(server.restart_node(args[0], args[1] / 1000))
        return "ok"
    if cmd == "rebalance" and len(args) == 2:
        server.rebalance(args[0], args[1])
        return f"ok {server.cluster.rev}"
    if cmd == "too_slow" and len(args) == 1:
        return f"ok {server.too_slow(args[0])}"
    if cmd == "drop_collection" and len(args) == 1:
        server.drop_collection(args[0])
        return "ok"
    if cmd == "stall" and len(args) in (1, 2):  # VB [CHANGES]
        return f"ok {server.stall(*args)}"
    if cmd == "unstall" and len(args) == 1:
        server.unstall(args[0])
        return "ok"
    if cmd == "cut_node" and len(args) == 1:
        return f"ok {server.cut_node(args[0])}"
    if cmd == "truth":
        if truth_out is None:
            return "error truth needs --truth-out (where the producer writes it)"
        return f"ok {server.write_truth(truth_out)}"
    if cmd == "steady" and len(args) == 1 and steady is not None:
        return steady.start(args[0])
    if cmd == "halt" and steady is not None:
        return await steady.halt()
    return f"error unknown command {line.strip()!r}"


async def _serve(args: argparse.Namespace) -> int:
    users = args.logins or None
    ctx = server_context(args.tls_cert, args.tls_key) if args.tls_cert else None
    config = SimConfig(
        scenario=args.scenario,
        seed=args.seed,
        bucket=args.bucket,
        vbuckets=args.vbuckets,
        collections=args.collections,
        docs=args.docs,
        ops=args.ops,
    )
    server = ProducerServer(
        config,
        nodes=args.nodes,
        users=users,
        tls_context=ctx,
        client_certs=args.client_certs,
        refuse_optional_controls=args.refuse_optional_controls,
        bulk_docs=args.bulk_docs,
        body_bytes=args.body_bytes,
        bulk_shape=args.bulk_shape,
    )
    steady = _Steady(server, args.ticks_out)
    gc.freeze()  # the loaded bucket is long-lived: collections need not scan it (speed)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def on_control(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            try:
                answer = await _control(server, args.truth_out, line.decode(), steady)
            except (ValueError, IndexError, KeyError) as exc:
                answer = f"error {exc}"
            writer.write(answer.encode() + b"\n")
            await writer.drain()
        writer.close()

    async with server:
        control = await asyncio.start_server(on_control, HOST, 0)
        info = {
            "bucket": config.bucket,
            "ports": server.ports,
            "tls_ports": server.tls_ports,
            "control_port": control.sockets[0].getsockname()[1],
            "connection_string": server.connection_string,
            "pid": os.getpid(),
        }
        tmp = args.port_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(info) + "\n", encoding="utf-8")
        tmp.replace(args.port_file)

        async def workload() -> None:
            await server.run_workload(args.ops, batch=args.batch, pause_s=args.pause)
            if args.truth_out is not None:
                server.write_truth(args.truth_out)

        task = asyncio.create_task(workload())
        await stop.wait()
        steady.stop.set()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        control.close()
        if args.truth_out is not None:
            server.write_truth(args.truth_out)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(_serve(_parse(argv)))


if __name__ == "__main__":
    sys.exit(main())
