"""The capture agent's sans-I/O consumer core, byte by byte.

Expected frames are written down as hex (docs/protocol/dcp.md §8 examples) or packed here with ``struct``,
never built by the code under test. Every reply is fed three ways (h11's rule): whole, one
byte at a time, and with the first bytes of the next frame trailing.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import settings as settings_
from hypothesis import strategies as st

from dcp_cdc.agent.consumer import ConsumerConnection
from dcp_cdc.agent.consumer_events import (
    NEED_DATA,
    ClusterConfig,
    ClusterStateRecorded,
    ControlRefused,
    HighSeqnos,
    NotMyVbucket,
    Ready,
    StreamEnded,
    StreamOpened,
    StreamRefused,
    StreamRolledBack,
)
from dcp_cdc.agent.handshake import ConsumerSettings
from dcp_cdc.agent.positions import VbPosition
from dcp_cdc.errors import AgentUsageError, AuthenticationError, ProtocolError

H = bytes.fromhex
HEAD = struct.Struct(">BBHBBHIIQ")
NAME = "dcp-cdc:test:s1"
NODE = "10.1.2.3:11210"
VB = 0x0210


def req(
    op: int, opaque: int, *, key: bytes = b"", value: bytes = b"", extras: bytes = b""
) -> bytes:
    body = len(extras) + len(key) + len(value)
    return HEAD.pack(0x80, op, len(key), len(extras), 0, 0, body, opaque, 0) + extras + key + value


def res(op: int, opaque: int, status: int = 0, value: bytes = b"") -> bytes:
    return HEAD.pack(0x81, op, 0, 0, 0, status, len(value), opaque, 0) + value


def settings(**changes: object) -> ConsumerSettings:
    base: dict[str, object] = {
        "node": NODE,
        "bucket": "travel",
        "username": "user",
        "password": "pencil",
        "tls": False,
        "connection_name": NAME,
        "buffer_bytes": 1000,
        "noop_interval_s": 120,
        "nonce": "rOprNGfwEbeRWgbNEkqO",
    }
    base.update(changes)
    return ConsumerSettings(**base)  # type: ignore[arg-type]


# HELLO (0x1f), key = connection name, value = features XATTR 06, XERROR 07, SELECT_BUCKET 08,
# SNAPPY 0a, JSON 0b, DUPLEX 0c, CLUSTERMAP_CHANGE_NOTIFICATION 0d, COLLECTIONS 12
HELLO = H(
    "801f000f00000000" "0000001f00010001" "0000000000000000"
    + NAME.encode().hex()
    + "00060007" "0008000a" "000b000c" "000d0012"
)  # fmt: skip
LIST_MECHS = H("802000000000000000000000000100020000000000000000")
# RFC 7677's SCRAM-SHA-256 example (user "user", password "pencil", this client nonce)
CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
SERVER_FIRST = (
    b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
)
CLIENT_FINAL = (
    b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
CONFIG = {"rev": 7, "name": "travel"}
CONTROLS = [
    (b"enable_noop", b"true"),
    (b"set_noop_interval", b"120"),
    (b"connection_buffer_size", b"1000"),
    (b"enable_expiry_opcode", b"true"),
    (b"send_stream_end_on_client_close_stream", b"true"),
    (b"v7_dcp_status_codes", b"true"),
    (b"supports_cursor_dropping", b"true"),
    (b"max_marker_version", b"2.2"),
    (b"enable_out_of_order_snapshots", b"true_with_seqno_advanced"),
    (b"change_streams", b"true"),
    (b"flatbuffers_system_events", b"true"),
]
FIRST_CONTROL = 0x10008


def handshake(
    control_status: Callable[[bytes], int] = lambda key: 0,
) -> list[tuple[bytes, bytes]]:
    """(what the consumer must send, the server's answer) step by step."""
    hello_reply = res(0x1F, 0x10001, value=H("0006000a000b000c000d0012"))  # no XERROR etc.
    mechs_reply = res(0x20, 0x10002, value=b"SCRAM-SHA256 SCRAM-SHA1 PLAIN")
    steps = [
        (HELLO + LIST_MECHS, hello_reply + mechs_reply),
        (
            req(0x21, 0x10003, key=b"SCRAM-SHA256", value=CLIENT_FIRST),
            res(0x21, 0x10003, 0x21, SERVER_FIRST),
        ),
        (
            req(0x22, 0x10004, key=b"SCRAM-SHA256", value=CLIENT_FINAL),
            res(0x22, 0x10004, 0, SERVER_FINAL),
        ),
        (
            req(0x89, 0x10005, key=b"travel")
            + req(0xB5, 0x10006)
            # DCP_OPEN flags PRODUCER 0x01 | INCLUDE_XATTRS 0x04 | INCLUDE_DELETE_TIMES 0x20
            + req(0x50, 0x10007, key=NAME.encode(), extras=H("0000000000000025")),
            res(0x89, 0x10005) + res(0xB5, 0x10006, value=json.dumps(CONFIG).encode())
            + res(0x50, 0x10007),
        ),
    ]  # fmt: skip
    for i, (key, value) in enumerate(CONTROLS):
        opaque = FIRST_CONTROL + i
        steps.append(
            (req(0x5E, opaque, key=key, value=value), res(0x5E, opaque, control_status(key)))
        )
    return steps


def feed(conn: ConsumerConnection, data: bytes, mode: str) -> None:
    if mode == "bytewise":
        for i in range(len(data)):
            conn.receive_data(data[i : i + 1])
    else:
        conn.receive_data(data)


def feed_each(
    conn: ConsumerConnection, frames: list[bytes], mode: str, after: Callable[[int], object]
) -> None:
    """Feed ``frames`` one by one; "trailing" sends each with the first 7 bytes of the next
    (which must wait), then the rest of the next one."""
    sent = 0
    for i, frame in enumerate(frames):
        if mode == "trailing":
            nxt = frames[i + 1][:7] if i + 1 < len(frames) else b""
            conn.receive_data(frame[sent:] + nxt)
            sent = len(nxt)
        else:
            feed(conn, frame, mode)
        after(i)


def run_handshake(conn: ConsumerConnection, steps: list[tuple[bytes, bytes]], mode: str) -> None:
    def check(i: int) -> None:
        if i + 1 < len(steps):
            assert conn.data_to_send() == steps[i + 1][0], f"step {i + 1}"

    assert conn.data_to_send() == steps[0][0], "step 0"
    feed_each(conn, [answer for _, answer in steps], mode, check)


def events(conn: ConsumerConnection) -> list[object]:
    out = []
    while (event := conn.next_event()) is not NEED_DATA:
        out.append(event)
    return out


FEATURES = (
    "xattr",
    "snappy",
    "json",
    "include_delete_times",
    "expiry_opcode",
    "max_marker_version_2.2",
    "oso",
    "change_streams",
    "flatbuffers_system_events",
)


@pytest.mark.parametrize("mode", ["whole", "bytewise", "trailing"])
def test_handshake_scram_sha256(mode: str) -> None:
    conn = ConsumerConnection(settings())
    run_handshake(conn, handshake(), mode)
    assert events(conn) == [Ready(FEATURES, CONFIG)]
    assert conn.ready and conn.collections
    assert conn.features == FEATURES
    assert conn.data_to_send() == b""
    assert conn.take_capture() == b"", "handshake frames (SASL!) are never recorded"


def test_optional_controls_may_be_refused() -> None:
    conn = ConsumerConnection(settings())
    refused = {b"change_streams": 0x83, b"v7_dcp_status_codes": 0x04}
    run_handshake(conn, handshake(lambda key: refused.get(key, 0)), "whole")
    got = events(conn)
    assert got[:2] == [
        ControlRefused("v7_dcp_status_codes", 4),
        ControlRefused("change_streams", 0x83),
    ]
    assert isinstance(got[2], Ready)
    assert "change_streams" not in got[2].features and "oso" in got[2].features


@pytest.mark.parametrize(
    ("key", "status"), [(b"connection_buffer_size", 0x83), (b"change_streams", 0x86)]
)
def test_a_required_control_refused_or_an_odd_status_is_fatal(key: bytes, status: int) -> None:
    conn = ConsumerConnection(settings())
    with pytest.raises(ProtocolError, match=key.decode()) as info:
        run_handshake(conn, handshake(lambda k: status if k == key else 0), "whole")
    assert NODE in str(info.value)


@pytest.mark.parametrize("step", [1, 2])
def test_auth_error_names_the_node_and_user(step: int) -> None:
    conn = ConsumerConnection(settings())
    steps = handshake()
    expected, _ = steps[step]
    opaque = 0x10003 if step == 1 else 0x10004
    steps[step] = (expected, res(0x21 + step - 1, opaque, 0x20))
    with pytest.raises(AuthenticationError) as info:
        run_handshake(conn, steps[: step + 1], "whole")
    assert info.value.node == NODE
    assert "'user'" in str(info.value) and "pencil" not in str(info.value)


def test_a_server_without_our_password_fails_the_signature() -> None:
    conn = ConsumerConnection(settings())
    steps = handshake()
    steps[2] = (
        steps[2][0],
        res(0x22, 0x10004, 0, b"v=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="),
    )
    with pytest.raises(AuthenticationError, match="signature"):
        run_handshake(conn, steps[:3], "whole")


def test_no_plain_without_tls_and_plain_with_it() -> None:
    conn = ConsumerConnection(settings())
    conn.data_to_send()
    with pytest.raises(AuthenticationError, match="no common SASL mechanism"):
        conn.receive_data(res(0x1F, 0x10001) + res(0x20, 0x10002, value=b"PLAIN"))
    tls = ConsumerConnection(settings(tls=True))
    tls.data_to_send()
    tls.receive_data(res(0x1F, 0x10001) + res(0x20, 0x10002, value=b"SCRAM-SHA512 PLAIN"))
    assert tls.data_to_send() == req(0x21, 0x10003, key=b"PLAIN", value=b"\x00user\x00pencil")
    assert "pencil" not in repr(tls.settings)


def test_with_a_client_certificate_no_sasl_and_the_bucket_after_hello() -> None:
    """The node authenticated the certificate's user in the TLS handshake: HELLO alone, then
    (once its reply says XATTR is on) SELECT_BUCKET and the rest; no password is sent."""
    conn = ConsumerConnection(settings(tls=True, client_certificate=True, password=""))
    assert conn.data_to_send() == HELLO
    conn.receive_data(res(0x1F, 0x10001, value=H("00060012")))  # XATTR, COLLECTIONS
    out = conn.data_to_send()
    assert out.startswith(req(0x89, 0x10002, key=b"travel"))  # SELECT_BUCKET
    assert req(0xB5, 0x10003) in out  # GET_CLUSTER_CONFIG
    # DCP_OPEN: PRODUCER | INCLUDE_XATTRS | INCLUDE_DELETE_TIMES
    assert out.endswith(req(0x50, 0x10004, key=NAME.encode(), extras=H("0000000000000025")))
    assert all(op not in out for op in (b"\x80\x20", b"\x80\x21", b"\x80\x22"))  # no SASL


def ready(**changes: object) -> ConsumerConnection:
    conn = ConsumerConnection(settings(**changes))
    run_handshake(conn, handshake(), "whole")
    assert isinstance(conn.next_event(), Ready)
    return conn


# STREAM_REQ for vb 0x210 from nothing: opaque = vbucket, flags ACTIVE_VB_ONLY (0x10),
# start 0, end "forever", uuid 0, snapshot 0..0 (docs/protocol/dcp.md §4.4)
STREAM_REQ_0 = H(
    "8053000030000210" "0000003000000210" "0000000000000000"
    "00000010" "00000000" "0000000000000000" "ffffffffffffffff"
    "0000000000000000" "0000000000000000" "0000000000000000"
)  # fmt: skip
# its success reply: failover log (0xabcdef, 10), (0x1111, 0), newest first (docs/protocol/dcp.md §6.1)
OPENED = H(
    "8153000000000000" "0000002000000210" "0000000000000000"
    "0000000000abcdef" "000000000000000a" "0000000000001111" "0000000000000000"
)  # fmt: skip
MARKER_4_6 = H(
    "8056000014000210" "0000001400001210" "0000000000000000"
    "0000000000000004" "0000000000000006" "00000005"
)  # fmt: skip
MUTATION_4 = H(
    "805700061f010210" "0000002c00001210" "17a8b0d8e6f40000"
    "0000000000000004" "0000000000000001" "02000006" "00000000" "00000000" "0000" "00"
    "08" "68656c6c6f" "7b2261223a317d"
)  # fmt: skip
DELETION_5 = H(
    "8058000615000210" "0000001b00001210" "17a8b0d8e6f50000"
    "0000000000000005" "0000000000000002" "66a0b3c4" "00" "0868656c6c6f"
)  # fmt: skip
EXPIRATION_6 = H(
    "8059000614000210" "0000001a00001210" "17a8b0d8e6f60000"
    "0000000000000006" "0000000000000003" "66a0b3c4" "0868656c6c6f"
)  # fmt: skip
SEQNO_ADVANCED_12 = H(
    "8064000008000210" "0000000800001210" "0000000000000000" "000000000000000c"
)  # fmt: skip
STREAM_END_OK = H("80550000040002100000000400001210000000000000000000000000")
OSO_START = H("80650000040002100000000400001210000000000000000000000001")
OSO_END = H("80650000040002100000000400001210000000000000000000000002")
NOOP = H("805c000000000000000000000000002a0000000000000000")
NOOP_REPLY = H("815c000000000000000000000000002a0000000000000000")


def marker(start: int, end: int, flags: int = 1) -> bytes:
    return HEAD.pack(0x80, 0x56, 0, 20, 0, VB, 20, VB, 0) + struct.pack(">QQI", start, end, flags)


def opened_stream(**changes: object) -> ConsumerConnection:
    conn = ready(**changes)
    conn.open_stream(VB, None)
    assert conn.data_to_send() == STREAM_REQ_0
    conn.receive_data(OPENED)
    assert events(conn) == [StreamOpened(VB, ((0xABCDEF, 10), (0x1111, 0)))]
    assert conn.take_capture() == STREAM_REQ_0 + OPENED
    conn.consumed(len(STREAM_REQ_0 + OPENED))  # not flow controlled: no ack from these
    assert conn.data_to_send() == b""
    return conn


@pytest.mark.parametrize("mode", ["whole", "bytewise", "trailing"])
def test_positions_move_at_snapshot_ends_only(mode: str) -> None:
    conn = opened_stream()
    steps: list[tuple[bytes, int]] = [
        (MARKER_4_6, 0),  # snapshot 4..6 opened: nothing complete yet
        (MUTATION_4, 0),
        (DELETION_5, 0),
        (EXPIRATION_6, 6),  # the item at the snapshot's end completes it
        (marker(7, 12), 6),
        (SEQNO_ADVANCED_12, 12),  # seqno-advanced to the end completes it
        (marker(13, 20), 12),
        (marker(21, 25), 20),  # the next marker completes the previous snapshot
        (STREAM_END_OK, 25),  # so does STREAM_END OK
    ]
    frames = [frame for frame, _ in steps]
    feed_each(
        conn,
        frames,
        mode,
        lambda i: conn.positions()[VB].seqno == steps[i][1] or pytest.fail(f"after frame {i}"),
    )
    wire = b"".join(frames)
    position = conn.positions()[VB]
    assert position == VbPosition(VB, 25, 0xABCDEF, ((0xABCDEF, 10), (0x1111, 0)))
    assert conn.take_capture() == wire
    assert events(conn) == [StreamEnded(VB, 0, "ok")]
    assert conn.streaming() == frozenset()


@pytest.mark.parametrize("mode", ["whole", "bytewise", "trailing"])
def test_frames_are_counted_and_a_snapshot_end_keeps_its_cas(mode: str) -> None:
    conn = opened_stream()
    before = conn.frames_received
    assert conn.newest_cas(VB) == 0
    steps: list[tuple[bytes, int]] = [
        (MARKER_4_6, 0),
        (MUTATION_4, 0),  # inside the snapshot: not its end
        (DELETION_5, 0),
        (EXPIRATION_6, 0x17A8B0D8E6F60000),  # the end of 4..6: its CAS, written above
        (marker(7, 12), 0x17A8B0D8E6F60000),
        (SEQNO_ADVANCED_12, 0x17A8B0D8E6F60000),  # an end with CAS 0 keeps the one before
        (NOOP, 0x17A8B0D8E6F60000),
    ]
    frames = [frame for frame, _ in steps]
    feed_each(
        conn,
        frames,
        mode,
        lambda i: conn.newest_cas(VB) == steps[i][1] or pytest.fail(f"after frame {i}"),
    )
    assert conn.frames_received - before == 7
    assert conn.newest_cas(VB + 1) == 0


def test_position_uuid_is_the_branch_of_the_seqno() -> None:
    conn = opened_stream()
    conn.receive_data(MARKER_4_6 + MUTATION_4 + DELETION_5 + EXPIRATION_6)
    assert conn.positions()[VB].vb_uuid == 0x1111  # 6 is below the newest entry's seqno 10


def test_oso_snapshot_completes_at_its_end() -> None:
    conn = opened_stream()
    conn.receive_data(OSO_START + DELETION_5 + MUTATION_4 + SEQNO_ADVANCED_12)
    assert conn.positions()[VB].seqno == 0  # inside OSO nothing is consistent
    conn.receive_data(OSO_END)
    assert conn.positions()[VB].seqno == 12
    conn.receive_data(marker(13, 14) + STREAM_END_OK[:-1] + b"\x03")  # ended: disconnected
    assert conn.positions()[VB].seqno == 12  # an unfinished snapshot does not count
    assert events(conn) == [StreamEnded(VB, 3, "disconnected")]


def test_noop_is_answered_and_recorded_in_wire_order() -> None:
    conn = opened_stream()
    conn.receive_data(MARKER_4_6 + NOOP + MUTATION_4[:30])
    assert conn.data_to_send() == NOOP_REPLY
    conn.receive_data(MUTATION_4[30:])
    assert conn.take_capture() == MARKER_4_6 + NOOP + NOOP_REPLY + MUTATION_4


def test_buffer_ack_once_a_fifth_of_the_buffer_is_consumed() -> None:
    conn = opened_stream()  # buffer 1000 bytes: ack at 200
    assert conn.flow_control_unacked == 0
    conn.receive_data(MARKER_4_6 + NOOP + MUTATION_4 + DELETION_5)  # 44 + 68 + 51 counted
    assert conn.flow_control_unacked == 163, "a NOOP is not flow controlled"
    first = conn.take_capture()
    conn.consumed(len(first))
    assert conn.data_to_send() == NOOP_REPLY  # 163 < 200: no ack yet
    assert conn.flow_control_unacked == 163
    conn.receive_data(EXPIRATION_6)  # + 50 = 213
    second = conn.take_capture()
    assert conn.data_to_send() == b"", "nothing is acked before the writer has it"
    conn.consumed(len(second) - 1)
    assert conn.data_to_send() == b""
    assert conn.flow_control_unacked == 213
    conn.consumed(1)
    ack = H("805d00000400000000000004000000000000000000000000000000d5")  # 213
    assert conn.data_to_send() == ack
    assert conn.flow_control_unacked == 0
    assert conn.take_capture() == ack
    with pytest.raises(AgentUsageError):
        conn.consumed(len(ack) + 1)


def test_rollback_prunes_the_log_and_re_requests() -> None:
    conn = ready()
    position = VbPosition(VB, 30, 0xBBBB, ((0xBBBB, 20), (0xAAAA, 0)))
    conn.open_stream(VB, position, end_seqno=40)
    sent = conn.data_to_send()
    assert sent == H(
        "8053000030000210" "0000003000000210" "0000000000000000"
        "00000010" "00000000" "000000000000001e" "0000000000000028"
        "000000000000bbbb" "000000000000001e" "000000000000001e"
    )  # fmt: skip
    rollback = H("8153000000000023000000080000021000000000000000000000000000000011")
    conn.receive_data(rollback)  # roll back to 17: the entry (0xbbbb, 20) is dropped
    assert events(conn) == [StreamRolledBack(VB, 17)]
    again = H(
        "8053000030000210" "0000003000000210" "0000000000000000"
        "00000010" "00000000" "0000000000000011" "0000000000000028"
        "000000000000aaaa" "0000000000000011" "0000000000000011"
    )  # fmt: skip
    assert conn.data_to_send() == again
    assert conn.positions()[VB] == VbPosition(VB, 17, 0xAAAA, ((0xAAAA, 0),))
    assert conn.take_capture() == sent + rollback + again


def test_a_start_past_the_end_asks_the_node_to_judge_the_branch() -> None:
    """A node whose high seqno (40) is below our position (50) has failed over: the request
    still goes out, from 50 to 50, so the node answers ROLLBACK (or ends it at once, OK);
    the re-request after the rollback ends at the end asked for (docs/protocol)."""
    conn = ready()
    position = VbPosition(VB, 50, 0xBBBB, ((0xBBBB, 20), (0xAAAA, 0)))
    conn.open_stream(VB, position, end_seqno=40)
    sent = conn.data_to_send()
    assert sent == H(
        "8053000030000210" "0000003000000210" "0000000000000000"
        "00000010" "00000000" "0000000000000032" "0000000000000032"
        "000000000000bbbb" "0000000000000032" "0000000000000032"
    )  # fmt: skip
    assert conn.requested_end(VB) == 50
    conn.receive_data(res(0x53, VB, 0x23, struct.pack(">Q", 17)))
    assert events(conn) == [StreamRolledBack(VB, 17)]
    again = conn.data_to_send()
    start, end, uuid = struct.unpack_from(">QQQ", again, 24 + 8)
    assert (start, end, uuid) == (17, 40, 0xAAAA)
    assert conn.requested_end(VB) == 40


def test_a_rollback_above_the_end_asked_for_re_requests_up_to_the_rollback_seqno() -> None:
    conn = ready()
    conn.open_stream(VB, VbPosition(VB, 50, 0xBBBB, ((0xBBBB, 0),)), end_seqno=10)
    conn.data_to_send()
    conn.receive_data(res(0x53, VB, 0x23, struct.pack(">Q", 30)))
    start, end = struct.unpack_from(">QQ", conn.data_to_send(), 24 + 8)
    assert (start, end) == (30, 30)  # a stream request must not end before its start


def test_cluster_state_is_recorded_with_its_replies() -> None:
    """GET_ALL_VB_SEQNOS, then DCP_GET_FAILOVER_LOG (opaque = vbucket) for each asked vbucket
    the node holds, all into the capture; one event when the last reply is in."""
    conn = ready()
    conn.record_cluster_state(frozenset({1, 3, 9}))
    seqnos = conn.data_to_send()
    opaque = 0x10008 + len(CONTROLS)
    assert seqnos == req(0x48, opaque, extras=H("00000001"))
    highs = res(
        0x48, opaque, value=H("000100000000000000050003000000000000000700040000000000000002")
    )
    conn.receive_data(highs)
    asks = conn.data_to_send()
    ask_1 = HEAD.pack(0x80, 0x54, 0, 0, 0, 1, 0, 1, 0)
    ask_3 = HEAD.pack(0x80, 0x54, 0, 0, 0, 3, 0, 3, 0)
    assert asks == ask_1 + ask_3  # vbucket 9 is not active here, 4 is not ours
    assert events(conn) == []
    log_1 = res(0x54, 1, value=struct.pack(">QQQQ", 0xBB, 4, 0xAA, 0))
    log_3 = res(0x54, 3, status=0x07)  # moved away meanwhile: recorded as refused
    conn.receive_data(log_1 + log_3)
    assert events(conn) == [ClusterStateRecorded({1: 5, 3: 7, 4: 2}, {1: ((0xBB, 4), (0xAA, 0))})]
    assert conn.take_capture() == seqnos + highs + asks + log_1 + log_3
    with pytest.raises(ProtocolError, match="vbucket 3"):
        conn.receive_data(res(0x54, 3, value=b""))


def test_stream_request_value_carries_filter_and_purge_seqno() -> None:
    conn = ready()
    conn.open_stream(5, VbPosition(5, 9, 1, ((1, 0),), purge_seqno=4), collections=(8, 0x1A))
    value = conn.data_to_send()[24 + 48 :]
    assert json.loads(value) == {"collections": ["8", "1a"], "purge_seqno": "4"}


def test_not_my_vbucket_brings_the_map() -> None:
    conn = ready()
    conn.open_stream(VB, None)
    conn.data_to_send()
    conn.receive_data(res(0x53, VB, 0x07, json.dumps({"rev": 9}).encode()))
    assert events(conn) == [ClusterConfig({"rev": 9}, 9), NotMyVbucket(VB)]
    assert conn.streaming() == frozenset()
    conn.open_stream(VB, None)  # may be requested again
    conn.receive_data(res(0x53, VB, 0x86))
    assert events(conn) == [StreamRefused(VB, 0x86, "etmpfail")]


def test_high_seqnos_and_cluster_config_are_not_recorded() -> None:
    conn = ready()
    assert not conn.asking_high_seqnos
    conn.request_high_seqnos()
    assert conn.asking_high_seqnos  # until the reply: the placement asks no more meanwhile
    assert conn.data_to_send() == req(0x48, 0x10008 + len(CONTROLS), extras=H("00000001"))
    conn.receive_data(
        res(0x48, 0x10008 + len(CONTROLS), value=H("0001000000000000000500030000000000000000"))
    )
    assert not conn.asking_high_seqnos
    conn.request_cluster_config()
    conn.receive_data(res(0xB5, 0x10009 + len(CONTROLS), value=b'{"rev":11}'))
    notification = HEAD.pack(0x82, 0x01, 6, 0, 0, 0, 6 + 10, 0, 0) + b"travel" + b'{"rev":12}'
    conn.receive_data(notification)
    assert events(conn) == [
        HighSeqnos({1: 5, 3: 0}),
        ClusterConfig({"rev": 11}, 11),
        ClusterConfig({"rev": 12}, 12),
    ]
    assert conn.take_capture() == b""


def test_close_stream_then_stream_end_closed() -> None:
    conn = opened_stream()
    conn.close_stream(VB)
    close = conn.data_to_send()
    assert close[:2] == b"\x80\x52" and close[6:8] == b"\x02\x10"
    conn.receive_data(
        res(0x52, struct.unpack_from(">I", close, 12)[0]) + STREAM_END_OK[:-1] + b"\x01"
    )
    assert events(conn) == [StreamEnded(VB, 1, "closed")]
    assert conn.take_capture() == STREAM_END_OK[:-1] + b"\x01"
    conn.close_stream(VB)  # ended already: nothing to do
    assert conn.data_to_send() == b""


@pytest.mark.parametrize(
    "frame",
    [
        MUTATION_4,  # an item of a vbucket without a stream
        H("0855030004000210000000070000121000000000000000002200070000000006"),  # stream ids
        res(0x5E, 0x7777),  # a reply to nothing
    ],
)
def test_unexpected_frames_are_protocol_errors(frame: bytes) -> None:
    conn = ready()
    with pytest.raises(ProtocolError):
        conn.receive_data(frame)


def test_misuse_is_the_callers_error() -> None:
    conn = ConsumerConnection(settings())
    with pytest.raises(AgentUsageError):
        conn.open_stream(1, None)
    conn = opened_stream()
    with pytest.raises(AgentUsageError):
        conn.open_stream(VB, None)


# docs/protocol/dcp.md §8.8: create collection "mycollection" (cid 8, manifest 2, maxTTL 72000) at seqno 7
CREATE_COLLECTION_7 = H(
    "805f000c0d000210000000"
    "2d000012100000000000000000000000000000000700000000016d79636f6c6c656374696f6e"
    "0000000000000002000000000000000800011940"
)


def test_system_event_completes_a_snapshot_and_carries_the_manifest_uid() -> None:
    conn = opened_stream()
    conn.receive_data(marker(7, 7) + CREATE_COLLECTION_7)
    assert conn.positions()[VB] == VbPosition(
        VB, 7, 0x1111, ((0xABCDEF, 10), (0x1111, 0)), manifest_uid=2
    )


def _fuzz_frames() -> st.SearchStrategy[bytes]:
    """Frames of a streaming connection with random fields: opcodes, lengths, bodies."""
    frame = st.builds(
        lambda magic, op, ext, vb, body: (
            HEAD.pack(magic, op, 0, ext, 0, vb, len(body), vb, 0) + body
        ),
        st.sampled_from([0x80, 0x80, 0x80, 0x81, 0x82, 0x08, 0x18, 0x00]),
        st.integers(0x50, 0x68) | st.sampled_from([0x01, 0x1F, 0xB5]),
        st.sampled_from([0, 1, 4, 8, 13, 18, 20, 21, 31, 60]),
        st.sampled_from([VB, VB, 3]),
        st.binary(max_size=80),
    )
    return st.lists(frame, max_size=8).map(b"".join)


@settings_(max_examples=150, deadline=None)
@given(data=_fuzz_frames(), cut=st.integers(1, 64))
def test_random_frames_decode_or_raise_the_typed_error(data: bytes, cut: int) -> None:
    conn = opened_stream()
    conn.receive_data(MARKER_4_6)
    try:
        for i in range(0, len(data), cut):
            conn.receive_data(data[i : i + cut])
            conn.take_capture()
            conn.positions()
            events(conn)
    except ProtocolError:
        pass
