"""How fast the test DCP producer pushes a backfill (not part of ``make bench``).

Starts ``python -m dcp_cdc.simulator.server`` in its own process (one node, no live workload),
connects one raw-socket consumer over loopback (HELLO, SCRAM-SHA512, SELECT_BUCKET, DCP_OPEN,
the required controls), opens a stream on every vbucket from seqno 0 to the latest and only
reads, counts frames and acknowledges them (BUFFER_ACK at a fifth of the window, docs/protocol/dcp.md §7.6)
until every stream ended. Prints frames/s from the first STREAM_REQ to the last STREAM_END::

    PYTHONPATH=$PWD .venv/bin/python -m benchmarks.producer_speed --docs 200000
    PYTHONPATH=$PWD .venv/bin/python -m benchmarks.producer_speed --bulk-docs 1000000 --body-bytes 64

The consumer reads one header field per frame; it is several times faster than the producer,
so the figure is the producer's.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from dcp_cdc.encoder import frame, make_header
from dcp_cdc.protocol import (
    ClientOpcode,
    DcpOpenFlag,
    HelloFeature,
    Opcode,
    Status,
    StreamRequestFlag,
)
from dcp_cdc.scram import ScramClient, new_nonce

USER, PASSWORD = "bench", "bench-password"
_HDR = struct.Struct(">BBHBBHIIQ")
_OP_AND_LEN = struct.Struct(">xB6xI")  # opcode, body length
_NOEND = 2**64 - 1


class RawConsumer:
    """A blocking DCP consumer that only counts and acknowledges."""

    def __init__(self, port: int, bucket: str, buffer_bytes: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.buf = bytearray()
        self.buffer_bytes = buffer_bytes
        self._handshake(bucket)

    def _send(
        self,
        opcode: int,
        *,
        vb: int = 0,
        extras: bytes = b"",
        key: bytes = b"",
        value: bytes = b"",
        opaque: int = 0,
    ) -> None:
        self.sock.sendall(frame(make_header(opcode, vbucket=vb, opaque=opaque), extras, key, value))

    def _reply(self) -> tuple[int, bytes]:
        while len(self.buf) < 24 or len(self.buf) < 24 + _HDR.unpack_from(self.buf)[6]:
            self.buf += self.sock.recv(1 << 16)
        _m, _op, klen, elen, _dt, status, blen, _o, _c = _HDR.unpack_from(self.buf)
        body = bytes(self.buf[24 + elen + klen : 24 + blen])
        del self.buf[: 24 + blen]
        return status, body

    def _call(self, opcode: int, **kw: object) -> bytes:
        self._send(opcode, **kw)  # type: ignore[arg-type]
        status, body = self._reply()
        if status != Status.SUCCESS:
            raise SystemExit(f"opcode 0x{opcode:02x} failed: status 0x{status:02x} {body!r}")
        return body

    def _handshake(self, bucket: str) -> None:
        feats = (
            HelloFeature.XATTR,
            HelloFeature.SELECT_BUCKET,
            HelloFeature.SNAPPY,
            HelloFeature.JSON,
            HelloFeature.COLLECTIONS,
            HelloFeature.XERROR,
        )
        self._call(
            ClientOpcode.HELLO, key=b"bench", value=b"".join(struct.pack(">H", f) for f in feats)
        )
        client = ScramClient("SCRAM-SHA512", USER, PASSWORD, new_nonce())
        self._send(ClientOpcode.SASL_AUTH, key=b"SCRAM-SHA512", value=client.first())
        status, server_first = self._reply()
        if status != Status.AUTH_CONTINUE:
            raise SystemExit(f"SASL_AUTH: status 0x{status:02x}")
        client.verify(
            self._call(
                ClientOpcode.SASL_STEP, key=b"SCRAM-SHA512", value=client.final(server_first)
            )
        )
        self._call(ClientOpcode.SELECT_BUCKET, key=bucket.encode())
        flags = DcpOpenFlag.PRODUCER | DcpOpenFlag.INCLUDE_XATTRS | DcpOpenFlag.INCLUDE_DELETE_TIMES
        self._call(Opcode.DCP_OPEN, extras=struct.pack(">II", 0, flags), key=b"bench")
        for k, v in (
            ("enable_noop", "true"),
            ("set_noop_interval", "120"),
            ("connection_buffer_size", str(self.buffer_bytes)),
            ("enable_expiry_opcode", "true"),
            ("send_stream_end_on_client_close_stream", "true"),
        ):
            self._call(Opcode.DCP_CONTROL, key=k.encode(), value=v.encode())

    def backfill(self, vbuckets: int) -> tuple[int, int, float]:
        """Stream every vbucket to its high seqno: (frames, bytes, seconds)."""
        started = time.perf_counter()
        for vb in range(vbuckets):
            extras = struct.pack(">IIQQQQQ", StreamRequestFlag.TO_LATEST, 0, 0, _NOEND, 0, 0, 0)
            self._send(Opcode.DCP_STREAM_REQ, vb=vb, opaque=vb, extras=extras)
        ended = frames = nbytes = unacked = 0
        threshold = self.buffer_bytes // 5
        buf = bytes(self.buf)
        sock, unpack = self.sock, _OP_AND_LEN.unpack_from
        ack_header = make_header(Opcode.DCP_BUFFER_ACKNOWLEDGEMENT)
        while ended < vbuckets:
            chunk = sock.recv(4 << 20)
            if not chunk:
                raise SystemExit("the producer closed the connection")
            buf = buf + chunk if buf else chunk
            pos, n = 0, len(buf)
            while n - pos >= 24:
                opcode, blen = unpack(buf, pos)
                end = pos + 24 + blen
                if end > n:
                    break
                if opcode == Opcode.DCP_STREAM_END:
                    ended += 1
                if opcode != Opcode.DCP_NOOP and buf[pos] == 0x80:
                    unacked += 24 + blen
                    frames += 1
                pos = end
            nbytes += pos
            buf = buf[pos:]
            if unacked >= threshold:
                sock.sendall(frame(ack_header, struct.pack(">I", unacked), b"", b""))
                unacked = 0
        return frames, nbytes, time.perf_counter() - started


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=int, default=200_000)
    p.add_argument("--bulk-docs", type=int, default=0, help="serve N bulk documents instead")
    p.add_argument("--body-bytes", type=int, default=64)
    p.add_argument("--vbuckets", type=int, default=64)
    p.add_argument("--buffer-bytes", type=int, default=16 << 20)
    p.add_argument("--runs", type=int, default=1, help="backfills, one connection each")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "ports.json"
        cmd = [
            sys.executable,
            "-m",
            "dcp_cdc.simulator.server",
            "--nodes",
            "1",
            "--vbuckets",
            str(args.vbuckets),
            "--scenario",
            "basic",
            "--ops",
            "0",
            "--docs",
            str(args.docs),
            "--port-file",
            str(port_file),
            "--users",
            f"{USER}:{PASSWORD}",
        ]
        if args.bulk_docs:
            cmd += ["--docs", "1", "--bulk-docs", str(args.bulk_docs)]
            cmd += ["--body-bytes", str(args.body_bytes)]
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, env={**os.environ})
        try:
            while not port_file.exists():
                if proc.poll() is not None:
                    raise SystemExit(f"the producer exited with {proc.returncode}")
                time.sleep(0.05)
            info = json.loads(port_file.read_text())
            print(
                f"producer ready in {time.perf_counter() - started:.1f} s, "
                f"RSS {_rss_kib(proc.pid) / 1024:.0f} MiB"
            )
            for run in range(args.runs):
                consumer = RawConsumer(info["ports"][0], info["bucket"], args.buffer_bytes)
                frames, nbytes, secs = consumer.backfill(args.vbuckets)
                consumer.sock.close()
                print(
                    f"run {run + 1}: {frames} frames, {nbytes / 1e6:.1f} MB in {secs:.2f} s: "
                    f"{frames / secs:,.0f} frames/s, {nbytes / secs / 1e6:.0f} MB/s, "
                    f"producer RSS {_rss_kib(proc.pid) / 1024:.0f} MiB"
                )
        finally:
            proc.terminate()
            proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
