"""The first part of a capture agent's DCP connection, sans-I/O: the requests we send with the
handler of each reply (:meth:`Handshake._command`), and the handshake itself: HELLO, SASL
(PLAIN over TLS, else SCRAM via :mod:`dcp_cdc.scram`; none with a client certificate),
SELECT_BUCKET, GET_CLUSTER_CONFIG, DCP_OPEN and the DCP_CONTROLs (docs/protocol/dcp.md §4),
which ends in :class:`Ready`.

:class:`~dcp_cdc.agent.consumer.ConsumerConnection` extends :class:`Handshake` with the
streams; the seam is the ``ready`` flag: nothing here knows a vbucket. None of these frames
is recorded into the capture (secrets), except a command sent with ``recorded=True``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dcp_cdc.agent.consumer_events import AgentEvent, ControlRefused, Ready
from dcp_cdc.agent.consumer_wire import (
    COMMAND_OPAQUE_BASE,
    MAGIC_REQ,
    U32,
    make_frame,
    parse_config,
)
from dcp_cdc.errors import AgentUsageError, AuthenticationError, ProtocolError, ScramError
from dcp_cdc.protocol import ClientOpcode, DcpOpenFlag, HelloFeature, Opcode, Status, status_name
from dcp_cdc.scram import MECHANISMS, ScramClient, new_nonce


@dataclass(frozen=True)
class ConsumerSettings:
    node: str
    """``host:port``: only a label for errors."""
    bucket: str
    username: str
    password: str = field(repr=False)
    tls: bool
    """PLAIN is used only over TLS; otherwise SCRAM-SHA512 > SHA256 > SHA1."""
    connection_name: str
    client_certificate: bool = False
    """The TLS connection presented a client certificate: the node authenticated the user
    the certificate maps to, so no SASL is sent (a node refuses SASL on such a connection:
    it would change the connection's user)."""
    buffer_bytes: int = 16 << 20
    """connection_buffer_size. BUFFER_ACK once 20 % of it is consumed (kv_engine's
    recommended-apis.md suggests 20 %; gocbcore acks at 50 %, java-dcp-client at 80 %)."""
    noop_interval_s: int = 120
    collections: bool = True
    nonce: str | None = field(default=None, repr=False)
    """The SCRAM client nonce; tests fix it, None = random."""


_HELLO_FEATURES = {
    HelloFeature.XATTR: "xattr",
    HelloFeature.XERROR: None,
    HelloFeature.SELECT_BUCKET: None,
    HelloFeature.SNAPPY: "snappy",
    HelloFeature.JSON: "json",
    HelloFeature.DUPLEX: None,
    HelloFeature.CLUSTERMAP_CHANGE_NOTIFICATION: None,
    HelloFeature.COLLECTIONS: None,
}
"""HELLO features we ask for → their capture-header feature name (None: not a feature of the
frames; collections has its own header field)."""


@dataclass(frozen=True, slots=True)
class _Control:
    key: str
    value: str
    required: bool
    feature: str | None = None


_REFUSALS = frozenset({Status.EINVAL, Status.NOT_SUPPORTED})

Handler = Callable[[int, bytes, bytes], None]  # (status, extras, value)


class Handshake:
    """Commands and their replies, and the handshake up to :class:`Ready`."""

    def __init__(self, settings: ConsumerSettings) -> None:
        self.settings = settings
        self.features: tuple[str, ...] = ()
        self.collections = False
        self.ready = False
        self._features: list[str] = []
        self._hello_accepted: set[int] = set()
        self._out: list[bytes] = []
        self._events: deque[AgentEvent] = deque()
        self._capture: list[bytes] = []
        self._pending: dict[int, tuple[str, Handler, bool]] = {}
        self._opaque = COMMAND_OPAQUE_BASE
        self._scram: ScramClient | None = None
        self._mechanism = ""
        self._controls: list[_Control] = []
        self._cluster_config: dict[str, Any] = {}

    def _command(
        self,
        name: str,
        handler: Handler,
        opcode: int,
        *,
        word: int = 0,
        extras: bytes = b"",
        key: bytes = b"",
        value: bytes = b"",
        recorded: bool = False,
    ) -> None:
        """Send a request whose reply goes to ``handler``; ``recorded`` keeps both in the
        capture."""
        self._opaque += 1
        self._pending[self._opaque] = (name, handler, recorded)
        req = make_frame(
            MAGIC_REQ, opcode, word=word, opaque=self._opaque, extras=extras, key=key, value=value
        )
        self._out.append(req)
        if recorded:
            self._capture.append(req)

    def _check(self, status: int, what: str) -> None:
        if status != Status.SUCCESS:
            raise ProtocolError(f"{what} failed on {self.settings.node}: {status_name(status)}")

    def _require_ready(self, what: str) -> None:
        if not self.ready:
            raise AgentUsageError(f"{what} before the handshake finished")

    def _hello(self) -> None:
        wanted: list[HelloFeature] = [f for f in _HELLO_FEATURES if f != HelloFeature.COLLECTIONS]
        if self.settings.collections:
            wanted.append(HelloFeature.COLLECTIONS)
        self._command(
            "hello",
            self._hello_reply,
            ClientOpcode.HELLO,
            key=self.settings.connection_name.encode(),
            value=b"".join(int(f).to_bytes(2, "big") for f in wanted),
        )
        if not self.settings.client_certificate:  # else the node knows the user already
            self._command("sasl_list_mechs", self._mechs_reply, ClientOpcode.SASL_LIST_MECHS)

    def _hello_reply(self, status: int, extras: bytes, value: bytes) -> None:
        self._check(status, "HELLO")
        if len(value) % 2:
            raise ProtocolError(f"HELLO reply of {len(value)} bytes: not u16 features")
        accepted = {int.from_bytes(value[i : i + 2], "big") for i in range(0, len(value), 2)}
        self._hello_accepted = accepted
        self.collections = HelloFeature.COLLECTIONS in accepted
        for feature, name in _HELLO_FEATURES.items():
            if name and feature in accepted:
                self._features.append(name)
        if self.settings.client_certificate:  # DCP_OPEN's flags depend on HELLO's reply
            self._select_bucket()

    def _mechs_reply(self, status: int, extras: bytes, value: bytes) -> None:
        self._check(status, "SASL_LIST_MECHS")
        offered = value.decode("ascii", "replace").split()
        s = self.settings
        choices = [m for m in MECHANISMS if m in offered]
        if s.tls and "PLAIN" in offered:
            choices.insert(0, "PLAIN")  # over TLS, as java-dcp-client (works with LDAP users)
        if not choices:
            raise AuthenticationError(
                s.node, f"no common SASL mechanism (the server offers {offered})"
            )
        self._mechanism = choices[0]
        if self._mechanism == "PLAIN":
            first = b"\x00" + s.username.encode() + b"\x00" + s.password.encode()
        else:
            self._scram = ScramClient(
                self._mechanism, s.username, s.password, s.nonce or new_nonce()
            )
            first = self._scram.first()
        self._command(
            "sasl_auth",
            self._auth_reply,
            ClientOpcode.SASL_AUTH,
            key=self._mechanism.encode(),
            value=first,
        )

    def _auth_failed(self, status: int) -> None:
        if status in (Status.AUTH_ERROR, Status.EACCESS):
            raise AuthenticationError(
                self.settings.node,
                f"authentication of user {self.settings.username!r} failed "
                f"({self._mechanism}, {status_name(status)})",
            )
        self._check(status, f"SASL ({self._mechanism})")

    def _auth_reply(self, status: int, extras: bytes, value: bytes) -> None:
        if status == Status.AUTH_CONTINUE and self._scram is not None:
            try:
                final = self._scram.final(value)
            except ScramError as exc:
                raise AuthenticationError(self.settings.node, str(exc)) from None
            self._command(
                "sasl_step",
                self._step_reply,
                ClientOpcode.SASL_STEP,
                key=self._mechanism.encode(),
                value=final,
            )
            return
        if status == Status.SUCCESS and self._scram is None:
            self._select_bucket()
            return
        self._auth_failed(status)
        raise ProtocolError(f"SASL_AUTH: unexpected {status_name(status)} on {self.settings.node}")

    def _step_reply(self, status: int, extras: bytes, value: bytes) -> None:
        if status != Status.SUCCESS:
            self._auth_failed(status)
        assert self._scram is not None
        try:
            self._scram.verify(value)
        except ScramError as exc:
            raise AuthenticationError(self.settings.node, str(exc)) from None
        self._scram = None
        self._select_bucket()

    def _select_bucket(self) -> None:
        bucket = self.settings.bucket.encode()
        self._command("select_bucket", self._bucket_reply, ClientOpcode.SELECT_BUCKET, key=bucket)
        self._command("get_cluster_config", self._first_config, ClientOpcode.GET_CLUSTER_CONFIG)
        flags = DcpOpenFlag.PRODUCER | DcpOpenFlag.INCLUDE_DELETE_TIMES
        if HelloFeature.XATTR in self._hello_accepted:
            flags |= DcpOpenFlag.INCLUDE_XATTRS
        self._command(
            "dcp_open",
            self._open_reply,
            Opcode.DCP_OPEN,
            extras=U32.pack(0) + U32.pack(flags),
            key=self.settings.connection_name.encode(),
        )

    def _bucket_reply(self, status: int, extras: bytes, value: bytes) -> None:
        if status == Status.EACCESS:
            hint = ""
            if self.settings.client_certificate:
                hint = (
                    " (does the cluster authenticate by client certificates, and has that "
                    "user the Data DCP Reader role on the bucket?)"
                )
            raise AuthenticationError(
                self.settings.node,
                f"{self._who()} may not access bucket {self.settings.bucket!r}{hint}",
            )
        if status != Status.SUCCESS:
            raise ProtocolError(
                f"SELECT_BUCKET {self.settings.bucket!r} failed on {self.settings.node}: "
                f"{status_name(status)}"
            )

    def _who(self) -> str:
        """The user, as messages name it."""
        s = self.settings
        if not s.client_certificate:
            return f"user {s.username!r}"
        named = f" ({s.username!r} by the configuration)" if s.username else ""
        return f"the user of the client certificate{named}"

    def _first_config(self, status: int, extras: bytes, value: bytes) -> None:
        self._check(status, "GET_CLUSTER_CONFIG")
        self._cluster_config = parse_config(value, "GET_CLUSTER_CONFIG")

    def _open_reply(self, status: int, extras: bytes, value: bytes) -> None:
        self._check(status, "DCP_OPEN")
        self._features.append("include_delete_times")
        s = self.settings
        controls = [
            _Control("enable_noop", "true", True),
            _Control("set_noop_interval", str(s.noop_interval_s), True),
            _Control("connection_buffer_size", str(s.buffer_bytes), True),
            _Control("enable_expiry_opcode", "true", True, "expiry_opcode"),
            _Control("send_stream_end_on_client_close_stream", "true", True),
            _Control("v7_dcp_status_codes", "true", False),
            _Control("supports_cursor_dropping", "true", False),
        ]
        if self.collections:
            controls += [
                _Control("max_marker_version", "2.2", False, "max_marker_version_2.2"),
                _Control("enable_out_of_order_snapshots", "true_with_seqno_advanced", False, "oso"),
                _Control("change_streams", "true", False, "change_streams"),
                _Control("flatbuffers_system_events", "true", False, "flatbuffers_system_events"),
            ]
        self._controls = controls
        self._next_control()

    def _next_control(self) -> None:
        if not self._controls:
            self.ready = True
            self.features = tuple(self._features)
            self._events.append(Ready(self.features, self._cluster_config))
            return
        control = self._controls[0]
        self._command(
            "dcp_control",
            self._control_reply,
            Opcode.DCP_CONTROL,
            key=control.key.encode(),
            value=control.value.encode(),
        )

    def _control_reply(self, status: int, extras: bytes, value: bytes) -> None:
        control = self._controls.pop(0)
        if status == Status.SUCCESS:
            if control.feature:
                self._features.append(control.feature)
        elif not control.required and status in _REFUSALS:
            self._events.append(ControlRefused(control.key, status))
        else:
            raise ProtocolError(
                f"DCP_CONTROL {control.key}={control.value} refused by {self.settings.node}: "
                f"{status_name(status)}" + (" (a required control)" if control.required else "")
            )
        self._next_control()
