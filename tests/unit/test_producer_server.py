"""The producer over real sockets on 127.0.0.1: its noop clock, faults mid-stream, and TLS."""

from __future__ import annotations

import asyncio
import json
import ssl
import struct
from pathlib import Path

import pytest

from dcp_cdc.encoder import frame, make_header
from dcp_cdc.protocol import (
    ClientOpcode,
    DcpOpenFlag,
    HelloFeature,
    Magic,
    Opcode,
    Status,
    StreamEndReason,
)
from dcp_cdc.scram import ScramClient
from dcp_cdc.simulator.server import ProducerServer
from dcp_cdc.simulator.state import SimConfig
from tests.support.tls_certs import make_certificates

HDR = struct.Struct(">BBHBBHIIQ")
USER, PASSWORD = "reader", "pa55word"
Frame = tuple[int, int, int, int, bytes, bytes, bytes]  # magic, opcode, status/vb, opaque, e, k, v


class Client:
    """A DCP consumer written out by hand: each request and what came back."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, port: int, ctx: ssl.SSLContext | None = None) -> Client:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
        return cls(reader, writer)

    def send(self, opcode: int, *, vb: int = 0, opaque: int = 0, extras: bytes = b"",
             key: bytes = b"", value: bytes = b"", status: int | None = None) -> None:  # fmt: skip
        h = make_header(opcode, vbucket=vb, opaque=opaque, status=status)
        self.writer.write(frame(h, extras, key, value))

    async def read(self, timeout: float = 2.0) -> Frame | None:
        """The next frame, or None at end of stream."""
        try:
            head = await asyncio.wait_for(self.reader.readexactly(24), timeout)
        except asyncio.IncompleteReadError:
            return None
        magic, op, klen, elen, _dt, word, blen, opaque, _cas = HDR.unpack(head)
        body = await asyncio.wait_for(self.reader.readexactly(blen), timeout)
        return magic, op, word, opaque, body[:elen], body[elen : elen + klen], body[elen + klen :]

    async def call(self, opcode: int, **kw: bytes | int) -> Frame:
        self.send(opcode, **kw)  # type: ignore[arg-type]
        reply = await self.read()
        assert reply is not None and reply[0] == Magic.CLIENT_RESPONSE, reply
        return reply

    async def login(self, mechanism: str = "SCRAM-SHA512") -> None:
        feats = (HelloFeature.XATTR, HelloFeature.COLLECTIONS, HelloFeature.JSON)
        await self.call(
            ClientOpcode.HELLO, key=b"t", value=b"".join(struct.pack(">H", f) for f in feats)
        )
        if mechanism == "PLAIN":
            reply = await self.call(
                ClientOpcode.SASL_AUTH, key=b"PLAIN", value=f"\0{USER}\0{PASSWORD}".encode()
            )
            assert reply[2] == Status.SUCCESS, reply
            return
        client = ScramClient(mechanism, USER, PASSWORD, "clientnonce")
        first = await self.call(
            ClientOpcode.SASL_AUTH, key=mechanism.encode(), value=client.first()
        )
        assert first[2] == Status.AUTH_CONTINUE, first
        final = await self.call(
            ClientOpcode.SASL_STEP, key=mechanism.encode(), value=client.final(first[6])
        )
        assert final[2] == Status.SUCCESS, final
        client.verify(final[6])

    async def open_dcp(self, bucket: str, *controls: tuple[str, str]) -> None:
        assert (await self.call(ClientOpcode.SELECT_BUCKET, key=bucket.encode()))[2] == 0
        flags = DcpOpenFlag.PRODUCER | DcpOpenFlag.INCLUDE_XATTRS | DcpOpenFlag.INCLUDE_DELETE_TIMES
        opened = await self.call(Opcode.DCP_OPEN, extras=struct.pack(">II", 0, flags), key=b"t")
        assert opened[2] == Status.SUCCESS
        for k, v in controls:
            assert (await self.call(Opcode.DCP_CONTROL, key=k.encode(), value=v.encode()))[2] == 0

    def stream_req(self, vb: int, *, value: bytes = b"") -> None:
        extras = struct.pack(">IIQQQQQ", 0, 0, 0, 2**64 - 1, 0, 0, 0)
        self.send(Opcode.DCP_STREAM_REQ, vb=vb, opaque=vb, extras=extras, value=value)

    async def until_quiet(self, quiet: float = 0.3) -> list[Frame]:
        """Frames until none comes for ``quiet`` seconds."""
        out = []
        while True:
            try:
                f = await self.read(timeout=quiet)
            except TimeoutError:
                return out
            assert f is not None, "connection closed"
            out.append(f)


def _server(nodes: int = 2, **kw: object) -> ProducerServer:
    config = SimConfig(seed=4, vbuckets=8, docs=150, ops=0)
    return ProducerServer(config, nodes=nodes, users={USER: PASSWORD}, **kw)  # type: ignore[arg-type]


def test_noops_are_sent_and_an_unanswered_one_closes_the_connection() -> None:
    async def run() -> None:
        async with _server() as server:
            c = await Client.connect(server.ports[0])
            await c.login()
            await c.open_dcp(
                server.config.bucket, ("enable_noop", "true"), ("set_noop_interval", "1")
            )
            noop = await c.read(timeout=1.5)
            assert noop is not None and noop[:2] == (Magic.CLIENT_REQUEST, Opcode.DCP_NOOP)
            c.send(Opcode.DCP_NOOP, opaque=noop[3], status=Status.SUCCESS)  # answered: it lives
            again = await c.read(timeout=1.7)
            assert again is not None and again[1] == Opcode.DCP_NOOP and again[3] != noop[3]
            # not answered: the connection is closed within another interval (and a tick)
            assert await c.read(timeout=1.7) is None

    asyncio.run(run())


def test_cut_node_closes_the_connection_after_a_marker_and_one_item() -> None:
    async def run() -> None:
        async with _server() as server:
            c = await Client.connect(server.ports[0])
            await c.login()
            await c.open_dcp(server.config.bucket)
            mine = [vb for vb in range(8) if server.cluster.owner(vb) == 0]
            for vb in mine:
                c.stream_req(vb)
            backfill = await c.until_quiet()
            ends = [f for f in backfill if f[1] == Opcode.DCP_STREAM_END]
            assert len(backfill) > 20 and not ends
            assert server.cut_node(0) == 1
            rest = []
            while (f := await c.read()) is not None:
                rest.append(f)
            assert [f[1] for f in rest] == [Opcode.DCP_SNAPSHOT_MARKER, Opcode.DCP_MUTATION]
            start, end = struct.unpack(">QQ", rest[0][4][:16])
            assert end - start == 2  # the snapshot had three changes, one was sent

    asyncio.run(run())


def test_dropping_the_only_filtered_collection_ends_the_stream_filter_empty() -> None:
    async def run() -> None:
        async with _server(nodes=1) as server:
            cid = server.colls[1].collection_id
            c = await Client.connect(server.ports[0])
            await c.login()
            await c.open_dcp(server.config.bucket)
            c.stream_req(0, value=json.dumps({"collections": [format(cid, "x")]}).encode())
            c.stream_req(1)  # unfiltered: it goes on
            first = await c.until_quiet()
            assert first[0][2] == first[1][2] == Status.SUCCESS
            server.drop_collection(cid)
            after = await c.until_quiet()
            on_0 = [f for f in after if f[3] == 0]
            assert on_0[-2][1] == Opcode.DCP_SYSTEM_EVENT
            assert on_0[-1][1] == Opcode.DCP_STREAM_END
            assert on_0[-1][4] == struct.pack(">I", StreamEndReason.FILTER_EMPTY)
            on_1 = [f for f in after if f[3] == 1]
            assert on_1 and all(f[1] != Opcode.DCP_STREAM_END for f in on_1)

    asyncio.run(run())


def test_tls_accepts_plain_and_scram(tmp_path: Path) -> None:
    certs = make_certificates(tmp_path / "certs")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(certs.cert, certs.key)
    client_ctx = ssl.create_default_context(cafile=str(certs.ca))

    async def run() -> None:
        async with _server(nodes=1, tls_context=server_ctx) as server:
            port = server.tls_ports[0]
            assert port is not None
            for mechanism in ("PLAIN", "SCRAM-SHA256"):
                c = await Client.connect(port, client_ctx)
                mechs = await c.call(ClientOpcode.SASL_LIST_MECHS)
                assert b"PLAIN" in mechs[6].split() and b"SCRAM-SHA512" in mechs[6].split()
                await c.login(mechanism)
                await c.open_dcp(server.config.bucket)
                c.stream_req(0)
                got = await c.until_quiet()
                assert got[0][2] == Status.SUCCESS
                assert any(f[1] == Opcode.DCP_MUTATION for f in got)
                c.writer.close()
            config = json.loads(server.cluster.config(0))
            assert config["nodesExt"][0]["services"]["kvSSL"] == port

    asyncio.run(run())


def test_a_later_workload_without_manifest_keeps_the_manifest() -> None:
    """The small-run benchmark runs a workload an hour on one server: the first grows the
    manifest half-way (a scope, a collection, a max TTL), the later ones (manifest=False)
    only change documents."""

    async def main() -> tuple[list[str], int, int, int]:
        server = ProducerServer(SimConfig(docs=20, ops=0, vbuckets=4), nodes=1)
        bucket = server.sim.bucket
        before = bucket.manifest_uid
        await server.run_workload(40, batch=10)
        grown = bucket.manifest_uid
        high = sum(vb.high_seqno for vb in bucket.vbuckets)
        await server.run_workload(40, batch=10, manifest=False)
        names = [s.name for s in bucket.scopes.values()]
        assert sum(vb.high_seqno for vb in bucket.vbuckets) > high  # documents changed
        return names, before, grown, bucket.manifest_uid

    names, before, grown, after = asyncio.run(main())
    assert grown == before + 3  # scope, collection, max TTL
    assert after == grown
    assert names.count("tenant-b%1") == 1


def test_the_control_port_stalls_and_unstalls_a_vbucket() -> None:
    from dcp_cdc.simulator.server import _control

    async def run() -> None:
        async with _server(nodes=1) as server:
            high = server.sim.bucket.vbuckets[3].high_seqno
            assert await _control(server, None, "stall 3 4") == f"ok {high + 4}"
            assert server.cluster.stalled == {3}
            assert await _control(server, None, "unstall 3") == "ok"
            assert server.cluster.stalled == set()

    asyncio.run(run())


def test_a_users_password_comes_from_the_environment_or_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--user`` with ``--password-env`` or ``--password-file``: the password stays off the
    command line (which ``ps`` shows), read as the capture agent reads its own."""
    from dcp_cdc.simulator.server import _parse

    port_file = ["--port-file", str(tmp_path / "ports.json")]
    monkeypatch.setenv("PRODUCER_PASSWORD", "s3cret")
    args = _parse([*port_file, "--user", "dcp-reader", "--password-env", "PRODUCER_PASSWORD"])
    assert args.logins == {"dcp-reader": "s3cret"}
    (tmp_path / "pw").write_text("from-a-file\n")
    args = _parse(
        [*port_file, "--user", "u", "--password-file", str(tmp_path / "pw"), "--users", "t:x"]
    )
    assert args.logins == {"t": "x", "u": "from-a-file"}

    monkeypatch.delenv("PRODUCER_PASSWORD")
    for argv, message in [
        (
            ["--user", "u", "--password-env", "PRODUCER_PASSWORD"],
            "--user u: the environment variable PRODUCER_PASSWORD (--password-env) is not set",
        ),
        (
            ["--user", "u", "--password-file", str(tmp_path / "none")],
            f"--user u: --password-file {tmp_path / 'none'} not found",
        ),
        (["--user", "u"], "--user: give it with --password-env or --password-file"),
        (["--password-env", "X"], "--user: give it with --password-env or --password-file"),
    ]:
        with pytest.raises(SystemExit) as info:
            _parse([*port_file, *argv])
        assert info.value.code == 2
        assert message in capsys.readouterr().err


def test_truth_without_truth_out_says_what_it_needs() -> None:
    from dcp_cdc.simulator.server import _control

    async def run() -> None:
        async with _server(nodes=1) as server:
            assert await _control(server, None, "truth") == (
                "error truth needs --truth-out (where the producer writes it)"
            )

    asyncio.run(run())
