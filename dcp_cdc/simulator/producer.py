"""The server side of DCP, sans-I/O: a test producer serving a simulated bucket (spec §4–§7).

:class:`ProducerCluster` holds what every node shares: the simulated bucket, the vbucket map
(its revision grows on every change), the users and the faults a test asks for.
:class:`ProducerConnection` is one client connection to one node: bytes in
(:meth:`~ProducerConnection.receive_data`), bytes out (:meth:`~ProducerConnection.data_to_send`),
no sockets, no clocks (the driver passes ``now`` to :meth:`~ProducerConnection.on_timer`).
:mod:`dcp_cdc.simulator.server` drives them over asyncio TCP.

Documents and system events become DCP events through the simulator's
:class:`~dcp_cdc.simulator.stream.EventMaker`, and stream requests get the simulator's rollback
decision (:func:`~dcp_cdc.simulator.stream.rollback_point`): one copy of each rule.
"""

from __future__ import annotations

import json
import random
import struct
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from dcp_cdc import layouts
from dcp_cdc.encoder import encode, failover_log_bytes, frame, make_header
from dcp_cdc.errors import ProtocolError, ScramError
from dcp_cdc.events import SeqnoAdvanced, StreamEnd
from dcp_cdc.protocol import (
    HEADER_LEN,
    MAX_BODY_LEN,
    ClientOpcode,
    Datatype,
    DcpOpenFlag,
    HelloFeature,
    Magic,
    Opcode,
    ServerOpcode,
    Status,
    StreamEndReason,
    StreamRequestFlag,
    VbucketState,
    stream_end_reason_name,
)
from dcp_cdc.scram import MECHANISMS, ScramServer, StoredCredential, new_nonce
from dcp_cdc.simulator.bulk import COLLECTION_ID as BULK_COLLECTION_ID
from dcp_cdc.simulator.bulk import BulkDocs
from dcp_cdc.simulator.frames import DocFrames, ValueCache
from dcp_cdc.simulator.model import Item, VBucket
from dcp_cdc.simulator.state import Simulation
from dcp_cdc.simulator.stream import EventMaker, SessionOptions, rollback_point

_HEADER = struct.Struct(">BBHBBHIIQ")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_STREAM_REQ = struct.Struct(">IIQQQQQ")
_VB_SEQNO = struct.Struct(">HQ")
KEY_ENOENT = 0x0001  # CLOSE_STREAM without v7 status codes (spec §6.15)

SUPPORTED_FEATURES = frozenset(
    {
        HelloFeature.TCPNODELAY,
        HelloFeature.XATTR,
        HelloFeature.XERROR,
        HelloFeature.SELECT_BUCKET,
        HelloFeature.SNAPPY,
        HelloFeature.JSON,
        HelloFeature.DUPLEX,
        HelloFeature.CLUSTERMAP_CHANGE_NOTIFICATION,
        HelloFeature.COLLECTIONS,
    }
)
REQUIRED_CONTROLS = frozenset(
    {
        "enable_noop",
        "set_noop_interval",
        "connection_buffer_size",
        "enable_expiry_opcode",
        "send_stream_end_on_client_close_stream",
    }
)
OPTIONAL_CONTROLS = frozenset(
    {
        "v7_dcp_status_codes",
        "supports_cursor_dropping",
        "max_marker_version",
        "enable_out_of_order_snapshots",
        "change_streams",
        "flatbuffers_system_events",
        "force_value_compression",
        "set_priority",
        "backfill_order",
    }
)
CHUNK_ITEMS = 4096
"""Items a stream encodes at a time: a backfill is encoded as flow control lets it out."""
MAX_WRITE = 4 << 20
"""Most stream bytes handed out per call (the flow-control window bounds them too)."""

Run = tuple[bytes, int]
"""Whole frames back to back, and how many: what streams queue and connections send.
A run is cut at a frame boundary when the flow-control window ends inside it."""


def _frames_end(run: bytes, budget: int, most: int) -> tuple[int, int]:
    """(bytes, frames) of the leading whole frames of ``run`` that first reach ``budget``
    bytes, at most ``most`` frames (at least one frame when ``run`` has one)."""
    pos = count = 0
    while pos < len(run) and pos < budget and count < most:
        pos += HEADER_LEN + _U32.unpack_from(run, pos + layouts.BODY_LEN_OFFSET)[0]
        count += 1
    return pos, count


@dataclass
class ProducerStream:
    """One open stream on one connection."""

    vbid: int
    opaque: int
    end_seqno: int
    collection_filter: tuple[int, ...] | None
    sent_upto: int
    backfill: list[Item] = field(default_factory=list)
    backfill_end: int = 0
    pending: list[Item] = field(default_factory=list)
    frames: deque[Run] = field(default_factory=deque)
    marker_sent: bool = False
    ended: bool = False
    bulk_next: int = 0
    """The next bulk document of the vbucket to send (:mod:`dcp_cdc.simulator.bulk`)."""
    bulk_stop: int = 0

    @property
    def backfilling(self) -> bool:
        return bool(self.backfill) or self.bulk_next < self.bulk_stop

    def drop_backfill(self) -> None:
        self.backfill = []
        self.bulk_next = self.bulk_stop


class ProducerCluster:
    """The nodes' shared state: the bucket, the vbucket map, users, and the faults."""

    def __init__(
        self,
        sim: Simulation,
        *,
        nodes: int,
        users: Mapping[str, str],
        refuse_optional_controls: bool = False,
        seed: int = 0,
    ) -> None:
        self.sim = sim
        self.bucket = sim.bucket
        self.nodes = nodes
        self.ports = [0] * nodes
        self.tls_ports: list[int | None] = [None] * nodes
        nvb = len(self.bucket.vbuckets)
        self.vbmap = [vb * nodes // nvb for vb in range(nvb)]
        self.rev = 1
        self.refuse_optional_controls = refuse_optional_controls
        self.rng = random.Random(seed ^ 0x5EED)
        self._passwords = dict(users)
        self._credentials: dict[str, dict[str, StoredCredential]] = {
            user: {
                mech: StoredCredential.make(mech, password, self.rng.randbytes(16), 4096)
                for mech in MECHANISMS
            }
            for user, password in users.items()
        }
        self.connections: list[ProducerConnection] = []
        self.uuid = f"{self.rng.getrandbits(128):032x}"
        self._config_cache: dict[tuple[int, int], bytes] = {}
        self.values = ValueCache()
        self.bulk: BulkDocs | None = None
        """Bulk documents served besides the simulated ones (:meth:`add_bulk`)."""
        """Document values (xattrs joined, Snappy applied) shared by every connection."""
        self.sessions: list[dict[str, object]] = []
        self.peak_unacked = 0
        """The most unacknowledged bytes any flow-controlled connection had out (§7.6)."""
        self.cut_requests: dict[int, int] = {}
        """node → the stream requests its connections may still receive before the next one
        that receives one is reset (:meth:`cut_after_requests`)."""
        self.seqnos_delay_s = 0.0
        """GET_ALL_VB_SEQNOS replies wait this long (:meth:`slow_seqnos`)."""
        sim.feed = self

    # --- users -----------------------------------------------------------------------------

    def add_bulk(self, count: int, body_bytes: int) -> BulkDocs:
        """Add ``count`` bulk documents of ``body_bytes`` to the bucket (benchmarks)."""
        if self.bulk is not None:
            raise ValueError("bulk documents are added once")
        self.bulk = BulkDocs(self.bucket, count, body_bytes)
        return self.bulk

    def credential(self, mechanism: str) -> Callable[[str], StoredCredential | None]:
        return lambda user: self._credentials.get(user, {}).get(mechanism)

    def plain_ok(self, user: str, password: str) -> bool:
        return user in self._passwords and self._passwords[user] == password

    # --- the cluster map -------------------------------------------------------------------

    def owner(self, vbid: int) -> int:
        return self.vbmap[vbid]

    def config(self, node: int) -> bytes:
        """The bucket config as GET_CLUSTER_CONFIG returns it (``$HOST`` for the host).

        gocbcore needs a ``mgmt`` port in every ``nodesExt`` entry and a ``nodes`` array as
        long as ``nodesExt`` (research dcp-clients.md §3); nothing listens on ``mgmt``.
        """
        cached = self._config_cache.get((self.rev, node))
        if cached is not None:
            return cached
        nodes_ext = []
        for i, port in enumerate(self.ports):
            services = {"mgmt": 18091 + i, "kv": port}
            if self.tls_ports[i] is not None:
                services["kvSSL"] = self.tls_ports[i]  # type: ignore[assignment]
            entry: dict[str, object] = {"services": services, "hostname": "$HOST"}
            if i == node:
                entry["thisNode"] = True
            nodes_ext.append(entry)
        cfg = {
            "rev": self.rev,
            "revEpoch": 1,
            "name": self.bucket.name,
            "uuid": self.uuid,
            "nodeLocator": "vbucket",
            "bucketCapabilitiesVer": "",
            "bucketCapabilities": ["collections", "dcp", "cbhello", "xattr", "snappy", "json"],
            "nodes": [
                {"hostname": f"$HOST:{18091 + i}", "ports": {"direct": port}}
                for i, port in enumerate(self.ports)
            ],
            "nodesExt": nodes_ext,
            "vBucketServerMap": {
                "hashAlgorithm": "CRC",
                "numReplicas": 0,
                "serverList": [f"$HOST:{port}" for port in self.ports],
                "vBucketMap": [[owner] for owner in self.vbmap],
            },
        }
        data = json.dumps(cfg).encode()
        self._config_cache[(self.rev, node)] = data
        return data

    def manifest(self) -> bytes:
        """GET_COLLECTIONS_MANIFEST's reply: live scopes and collections, ids in hex."""
        b = self.bucket
        scopes = []
        for scope in b.scopes.values():
            if scope.dropped_uid is not None:
                continue
            colls = []
            for c in b.live_collections():
                if c.scope_id != scope.scope_id:
                    continue
                entry: dict[str, object] = {"name": c.name, "uid": format(c.collection_id, "x")}
                if c.max_ttl:
                    entry["maxTTL"] = c.max_ttl
                colls.append(entry)
            scopes.append(
                {"name": scope.name, "uid": format(scope.scope_id, "x"), "collections": colls}
            )
        return json.dumps({"uid": format(b.manifest_uid, "x"), "scopes": scopes}).encode()

    # --- live changes ----------------------------------------------------------------------

    def on_change(self, vb: VBucket, item: Item) -> None:
        for conn in self.connections:
            stream = conn.streams.get(vb.vbid)
            if stream is not None and not stream.ended:
                stream.pending.append(item)

    def attach(self, conn: ProducerConnection) -> None:
        self.connections.append(conn)

    def detach(self, conn: ProducerConnection) -> None:
        if conn in self.connections:
            self.connections.remove(conn)

    # --- faults ----------------------------------------------------------------------------

    def _end_streams(self, vbid: int, reason: int, *, node: int | None = None) -> int:
        ended = 0
        for conn in self.connections:
            if (node is None or conn.node == node) and vbid in conn.streams:
                conn.end_stream(vbid, reason, flush=reason != StreamEndReason.TOO_SLOW)
                ended += 1
        return ended

    def failover(self, vbid: int, *, lost: int = 12, back: int = 0, grow: int = 0) -> int:
        """A replica takes over ``vbid`` after ``lost`` more changes were streamed: the
        replica had the vbucket up to ``back`` seqnos below the high seqno before them, so
        those ``back`` changes (which consumers may hold from earlier sessions) are gone too.
        A new uuid branch starts there, open streams end (state_changed), and a consumer that
        holds lost changes is told to roll back. Then ``grow`` changes are made on the new
        branch: with ``grow < lost + back`` its high seqno stays below what such a consumer
        holds. Returns the seqno the vbucket was rewound to."""
        vb = self.bucket.vbuckets[vbid]
        point = vb.high_seqno - back
        if back and (not vb.undo or vb.undo[0].seqno > point + 1):
            kept = vb.undo[0].seqno if vb.undo else vb.high_seqno + 1
            raise ValueError(
                f"failover: vbucket {vbid} cannot lose {back} seqnos: its undo log starts at "
                f"seqno {kept} (high seqno {vb.high_seqno})"
            )
        vb.keep_undo_from = point
        live = [k for k, d in vb.docs.items() if not d.deleted and self._live(k[0])]
        for cid, key in live[:lost]:  # changes the consumers see but the new active never had
            self.sim.write_doc(cid, key)
            self.bucket.tick()
        self._end_streams(vbid, StreamEndReason.STATE_CHANGED)
        self.bucket.failover(vb, point)
        live = [k for k, d in vb.docs.items() if not d.deleted and self._live(k[0])]
        for cid, key in live[:grow]:
            self.sim.write_doc(cid, key)
            self.bucket.tick()
        return point

    def _live(self, cid: int) -> bool:
        return self.bucket.collections[cid].dropped_uid is None

    def rebalance(self, vbid: int, to_node: int) -> None:
        """Move ``vbid`` to ``to_node``: map revision +1, streams on the old node end
        (state_changed), the old node answers NOT_MY_VBUCKET, subscribed clients are told."""
        if not 0 <= to_node < self.nodes:
            raise ValueError(f"rebalance: node {to_node} is not one of 0..{self.nodes - 1}")
        old = self.vbmap[vbid]
        if old == to_node:
            return
        self.vbmap[vbid] = to_node
        self.rev += 1
        self._end_streams(vbid, StreamEndReason.STATE_CHANGED, node=old)
        for conn in self.connections:
            conn.notify_config()

    def too_slow(self, vbid: int) -> int:
        """Streams of ``vbid`` end with reason too_slow (a dropped cursor); returns how many."""
        return self._end_streams(vbid, StreamEndReason.TOO_SLOW)

    def drop_collection(self, collection_id: int) -> None:
        """Drop a collection while streaming: an EndCollection in every vbucket; streams
        filtered on it alone then end with filter_empty."""
        self.sim.manifest(lambda: self.bucket.drop_collection(collection_id))

    def cut_after_requests(self, node: int, requests: int) -> None:
        """The connection to ``node`` that receives the ``requests``-th stream request from
        now on is reset (TCP RST) right then, without a reply: a cut while stream requests
        are in flight (a node crash, a proxy dropping the connection)."""
        if requests < 1:
            raise ValueError(f"cut_after_requests: requests must be positive, got {requests}")
        self.cut_requests[node] = requests

    def slow_seqnos(self, seconds: float) -> None:
        """GET_ALL_VB_SEQNOS replies wait ``seconds`` (a loaded node): a consumer's stream
        openers wait on them while its other streams go on and end."""
        self.seqnos_delay_s = max(0.0, seconds)

    def cut_node(self, node: int) -> int:
        """Every connection to ``node`` dies inside its next snapshot (after the marker and
        one item). Changes are made on a vbucket of the node so that a snapshot comes.
        Returns how many connections were armed."""
        armed = 0
        for conn in self.connections:
            if conn.node == node:
                conn.cut_armed = True
                armed += 1
        streamed = {v for c in self.connections if c.node == node for v in c.streams}
        for vbid in sorted(streamed):
            vb = self.bucket.vbuckets[vbid]
            keys = [k for k, d in vb.docs.items() if not d.deleted and self._live(k[0])][:3]
            if len(keys) == 3:
                for cid, key in keys:
                    self.sim.write_doc(cid, key)
                    self.bucket.tick()
                break
        return armed


class ProducerConnection:
    """One client connection to node ``node``: the server's half of the protocol."""

    def __init__(
        self, cluster: ProducerCluster, node: int, *, tls: bool = False, nonce: str | None = None
    ) -> None:
        self.cluster = cluster
        self.node = node
        self.tls = tls
        self._nonce = nonce
        self._inbuf = bytearray()
        self._ctrl: list[bytes] = []
        self._data: deque[Run] = deque()
        self.features: set[int] = set()
        self.user: str | None = None
        self.bucket_selected = False
        self.dcp_name: str | None = None
        self.open_flags = 0
        self.controls: dict[str, str] = {}
        self.refused_controls: list[str] = []
        self.buffer_size = 0
        self.unacked = 0
        self.noop_interval = 0.0
        self._noop_sent_at: float | None = None
        self._noop_outstanding: int | None = None
        self._noop_counter = 0
        self._last_noop = 0.0
        self._scram: ScramServer | None = None
        self._maker: EventMaker | None = None
        self._frames: DocFrames | None = None
        self.streams: dict[int, ProducerStream] = {}
        self._rotation: deque[int] = deque()
        self.delayed: list[tuple[float, tuple[int, ...], bytes]] = []
        """GET_ALL_VB_SEQNOS replies (delay, request, value) the driver sends later
        (:meth:`reply_later`)."""
        self.cut_armed = False
        self._closing = False
        self.closed = False
        self.reset = False
        """With ``closed``: end the connection with a TCP reset, not a close."""
        self.close_reason = ""
        self.bytes_sent = 0
        self.frames_sent = 0
        self._handlers: dict[int, Callable[[tuple[int, ...], bytes, bytes, bytes], None]] = {
            ClientOpcode.HELLO: self._hello,
            ClientOpcode.GET_ERROR_MAP: self._error_map,
            ClientOpcode.SASL_LIST_MECHS: self._list_mechs,
            ClientOpcode.SASL_AUTH: self._sasl_auth,
            ClientOpcode.SASL_STEP: self._sasl_step,
            ClientOpcode.NOOP: self._noop,
            ClientOpcode.SELECT_BUCKET: self._select_bucket,
            ClientOpcode.GET_CLUSTER_CONFIG: self._cluster_config,
            ClientOpcode.GET_COLLECTIONS_MANIFEST: self._collections_manifest,
            ClientOpcode.GET_ALL_VB_SEQNOS: self._all_vb_seqnos,
            Opcode.DCP_OPEN: self._dcp_open,
            Opcode.DCP_CONTROL: self._dcp_control,
            Opcode.DCP_GET_FAILOVER_LOG: self._failover_log,
            Opcode.DCP_STREAM_REQ: self._stream_req,
            Opcode.DCP_CLOSE_STREAM: self._close_stream,
            Opcode.DCP_BUFFER_ACKNOWLEDGEMENT: self._buffer_ack,
        }
        cluster.attach(self)

    # --- bytes in ----------------------------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        """Handle every whole request in ``data`` (plus what was buffered); a malformed one
        raises :class:`ProtocolError` (the driver closes the connection)."""
        buf = self._inbuf
        buf += data
        pos = 0
        while len(buf) - pos >= HEADER_LEN:
            header = _HEADER.unpack_from(buf, pos)
            magic, opcode, key_len, ext_len, _dt, _vb, body_len, opaque, _cas = header
            if body_len > MAX_BODY_LEN or key_len + ext_len > body_len:
                raise ProtocolError(
                    f"node {self.node}: bad request header {bytes(buf[pos : pos + 24]).hex()}"
                )
            end = pos + HEADER_LEN + body_len
            if end > len(buf):
                break
            body = bytes(buf[pos + HEADER_LEN : end])
            pos = end
            extras, key, value = (
                body[:ext_len],
                body[ext_len : ext_len + key_len],
                body[ext_len + key_len :],
            )
            if magic == Magic.CLIENT_RESPONSE:
                if opcode == Opcode.DCP_NOOP and opaque == self._noop_outstanding:
                    self._noop_outstanding = None
                continue  # other responses (to our pushes) need nothing
            if magic != Magic.CLIENT_REQUEST:
                raise ProtocolError(f"node {self.node}: unexpected magic 0x{magic:02x}")
            if self.reset:
                break  # the rest of what arrived is never read: the socket is reset
            handler = self._handlers.get(opcode)
            if handler is None:
                self._reply(header, Status.UNKNOWN_COMMAND)
            elif self.user is None and opcode not in _BEFORE_AUTH:
                self._reply(header, Status.EACCESS)
            else:
                handler(header, extras, key, value)
        del buf[:pos]

    # --- bytes out ---------------------------------------------------------------------------

    def data_to_send(self) -> bytes:
        """Replies and pushes, then stream messages while the consumer's buffer has room
        (spec §7.6: whole frames of every DCP message but NOOP count)."""
        out: list[bytes] = self._ctrl
        self._ctrl = []
        window = self.buffer_size - self.unacked if self.buffer_size else MAX_WRITE
        budget = min(MAX_WRITE, window)
        sent = 0
        data = self._data
        while sent < budget:
            if not data:
                if self._closing or not self._refill():
                    break
                continue
            run, count = data[0]
            if len(run) <= budget - sent:
                data.popleft()
                out.append(run)
                sent += len(run)
                self.frames_sent += count
                continue
            cut, n = _frames_end(run, budget - sent, count)
            data[0] = (run[cut:], count - n)
            out.append(run[:cut])
            sent += cut
            self.frames_sent += n
        if self.buffer_size:
            self.unacked += sent
            if self.unacked > self.cluster.peak_unacked:
                self.cluster.peak_unacked = self.unacked
        if self._closing and not data:
            self.closed = True
        payload = b"".join(out)
        self.bytes_sent += len(payload)
        return payload

    @property
    def has_work(self) -> bool:
        """Whether :meth:`data_to_send` would return something now."""
        if self._ctrl or self.closed:
            return True
        if self.buffer_size and self.unacked >= self.buffer_size:
            return False
        return bool(self._data) or any(self._stream_has_work(s) for s in self.streams.values())

    def _stream_has_work(self, s: ProducerStream) -> bool:
        return bool(s.frames or s.backfilling or (s.pending and not s.ended))

    def on_timer(self, now: float) -> None:
        """The noop clock (spec §6.11): a DCP_NOOP every interval; one left unanswered for
        a whole interval closes the connection."""
        if not self.noop_interval or self.dcp_name is None:
            return
        if self._noop_outstanding is not None:
            assert self._noop_sent_at is not None
            if now - self._noop_sent_at >= self.noop_interval:
                self.closed = True
                self.close_reason = "noop not answered"
            return
        if now - self._last_noop >= self.noop_interval:
            self._noop_counter += 1
            opaque = 0x4E000000 + self._noop_counter
            self._ctrl.append(frame(make_header(Opcode.DCP_NOOP, opaque=opaque), b"", b"", b""))
            self._noop_outstanding = opaque
            self._noop_sent_at = self._last_noop = now

    def notify_config(self) -> None:
        """Push the new cluster map to a client that asked for notifications (magic 0x82)."""
        if HelloFeature.CLUSTERMAP_CHANGE_NOTIFICATION not in self.features:
            return
        h = make_header(ServerOpcode.CLUSTERMAP_CHANGE_NOTIFICATION)._replace(
            magic=Magic.SERVER_REQUEST, datatype=Datatype.JSON
        )
        body = self.cluster.config(self.node)
        self._ctrl.append(
            frame(h, _U32.pack(self.cluster.rev), self.cluster.bucket.name.encode(), body)
        )

    # --- replies -------------------------------------------------------------------------------

    def _reply(
        self,
        req: tuple[int, ...],
        status: int,
        *,
        extras: bytes = b"",
        key: bytes = b"",
        value: bytes = b"",
        datatype: int = 0,
    ) -> None:
        h = make_header(req[1], status=status, opaque=req[7], datatype=datatype)
        self._ctrl.append(frame(h, extras, key, value))

    def reply_later(self, req: tuple[int, ...], value: bytes) -> None:
        """A delayed reply (``delayed``), now; the high seqnos are those of when it was asked."""
        self._reply(req, Status.SUCCESS, value=value)

    def _not_my_vbucket(self, req: tuple[int, ...]) -> None:
        value = self.cluster.config(self.node)
        self._reply(req, Status.NOT_MY_VBUCKET, value=value, datatype=Datatype.JSON)

    # --- handshake (spec §4) -------------------------------------------------------------------

    def _hello(self, req: tuple[int, ...], extras: bytes, key: bytes, value: bytes) -> None:
        asked = [_U16.unpack_from(value, i)[0] for i in range(0, len(value) - 1, 2)]
        self.features = {f for f in asked if f in SUPPORTED_FEATURES}
        self._reply(
            req, Status.SUCCESS, value=b"".join(_U16.pack(f) for f in asked if f in self.features)
        )

    def _error_map(self, req: tuple[int, ...], extras: bytes, key: bytes, value: bytes) -> None:
        errors = {
            format(int(s), "x"): {
                "name": s.name,
                "desc": s.name.lower(),
                "attrs": ["special-handling"],
            }
            for s in Status
            if s != Status.SUCCESS
        }
        body = json.dumps({"version": 1, "revision": 1, "errors": errors}).encode()
        self._reply(req, Status.SUCCESS, value=body, datatype=Datatype.JSON)

    def _mechanisms(self) -> list[str]:
        return [*MECHANISMS, *(["PLAIN"] if self.tls else [])]

    def _list_mechs(self, req: tuple[int, ...], extras: bytes, key: bytes, value: bytes) -> None:
        self._reply(req, Status.SUCCESS, value=" ".join(self._mechanisms()).encode())

    def _sasl_auth(self, req: tuple[int, ...], extras: bytes, key: bytes, value: bytes) -> None:
        mech = key.decode("ascii", "replace")
        if mech == "PLAIN":
            if not self.tls:
                self._reply(req, Status.AUTH_ERROR, value=b"PLAIN is only accepted over TLS")
                return
            parts = value.split(b"\x00")
            if len(parts) == 3 and self.cluster.plain_ok(parts[1].decode(), parts[2].decode()):
                self.user = parts[1].decode()
                self._reply(req, Status.SUCCESS)
            else:
                self._reply(req, Status.AUTH_ERROR, value=b"Authentication failed")
            return
        if mech not in MECHANISMS:
            self._reply(req, Status.AUTH_ERROR, value=f"unknown mechanism {mech}".encode())
            return
        self._scram = ScramServer(mech, self.cluster.credential(mech), self._nonce or new_nonce())
        try:
            server_first = self._scram.first(value)
        except ScramError:
            self._scram = None
            self._reply(req, Status.AUTH_ERROR, value=b"Authentication failed")
            return
        self._reply(req, Status.AUTH_CONTINUE, value=server_first)

    def _sasl_step(self, req: tuple[int, ...], extras: bytes, key: bytes, value: bytes) -> None:
        scram = self._scram
        self._scram = None
        if scram is None:
            self._reply(req, Status.EINVAL, value=b"SASL_STEP without SASL_AUTH")
            return
        try:
            server_final = scram.final(value)
        except ScramError:
            self._reply(req, Status.AUTH_ERROR, value=b"Authentication failed")
            return
        self.user = scram.username
        self._reply(req, Status.SUCCESS, value=server_final)

    def _noop(self, req: tuple[int, ...], extras: bytes, key: bytes, value: bytes) -> None:
        self._reply(req, Status.SUCCESS)

    def _select_bucket(self, req: tuple[int, ...], extras: bytes, key: bytes, value: bytes) -> None:
        if key.decode("utf-8", "replace") != self.cluster.bucket.name:
            self._reply(req, Status.EACCESS)  # as kv_engine: no hint whether the bucket exists
            return
        self.bucket_selected = True
        self._reply(req, Status.SUCCESS)

    def _cluster_config(
        self, req: tuple[int, ...], extras: bytes, key: bytes, value: bytes
    ) -> None:
        if not self.bucket_selected:
            self._reply(req, Status.NO_BUCKET)
            return
        self._reply(
            req, Status.SUCCESS, value=self.cluster.config(self.node), datatype=Datatype.JSON
        )

    def _collections_manifest(
        self, req: tuple[int, ...], extras: bytes, key: bytes, value: bytes
    ) -> None:
        if not self.bucket_selected:
            self._reply(req, Status.NO_BUCKET)
            return
        self._reply(req, Status.SUCCESS, value=self.cluster.manifest(), datatype=Datatype.JSON)

    def _all_vb_seqnos(self, req: tuple[int, ...], extras: bytes, key: bytes, value: bytes) -> None:
        if not self.bucket_selected:
            self._reply(req, Status.NO_BUCKET)
            return
        state = _U32.unpack_from(extras)[0] if len(extras) >= 4 else 0
        cid = _U32.unpack_from(extras, 4)[0] if len(extras) >= 8 else None
        out = []
        for vb in self.cluster.bucket.vbuckets:
            mine = self.cluster.owner(vb.vbid) == self.node
            if state and (state != VbucketState.ACTIVE or not mine):
                continue
            if not state and not mine:
                continue
            seqno = vb.high_seqno if cid is None else _collection_high_seqno(vb, cid)
            bulk = self.cluster.bulk
            if cid == BULK_COLLECTION_ID and bulk is not None and bulk.in_vbucket(vb.vbid):
                seqno = max(seqno, bulk.last_seqno(vb.vbid))
            out.append(_VB_SEQNO.pack(vb.vbid, seqno))
        if self.cluster.seqnos_delay_s:
            self.delayed.append(
                (self.cluster.seqnos_delay_s, req, b"".join(out))
            )  # the driver replies later
            return
        self._reply(req, Status.SUCCESS, value=b"".join(out))

    def _dcp_open(self, req: tuple[int, ...], extras: bytes, key: bytes, value: bytes) -> None:
        if not self.bucket_selected:
            self._reply(req, Status.NO_BUCKET)
            return
        flags = _U32.unpack_from(extras, 4)[0] if len(extras) >= 8 else 0
        if not flags & DcpOpenFlag.PRODUCER:
            self._reply(req, Status.EINVAL, value=b"only producer connections are served")
            return
        self.dcp_name = key.decode("utf-8", "replace")
        self.open_flags = flags
        self.cluster.sessions.append({"name": self.dcp_name, "node": self.node, "flags": flags})
        self._reply(req, Status.SUCCESS)

    def _dcp_control(self, req: tuple[int, ...], extras: bytes, key: bytes, value: bytes) -> None:
        name, setting = key.decode("utf-8", "replace"), value.decode("utf-8", "replace")
        if self.dcp_name is None:
            self._reply(req, Status.EINVAL, value=b"DCP_CONTROL before DCP_OPEN")
            return
        if name in OPTIONAL_CONTROLS and self.cluster.refuse_optional_controls:
            self.refused_controls.append(name)
            self._reply(req, Status.EINVAL)
            return
        if name not in REQUIRED_CONTROLS and name not in OPTIONAL_CONTROLS:
            self.refused_controls.append(name)
            self._reply(req, Status.NOT_SUPPORTED)
            return
        try:
            if name == "connection_buffer_size":
                self.buffer_size = int(setting)
            elif name == "set_noop_interval":
                self.noop_interval = float(int(setting))
        except ValueError:
            self._reply(req, Status.EINVAL, value=f"bad value for {name}".encode())
            return
        self.controls[name] = setting
        self._maker = None
        self._frames = None
        self._reply(req, Status.SUCCESS)

    # --- streams (spec §4.4, §6) ---------------------------------------------------------------

    def _options(self) -> SessionOptions:
        c = self.controls
        delete_times = bool(self.open_flags & DcpOpenFlag.INCLUDE_DELETE_TIMES)
        return SessionOptions(
            session_id=self.dcp_name or "",
            collections=HelloFeature.COLLECTIONS in self.features,
            xattrs=bool(self.open_flags & DcpOpenFlag.INCLUDE_XATTRS),
            snappy=HelloFeature.SNAPPY in self.features,
            delete_times=delete_times,
            expiry_opcode=c.get("enable_expiry_opcode") == "true" and delete_times,
            flatbuffers=c.get("flatbuffers_system_events") == "true",
            change_streams=c.get("change_streams") == "true",
            marker_v2_2=c.get("max_marker_version") == "2.2",
        )

    @property
    def maker(self) -> EventMaker:
        if self._maker is None:
            self._maker = EventMaker(self.cluster.bucket, self._options(), self.cluster.rng)
        return self._maker

    @property
    def frames(self) -> DocFrames:
        if self._frames is None:
            self._frames = DocFrames(self.maker, self.cluster.values)
        return self._frames

    def _failover_log(self, req: tuple[int, ...], extras: bytes, key: bytes, value: bytes) -> None:
        vbid = req[5]
        if not self._owns(vbid):
            self._not_my_vbucket(req)
            return
        log = tuple(self.cluster.bucket.vbuckets[vbid].failover_log)
        self._reply(req, Status.SUCCESS, value=failover_log_bytes(log))

    def _owns(self, vbid: int) -> bool:
        return vbid < len(self.cluster.vbmap) and self.cluster.owner(vbid) == self.node

    def _stream_req(self, req: tuple[int, ...], extras: bytes, key: bytes, value: bytes) -> None:
        vbid, opaque = req[5], req[7]
        left = self.cluster.cut_requests.get(self.node)
        if left is not None:
            if left <= 1:
                del self.cluster.cut_requests[self.node]
                self.closed = self.reset = True
                self.close_reason = "reset while stream requests were in flight"
                return
            self.cluster.cut_requests[self.node] = left - 1
        if self.dcp_name is None or len(extras) != _STREAM_REQ.size:
            self._reply(req, Status.EINVAL)
            return
        if not self._owns(vbid):
            self._not_my_vbucket(req)
            return
        existing = self.streams.get(vbid)
        if existing is not None and not existing.ended:
            self._reply(req, Status.KEY_EEXISTS)
            return
        flags, _reserved, start, end, vb_uuid, snap_start, snap_end = _STREAM_REQ.unpack(extras)
        vb = self.cluster.bucket.vbuckets[vbid]
        if flags & StreamRequestFlag.FROM_LATEST:
            start = snap_start = snap_end = vb.high_seqno
            vb_uuid = vb.uuid
        if flags & StreamRequestFlag.TO_LATEST:
            end = vb.high_seqno
        if start > end or not snap_start <= start <= snap_end:
            self._reply(req, Status.ERANGE)
            return
        known, wanted = self._filter(value)
        if not known:
            self._reply(req, Status.UNKNOWN_COLLECTION)
            return
        rollback = rollback_point(vb, start, vb_uuid, snap_start)
        if rollback is not None:
            self._reply(req, Status.ROLLBACK, value=_U64.pack(rollback))
            return
        self._reply(req, Status.SUCCESS, value=failover_log_bytes(tuple(vb.failover_log)))
        stream = ProducerStream(vbid, opaque, end, wanted, start)
        if vb.high_seqno > start:
            stream.backfill = self.maker.backfill_items(vb, start)
            stream.backfill_end = vb.high_seqno
            self._add_bulk(stream, start)
        self.streams[vbid] = stream
        self._rotation.append(vbid)
        if start >= end:
            self._queue_end(stream, StreamEndReason.OK)

    def _add_bulk(self, stream: ProducerStream, start: int) -> None:
        """The bulk documents above ``start`` join the backfill when the stream sees
        their collection."""
        bulk, vbid = self.cluster.bulk, stream.vbid
        if bulk is None or start >= bulk.last_seqno(vbid):
            return
        wanted = stream.collection_filter
        coll = self.cluster.bucket.collections[BULK_COLLECTION_ID]
        if coll.dropped_uid is not None or (
            wanted is not None and BULK_COLLECTION_ID not in wanted
        ):
            return
        stream.bulk_next = max(0, start - bulk.base_seqno[vbid])
        stream.bulk_stop = bulk.in_vbucket(vbid)

    def _filter(self, value: bytes) -> tuple[bool, tuple[int, ...] | None]:
        """The stream request's collection filter (spec §4.4): (known, collection ids)."""
        if not value:
            return True, None
        try:
            doc = json.loads(value)
        except ValueError:
            return False, None
        b = self.cluster.bucket
        if "collections" in doc:
            ids = tuple(int(c, 16) for c in doc["collections"])
            dead = [i for i in ids if i not in b.collections or b.collections[i].dropped_uid]
            return not dead, ids
        if "scope" in doc:
            sid = int(doc["scope"], 16)
            ids = tuple(c.collection_id for c in b.live_collections() if c.scope_id == sid)
            return sid in b.scopes, ids
        return True, None

    def _close_stream(self, req: tuple[int, ...], extras: bytes, key: bytes, value: bytes) -> None:
        vbid = req[5]
        stream = self.streams.get(vbid)
        if stream is None or stream.ended:
            v7 = self.controls.get("v7_dcp_status_codes") == "true"
            self._reply(req, Status.DCP_STREAM_NOT_FOUND if v7 else KEY_ENOENT)
            return
        self._reply(req, Status.SUCCESS)
        stream.drop_backfill()
        stream.pending = []
        stream.frames.clear()
        if self.controls.get("send_stream_end_on_client_close_stream") == "true":
            self._queue_end(stream, StreamEndReason.CLOSED)
        else:
            stream.ended = True

    def _buffer_ack(self, req: tuple[int, ...], extras: bytes, key: bytes, value: bytes) -> None:
        if len(extras) >= 4:
            self.unacked = max(0, self.unacked - _U32.unpack_from(extras)[0])

    def end_stream(self, vbid: int, reason: int, *, flush: bool = True) -> None:
        """End ``vbid``'s stream with ``reason``; with ``flush`` the changes queued so far
        are sent first (the consumer sees them, as a failover's lost changes)."""
        stream = self.streams.get(vbid)
        if stream is None or stream.ended:
            return
        if flush:
            while not stream.ended and (stream.backfilling or stream.pending):
                stream.frames.extend(self._next_chunk(stream))
            if stream.ended:
                return
        else:
            stream.drop_backfill()
        stream.pending = []
        self._queue_end(stream, reason)

    def _queue_end(self, stream: ProducerStream, reason: int) -> None:
        stream.frames.append((self._end_frame(stream, reason), 1))
        if stream.vbid not in self._rotation:
            self._rotation.append(stream.vbid)

    def _end_frame(self, stream: ProducerStream, reason: int) -> bytes:
        """The STREAM_END frame; nothing more is sent on this stream after it."""
        stream.ended = True
        stream.drop_backfill()
        stream.pending = []
        h = self.maker.header(Opcode.DCP_STREAM_END, stream.vbid, opaque=stream.opaque)
        return encode(StreamEnd(h, reason, stream_end_reason_name(reason)))

    # --- encoding snapshots ------------------------------------------------------------------

    def _refill(self) -> bool:
        """Move the next chunk of some stream's frames into the send queue, streams taking
        turns; False when no stream has anything to send."""
        rotation = self._rotation
        for _ in range(len(rotation)):
            vbid = rotation[0]
            rotation.rotate(-1)
            stream = self.streams.get(vbid)
            if stream is None:
                continue
            if not stream.frames and not stream.ended:
                stream.frames.extend(self._next_chunk(stream))
            if stream.frames:
                runs = stream.frames
                stream.frames = deque()
                if self.cut_armed and sum(count for _run, count in runs) >= 3:
                    joined = b"".join(run for run, _count in runs)
                    cut, _n = _frames_end(joined, len(joined), 2)
                    self._data.append((joined[:cut], 2))  # a marker and one item
                    self.cut_armed = False
                    self._closing = True
                    self.close_reason = "cut mid-snapshot"
                    return True
                self._data.extend(runs)
                return True
        return False

    def _next_chunk(self, stream: ProducerStream) -> list[Run]:
        """Encode the next part of the stream: a slice of its backfill, else its queued live
        changes as one memory snapshot; an end seqno reached ends the stream (OK)."""
        maker = self.maker
        vb = self.cluster.bucket.vbuckets[stream.vbid]
        end = stream.end_seqno
        if stream.backfilling:
            return self._encode_backfill_chunk(stream, vb)
        if not stream.pending:
            return []
        items = [i for i in stream.pending if i.seqno <= end]
        stream.pending = []
        if not items:
            return []
        marker, items = maker.memory_snapshot(vb, items, opaque=stream.opaque)
        body = bytearray()
        count, last = self.frames.items(
            body,
            stream.vbid,
            items,
            disk=False,
            opaque=stream.opaque,
            collection_filter=stream.collection_filter,
        )
        stream.sent_upto = marker.end_seqno
        runs: list[Run] = []
        collections = maker.options.collections
        if count or collections:  # else a non-collection stream just sees a gap
            out = bytearray(encode(marker))
            out += body
            if last != marker.end_seqno and collections:
                h = maker.header(Opcode.DCP_SEQNO_ADVANCED, stream.vbid, opaque=stream.opaque)
                out += encode(SeqnoAdvanced(h, marker.end_seqno))
                count += 1
            runs.append((bytes(out), count + 1))
        return runs + self._after_snapshot(stream, items)

    def _encode_backfill_chunk(self, stream: ProducerStream, vb: VBucket) -> list[Run]:
        """A slice of the disk snapshot taken at the stream request (its marker first)."""
        maker = self.maker
        end = min(stream.backfill_end, stream.end_seqno)
        out = bytearray()
        count = 0
        if not stream.marker_sent:
            stream.marker_sent = True
            out += encode(
                maker.backfill_marker(vb, stream.sent_upto, end=end, opaque=stream.opaque)
            )
            count += 1
        opaque = stream.opaque
        bulk = self.cluster.bulk
        next_bulk = None
        if bulk is not None and stream.bulk_next < stream.bulk_stop:
            next_bulk = bulk.seqno(stream.vbid, stream.bulk_next)
        items: list[Item] = []
        if (
            bulk is not None
            and next_bulk is not None
            and (not stream.backfill or stream.backfill[0].seqno > next_bulk)
        ):  # the bulk documents' turn, in seqno order
            lo = stream.bulk_next
            hi = min(stream.bulk_stop, lo + CHUNK_ITEMS, end - bulk.base_seqno[stream.vbid])
            last = -1
            if hi > lo:
                data, n = bulk.frames(
                    stream.vbid, lo, hi, opaque=opaque, collections=maker.options.collections
                )
                out += data
                count += n
                last = bulk.seqno(stream.vbid, hi - 1)
            stream.bulk_next = hi if hi > lo and last < end else stream.bulk_stop
        else:
            items = stream.backfill[:CHUNK_ITEMS]
            if next_bulk is not None:
                items = [i for i in items if i.seqno < next_bulk]
            del stream.backfill[: len(items)]
            if items and items[-1].seqno > end:
                items = [i for i in items if i.seqno <= end]
            n, last = self.frames.items(
                out, stream.vbid, items, disk=True, opaque=opaque,
                collection_filter=stream.collection_filter,
            )  # fmt: skip
            count += n
        runs: list[Run] = []
        if not stream.backfilling:  # the backfill's last chunk
            if last != end and maker.options.collections:
                h = maker.header(Opcode.DCP_SEQNO_ADVANCED, stream.vbid, opaque=opaque)
                out += encode(SeqnoAdvanced(h, end))
                count += 1
            stream.sent_upto = end
            runs = self._after_snapshot(stream, items)
        return [(bytes(out), count), *runs] if count else runs

    def _after_snapshot(self, stream: ProducerStream, items: Iterable[Item]) -> list[Run]:
        """STREAM_END once the end seqno is reached, or when every filtered collection was
        dropped (filter_empty)."""
        if stream.sent_upto >= stream.end_seqno:
            return [(self._end_frame(stream, StreamEndReason.OK), 1)]
        if stream.collection_filter and all(
            self.cluster.bucket.collections[c].dropped_uid is not None
            for c in stream.collection_filter
        ):
            return [(self._end_frame(stream, StreamEndReason.FILTER_EMPTY), 1)]
        return []


_BEFORE_AUTH = frozenset(
    {
        ClientOpcode.HELLO,
        ClientOpcode.GET_ERROR_MAP,
        ClientOpcode.SASL_LIST_MECHS,
        ClientOpcode.SASL_AUTH,
        ClientOpcode.SASL_STEP,
        ClientOpcode.NOOP,
    }
)


def _collection_high_seqno(vb: VBucket, cid: int) -> int:
    seqnos = [d.seqno for (c, _k), d in vb.docs.items() if c == cid]
    seqnos += [e.seqno for e in vb.sys_events if e.collection_id == cid]
    return max(seqnos, default=0)
