"""The test producer's connection, its first half, sans-I/O (:class:`ProducerCommands`): the
framing of client requests (:meth:`~ProducerCommands.receive_data`), replies, the handshake
(HELLO, SASL, SELECT_BUCKET, DCP_OPEN, DCP_CONTROL; docs/protocol/dcp.md §4), the cluster map, collections
manifest and high seqno queries, the noop clock (docs/protocol/dcp.md §6.11) and cluster map pushes.

:class:`~dcp_cdc.simulator.producer.ProducerConnection` extends it with the streams (stream
requests, flow control, scheduling): the seam is DCP_OPEN's state, which this half sets and
the streams read.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable

from dcp_cdc.encoder import frame, make_header
from dcp_cdc.errors import ProtocolError, ScramError
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
    VbucketState,
)
from dcp_cdc.scram import MECHANISMS, ScramServer, new_nonce
from dcp_cdc.simulator.cluster import ProducerCluster
from dcp_cdc.simulator.frames import DocFrames
from dcp_cdc.simulator.model import VBucket
from dcp_cdc.simulator.stream import EventMaker

_HEADER = struct.Struct(">BBHBBHIIQ")
_RESPONSE = int(Magic.CLIENT_RESPONSE)
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_VB_SEQNO = struct.Struct(">HQ")

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

Handler = Callable[[tuple[int, ...], bytes, bytes, bytes], None]
"""A request's handler: (header fields, extras, key, value)."""


class ProducerCommands:
    """One client connection's requests and replies, apart from its streams."""

    def __init__(
        self, cluster: ProducerCluster, node: int, *, tls: bool = False, nonce: str | None = None
    ) -> None:
        self.cluster = cluster
        self.node = node
        self.tls = tls
        self._nonce = nonce
        self._inbuf = bytearray()
        self._ctrl: list[bytes] = []
        self.features: set[int] = set()
        self.user: str | None = None
        self.by_certificate = False
        """Authenticated by a client certificate (:meth:`authenticate_by_certificate`): SASL
        is refused, as kv_engine does, since it would change the connection's user."""
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
        self._handlers: dict[int, Handler] = {
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
        }

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

    def on_timer(self, now: float) -> None:
        """The noop clock (docs/protocol/dcp.md §6.11): a DCP_NOOP every interval; one left unanswered for
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
        body_len = len(extras) + len(key) + len(value)  # as encoder.frame packs it, in one call
        head = _HEADER.pack(
            _RESPONSE, req[1], len(key), len(extras), datatype, status, body_len, req[7], 0
        )
        self._ctrl.append(head + extras + key + value)

    def reply_later(self, req: tuple[int, ...], value: bytes) -> None:
        """A delayed reply (``delayed``), now; the high seqnos are those of when it was asked."""
        self._reply(req, Status.SUCCESS, value=value)

    def _not_my_vbucket(self, req: tuple[int, ...]) -> None:
        value = self.cluster.config(self.node)
        self._reply(req, Status.NOT_MY_VBUCKET, value=value, datatype=Datatype.JSON)

    # --- handshake (docs/protocol/dcp.md §4) -------------------------------------------------------------------

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

    def authenticate_by_certificate(self, user: str) -> None:
        """The TLS handshake's client certificate mapped to ``user``: the connection is that
        user's from its first request, and SASL is refused."""
        self.user = user
        self.by_certificate = True

    def _sasl_refused(self, req: tuple[int, ...]) -> bool:
        if self.by_certificate:
            self._reply(req, Status.NOT_SUPPORTED)
        return self.by_certificate

    def _mechanisms(self) -> list[str]:
        return [*MECHANISMS, *(["PLAIN"] if self.tls else [])]

    def _list_mechs(self, req: tuple[int, ...], extras: bytes, key: bytes, value: bytes) -> None:
        if self._sasl_refused(req):
            return
        self._reply(req, Status.SUCCESS, value=" ".join(self._mechanisms()).encode())

    def _sasl_auth(self, req: tuple[int, ...], extras: bytes, key: bytes, value: bytes) -> None:
        if self._sasl_refused(req):
            return
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
        if self._sasl_refused(req):
            return
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
        vbmap, node, bulk = self.cluster.vbmap, self.node, self.cluster.bulk
        # this node's vbuckets, all active (the simulator keeps no replicas)
        mine = [] if state not in (0, VbucketState.ACTIVE) else self.cluster.bucket.vbuckets
        mine = [vb for vb in mine if vbmap[vb.vbid] == node]
        if cid is None:
            out = [_VB_SEQNO.pack(vb.vbid, vb.high_seqno) for vb in mine]
        else:
            out = []
            for vb in mine:
                seqno = _collection_high_seqno(vb, cid)
                if bulk is not None:
                    seqno = max(seqno, bulk.collection_last_seqno(vb.vbid, cid))
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


def _collection_high_seqno(vb: VBucket, cid: int) -> int:
    seqnos = [d.seqno for (c, _k), d in vb.docs.items() if c == cid]
    seqnos += [e.seqno for e in vb.sys_events if e.collection_id == cid]
    return max(seqnos, default=0)
