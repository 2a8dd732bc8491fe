"""The sans-I/O test producer, byte by byte: handshake replies, SASL, controls, rollback
decisions, NOT_MY_VBUCKET, flow control, stream ends and the faults."""

from __future__ import annotations

import json
import struct

import pytest

from dcp_cdc.decoder import iter_decode
from dcp_cdc.encoder import frame, make_header
from dcp_cdc.events import Mutation, SeqnoAdvanced, StreamEnd
from dcp_cdc.protocol import ClientOpcode, Datatype, HelloFeature, Magic, Opcode, Status
from dcp_cdc.scram import ScramClient
from dcp_cdc.simulator.cluster import ProducerCluster
from dcp_cdc.simulator.producer import ProducerConnection
from dcp_cdc.simulator.state import SimConfig, Simulation

HDR = struct.Struct(">BBHBBHIIQ")
USER, PASSWORD = "reader", "pa55word"


def req(
    opcode: int,
    *,
    vb: int = 0,
    opaque: int = 0,
    extras: bytes = b"",
    key: bytes = b"",
    value: bytes = b"",
) -> bytes:
    return frame(make_header(opcode, vbucket=vb, opaque=opaque), extras, key, value)


def frames(data: bytes) -> list[tuple[int, int, int, int, bytes, bytes, bytes]]:
    """(magic, opcode, status_or_vb, opaque, extras, key, value) of each frame."""
    out = []
    pos = 0
    while pos < len(data):
        magic, op, klen, elen, _dt, word, blen, opaque, _cas = HDR.unpack_from(data, pos)
        body = data[pos + 24 : pos + 24 + blen]
        out.append(
            (magic, op, word, opaque, body[:elen], body[elen : elen + klen], body[elen + klen :])
        )
        pos += 24 + blen
    assert pos == len(data)
    return out


@pytest.fixture
def cluster() -> ProducerCluster:
    sim = Simulation(SimConfig(seed=5, vbuckets=8, docs=200, ops=0))
    sim.setup()
    c = ProducerCluster(sim, nodes=2, users={USER: PASSWORD})
    c.ports[:] = [11210, 11211]
    return c


def handshake(
    cluster: ProducerCluster,
    *,
    node: int = 0,
    password: str = PASSWORD,
    controls: tuple[tuple[str, str], ...] = (),
) -> tuple[ProducerConnection, list]:
    conn = ProducerConnection(cluster, node, nonce="servernonce")
    client = ScramClient("SCRAM-SHA512", USER, password, "clientnonce")
    feats = b"".join(
        struct.pack(">H", f) for f in (HelloFeature.COLLECTIONS, HelloFeature.XATTR, 0x7777)
    )
    conn.receive_data(
        req(ClientOpcode.HELLO, opaque=1, key=b"test", value=feats)
        + req(ClientOpcode.SASL_LIST_MECHS, opaque=2)
        + req(ClientOpcode.SASL_AUTH, opaque=3, key=b"SCRAM-SHA512", value=client.first())
    )
    replies = frames(conn.data_to_send())
    server_first = replies[2][6]
    conn.receive_data(
        req(ClientOpcode.SASL_STEP, opaque=4, key=b"SCRAM-SHA512", value=client.final(server_first))
    )
    replies += frames(conn.data_to_send())
    if replies[3][2] != Status.SUCCESS:
        return conn, replies
    client.verify(replies[3][6])
    conn.receive_data(
        req(ClientOpcode.SELECT_BUCKET, opaque=5, key=cluster.bucket.name.encode())
        + req(Opcode.DCP_OPEN, opaque=6, extras=struct.pack(">II", 0, 0x25), key=b"test")
        + b"".join(
            req(Opcode.DCP_CONTROL, opaque=7 + i, key=k.encode(), value=v.encode())
            for i, (k, v) in enumerate(controls)
        )
    )
    replies += frames(conn.data_to_send())
    return conn, replies


def stream_req(
    vb: int, *, start: int = 0, uuid: int = 0, end: int = 2**64 - 1, opaque: int = 99
) -> bytes:
    return req(
        Opcode.DCP_STREAM_REQ,
        vb=vb,
        opaque=opaque,
        extras=struct.pack(">IIQQQQQ", 0, 0, start, end, uuid, start, start),
    )


def test_handshake_replies_in_order(cluster: ProducerCluster) -> None:
    conn, replies = handshake(cluster, controls=(("enable_noop", "true"), ("bogus", "1")))
    assert [r[3] for r in replies] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert replies[0][:3] == (Magic.CLIENT_RESPONSE, ClientOpcode.HELLO, Status.SUCCESS)
    assert replies[0][6] == struct.pack(">HH", HelloFeature.COLLECTIONS, HelloFeature.XATTR)
    assert replies[1][6] == b"SCRAM-SHA512 SCRAM-SHA256 SCRAM-SHA1"  # no PLAIN in clear
    assert replies[2][2] == Status.AUTH_CONTINUE
    assert [r[2] for r in replies[3:7]] == [Status.SUCCESS] * 4
    assert replies[7][2] == Status.NOT_SUPPORTED and conn.refused_controls == ["bogus"]


def test_wrong_password_is_auth_error(cluster: ProducerCluster) -> None:
    conn, replies = handshake(cluster, password="wrong")
    assert replies[3][2] == Status.AUTH_ERROR and conn.user is None
    conn.receive_data(req(ClientOpcode.SELECT_BUCKET, opaque=9, key=b"travel-sample"))
    assert frames(conn.data_to_send())[0][2] == Status.EACCESS


def test_plain_only_over_tls(cluster: ProducerCluster) -> None:
    clear = ProducerConnection(cluster, 0)
    clear.receive_data(
        req(ClientOpcode.SASL_AUTH, key=b"PLAIN", value=f"\0{USER}\0{PASSWORD}".encode())
    )
    assert frames(clear.data_to_send())[0][2] == Status.AUTH_ERROR
    tls = ProducerConnection(cluster, 0, tls=True)
    tls.receive_data(
        req(ClientOpcode.SASL_AUTH, key=b"PLAIN", value=f"\0{USER}\0{PASSWORD}".encode())
    )
    assert frames(tls.data_to_send())[0][2] == Status.SUCCESS and tls.user == USER


def test_optional_controls_can_be_refused(cluster: ProducerCluster) -> None:
    cluster.refuse_optional_controls = True
    _conn, replies = handshake(
        cluster, controls=(("enable_noop", "true"), ("change_streams", "true"))
    )
    assert [r[2] for r in replies[-2:]] == [Status.SUCCESS, Status.EINVAL]


def test_not_my_vbucket_carries_the_config(cluster: ProducerCluster) -> None:
    conn, _ = handshake(cluster, node=0)
    foreign = next(vb for vb in range(8) if cluster.owner(vb) == 1)
    conn.receive_data(stream_req(foreign))
    (reply,) = frames(conn.data_to_send())
    assert reply[2] == Status.NOT_MY_VBUCKET
    config = json.loads(reply[6])
    assert config["vBucketServerMap"]["vBucketMap"][foreign] == [1]
    assert all("mgmt" in n["services"] for n in config["nodesExt"])


def test_rollback_decisions(cluster: ProducerCluster) -> None:
    conn, _ = handshake(cluster)
    vb = cluster.bucket.vbuckets[0]
    high, uuid = vb.high_seqno, vb.uuid
    conn.receive_data(stream_req(0, start=high + 5, uuid=uuid, opaque=1))  # ahead of history
    conn.receive_data(stream_req(0, start=3, uuid=12345, opaque=2))  # unknown uuid
    replies = frames(conn.data_to_send())
    assert [(r[2], r[6]) for r in replies] == [
        (Status.ROLLBACK, struct.pack(">Q", high)),
        (Status.ROLLBACK, struct.pack(">Q", 0)),
    ]
    conn.receive_data(stream_req(0, start=high, uuid=uuid, opaque=3))
    ok = frames(conn.data_to_send())[0]
    assert ok[2] == Status.SUCCESS and ok[6] == struct.pack(">QQ", uuid, 0)
    conn.receive_data(stream_req(0, start=high, uuid=uuid, opaque=4))
    assert frames(conn.data_to_send())[0][2] == Status.KEY_EEXISTS


def test_failover_makes_the_next_request_roll_back(cluster: ProducerCluster) -> None:
    conn, _ = handshake(cluster)
    vb = cluster.bucket.vbuckets[0]
    old_uuid = vb.uuid
    conn.receive_data(stream_req(0, opaque=7))
    conn.data_to_send()
    point = cluster.failover(0, lost=3)
    sent = frames(conn.data_to_send())
    assert sent[-1][1] == Opcode.DCP_STREAM_END and sent[-1][4] == struct.pack(">I", 2)
    assert (
        max(struct.unpack_from(">Q", f[4])[0] for f in sent if f[1] == Opcode.DCP_MUTATION) > point
    )
    conn.receive_data(stream_req(0, start=point + 3, uuid=old_uuid, opaque=8))
    assert frames(conn.data_to_send())[0][2:7:4] == (Status.ROLLBACK, struct.pack(">Q", point))


def test_flow_control_stops_and_resumes(cluster: ProducerCluster) -> None:
    conn, _ = handshake(cluster, controls=(("connection_buffer_size", "2000"),))
    conn.receive_data(stream_req(0, opaque=7))
    first = frames(conn.data_to_send())
    sent = sum(24 + len(f[4]) + len(f[5]) + len(f[6]) for f in first[1:])
    assert 2000 <= sent < 2000 + 1024 and conn.unacked == sent
    assert conn.data_to_send() == b"" and not conn.has_work  # stopped until acknowledged
    conn.receive_data(req(Opcode.DCP_BUFFER_ACKNOWLEDGEMENT, extras=struct.pack(">I", sent)))
    assert conn.unacked == 0 and frames(conn.data_to_send())


def test_end_seqno_and_close_stream(cluster: ProducerCluster) -> None:
    conn, _ = handshake(cluster, controls=(("send_stream_end_on_client_close_stream", "true"),))
    vb = cluster.bucket.vbuckets[0]
    conn.receive_data(stream_req(0, end=vb.high_seqno, opaque=7))
    out = frames(conn.data_to_send())
    assert out[-1][1] == Opcode.DCP_STREAM_END and out[-1][4] == struct.pack(">I", 0)
    assert {f[3] for f in out} == {7}  # every stream message carries the request's opaque
    assert cluster.owner(1) == 0
    conn.receive_data(stream_req(1, opaque=8))
    conn.data_to_send()
    conn.receive_data(req(Opcode.DCP_CLOSE_STREAM, vb=1, opaque=9))
    closing = frames(conn.data_to_send())
    assert closing[0][1:4] == (Opcode.DCP_CLOSE_STREAM, Status.SUCCESS, 9)
    assert closing[-1][1] == Opcode.DCP_STREAM_END and closing[-1][4] == struct.pack(">I", 1)


def test_replies_and_stream_ends_are_the_generic_encoders_bytes(cluster: ProducerCluster) -> None:
    """The producer packs its replies, failover logs and STREAM_END frames in one call each;
    they are the bytes ``encoder.frame`` writes from a header, field by field."""
    conn, _ = handshake(cluster)
    vb = cluster.bucket.vbuckets[0]
    conn.receive_data(stream_req(0, end=vb.high_seqno, opaque=0xA1B2C3D4))
    conn.receive_data(req(Opcode.DCP_GET_FAILOVER_LOG, vb=0, opaque=0x0F))
    out = conn.data_to_send()
    log = b"".join(struct.pack(">QQ", uuid, seqno) for uuid, seqno in vb.failover_log)
    reply = frame(make_header(Opcode.DCP_STREAM_REQ, status=0, opaque=0xA1B2C3D4), b"", b"", log)
    failover = frame(make_header(Opcode.DCP_GET_FAILOVER_LOG, status=0, opaque=0x0F), b"", b"", log)
    end = frame(
        make_header(Opcode.DCP_STREAM_END, vbucket=0, opaque=0xA1B2C3D4), b"\0\0\0\0", b"", b""
    )
    assert out.startswith(reply + failover) and out.endswith(end)
    conn.receive_data(req(0x77, opaque=5))  # an unknown command: a reply with a status only
    assert conn.data_to_send() == frame(make_header(0x77, status=0x81, opaque=5), b"", b"", b"")


def test_ended_streams_leave_the_turns_and_a_new_stream_takes_them(
    cluster: ProducerCluster,
) -> None:
    """Streams take turns; one that ended and sent everything leaves the rotation (the
    turns stay as long as the open streams, not the streams ever opened), and a stream asked
    for again on its vbucket is served."""
    conn, _ = handshake(cluster)
    mine = [v for v in range(8) if cluster.owner(v) == 0]
    for i, v in enumerate(mine):
        high = cluster.bucket.vbuckets[v].high_seqno
        conn.receive_data(stream_req(v, end=high, opaque=10 + i))
    out = frames(conn.data_to_send())
    ends = [f[3] for f in out if f[1] == Opcode.DCP_STREAM_END]
    assert sorted(ends) == [10 + i for i in range(len(mine))]
    assert not conn._rotation  # every stream ended and sent its end
    v = mine[0]
    conn.receive_data(stream_req(v, end=cluster.bucket.vbuckets[v].high_seqno, opaque=50))
    again = frames(conn.data_to_send())
    assert again[0][1:4] == (Opcode.DCP_STREAM_REQ, Status.SUCCESS, 50)
    assert again[-1][1:4] == (Opcode.DCP_STREAM_END, v, 50)
    assert {f[3] for f in again} == {50}


def test_rebalance_pushes_the_map_and_moves_the_vbucket(cluster: ProducerCluster) -> None:
    conn = ProducerConnection(cluster, 0, nonce="n")
    conn.user = USER
    conn.features.add(HelloFeature.CLUSTERMAP_CHANGE_NOTIFICATION)
    cluster.rebalance(0, 1)
    (push,) = frames(conn.data_to_send())
    assert push[:2] == (Magic.SERVER_REQUEST, 0x01) and push[4] == struct.pack(">I", cluster.rev)
    assert json.loads(push[6])["vBucketServerMap"]["vBucketMap"][0] == [1]


def test_bulk_documents_join_the_backfill_in_seqno_order(cluster: ProducerCluster) -> None:
    before = cluster.bucket.vbuckets[0].high_seqno
    bulk = cluster.add_bulk(20_000, 40)
    n = bulk.in_vbucket(0)
    cid, key = next(k for k in cluster.bucket.vbuckets[0].docs)
    cluster.sim.write_doc(cid, key)  # a change above the bulk documents
    vb = cluster.bucket.vbuckets[0]
    assert vb.high_seqno == before + n + 1
    conn, _ = handshake(cluster)
    conn.receive_data(stream_req(0, end=vb.high_seqno, opaque=7))
    out = frames(conn.data_to_send() + conn.data_to_send())
    items = [f for f in out if f[1] in (Opcode.DCP_MUTATION, Opcode.DCP_DELETION, 0x5F)]
    seqnos = [struct.unpack_from(">Q", f[4])[0] for f in items]
    assert seqnos == sorted(seqnos) and seqnos[-1] == vb.high_seqno
    bulk_keys = [f[5] for f in items if f[5].startswith(b"\x00bulk::")]
    assert len(bulk_keys) == n and n > 1000  # several chunks
    assert out[-1][1] == Opcode.DCP_STREAM_END
    # an end seqno inside the bulk range stops there
    conn.receive_data(stream_req(1, end=bulk.seqno(1, 10), opaque=8))
    out = frames(conn.data_to_send())
    last = [f for f in out if f[1] == Opcode.DCP_MUTATION][-1]
    assert struct.unpack_from(">Q", last[4])[0] == bulk.seqno(1, 10)
    assert out[-1][1] == Opcode.DCP_STREAM_END and out[-1][4] == struct.pack(">I", 0)


def test_a_backfill_that_sent_its_end_sends_no_seqno_advanced(cluster: ProducerCluster) -> None:
    """A stream whose end is the last bulk document, with a change above it in the disk
    snapshot: the backfill's last chunk sends nothing (that change is past the end), and the
    end was sent by the chunk before, so no seqno-advanced follows it (seen once as "seqno 57
    after 57" by the quality check of an initial load with a live workload)."""
    cluster.add_bulk(20_000, 40)
    cid, key = next(k for k in cluster.bucket.vbuckets[0].docs)
    cluster.sim.write_doc(cid, key)  # in the backfill, past the stream's end
    vb = cluster.bucket.vbuckets[0]
    end = vb.high_seqno - 1
    conn, _ = handshake(cluster)
    conn.receive_data(stream_req(0, end=end, opaque=7))
    data = b""
    while chunk := conn.data_to_send():
        data += chunk
    events = list(iter_decode(data, collections=True))
    sent = [e.by_seqno for e in events if isinstance(e, Mutation | SeqnoAdvanced)]
    assert sent == sorted(set(sent)) and sent[-1] == end
    assert not any(isinstance(e, SeqnoAdvanced) for e in events)
    assert isinstance(events[-1], StreamEnd)


def test_realistic_bulk_documents_follow_the_streams_filter(cluster: ProducerCluster) -> None:
    """A stream filtered on one of the realistic documents' collections receives its
    documents alone, in seqno order, then a seqno-advanced to the backfill's end; the high
    seqno of that collection counts them."""
    bulk = cluster.add_bulk(3000, 0, "realistic")
    cid = bulk.collection_ids[2]
    vb = cluster.bucket.vbuckets[0]
    conn, _ = handshake(cluster)
    value = json.dumps({"collections": [format(cid, "x")]}).encode()
    extras = struct.pack(">IIQQQQQ", 0, 0, 0, vb.high_seqno, 0, 0, 0)
    conn.receive_data(req(Opcode.DCP_STREAM_REQ, vb=0, opaque=7, extras=extras, value=value))
    events = [e for e in iter_decode(conn.data_to_send(), collections=True)]
    docs = [e for e in events if isinstance(e, Mutation)]
    assert docs and {e.collection_id for e in docs} == {cid}
    seqnos = [e.by_seqno for e in docs]
    assert seqnos == sorted(seqnos) and seqnos[-1] == bulk.collection_last_seqno(0, cid)
    assert isinstance(events[-2], SeqnoAdvanced) and events[-2].by_seqno == vb.high_seqno
    assert isinstance(events[-1], StreamEnd)
    for e in docs:
        want = bulk.document(int(e.key.removeprefix(b"bulk::")))
        assert (e.value, e.xattrs, bulk.collection_ids[want.collection]) == (
            want.body,
            want.xattrs,
            cid,
        )
        assert not e.header.datatype & Datatype.SNAPPY  # Snappy not negotiated: sent plain
    extras = struct.pack(">II", 1, cid)
    conn.receive_data(req(ClientOpcode.GET_ALL_VB_SEQNOS, opaque=9, extras=extras))
    (reply,) = frames(conn.data_to_send())
    assert dict(struct.iter_unpack(">HQ", reply[6]))[0] == seqnos[-1]


@pytest.mark.parametrize(("state", "listed"), [(1, True), (0, True), (2, False), (3, False)])
def test_all_vb_seqnos_lists_the_nodes_active_vbuckets(
    cluster: ProducerCluster, state: int, listed: bool
) -> None:
    """GET_ALL_VB_SEQNOS: the high seqno of each vbucket active on the node, in vbucket order,
    for the active state or none given; nothing for replica or pending (none are kept)."""
    conn, _ = handshake(cluster, node=1)
    mine = [v for v in range(8) if cluster.owner(v) == 1]
    assert 0 < len(mine) < 8
    conn.receive_data(
        req(ClientOpcode.GET_ALL_VB_SEQNOS, opaque=9, extras=struct.pack(">I", state))
    )
    (reply,) = frames(conn.data_to_send())
    want = [(v, cluster.bucket.vbuckets[v].high_seqno) for v in mine] if listed else []
    assert reply[2:4] == (Status.SUCCESS, 9) and list(struct.iter_unpack(">HQ", reply[6])) == want


def test_a_stalled_vbucket_sends_nothing_while_its_high_seqno_grows(
    cluster: ProducerCluster,
) -> None:
    conn, _ = handshake(cluster, node=0)
    assert cluster.owner(0) == cluster.owner(1) == 0
    conn.receive_data(stream_req(0, opaque=7))
    conn.data_to_send()  # the reply and the backfill
    before = cluster.bucket.vbuckets[0].high_seqno
    high = cluster.stall(0, changes=3)
    assert high == before + 3 == cluster.bucket.vbuckets[0].high_seqno
    assert not conn.has_work and conn.data_to_send() == b""
    conn.receive_data(stream_req(1, opaque=8))  # the node's other vbuckets flow
    sent = frames(conn.data_to_send())
    assert sent[0][1:4] == (Opcode.DCP_STREAM_REQ, Status.SUCCESS, 8)
    assert sent[1:] and {f[2] for f in sent[1:]} == {1}
    conn.receive_data(req(ClientOpcode.GET_ALL_VB_SEQNOS, opaque=9, extras=struct.pack(">I", 1)))
    (reply,) = frames(conn.data_to_send())
    assert dict(struct.iter_unpack(">HQ", reply[6]))[0] == high  # reported all the same
    cluster.unstall(0)
    sent = frames(conn.data_to_send())
    seqnos = [struct.unpack_from(">Q", f[4])[0] for f in sent if f[1] == Opcode.DCP_MUTATION]
    assert {f[2] for f in sent} == {0} and max(seqnos) == high
