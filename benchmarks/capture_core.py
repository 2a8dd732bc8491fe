"""Throughput of the capture agent's consumer core (dcp_cdc.agent.consumer), no sockets.

Pre-encoded DCP frames (a snapshot marker, then mutations of ~60-byte JSON documents, over 64
vbuckets) go through ``ConsumerConnection.receive_data`` in 64 KiB chunks, cut anywhere, as a
socket would hand them over; after each chunk the driver's own calls follow: take_capture,
consumed (so BUFFER_ACKs are due) and data_to_send. The issue's goal for the whole agent is
250,000 frames/s per core; the core alone has to be well above it.

    python -m benchmarks.capture_core [--frames 1000000] [--chunk 65536] [--snapshot 100]
"""

from __future__ import annotations

import argparse
import struct
import time

from dcp_cdc.agent.consumer import ConsumerConnection
from dcp_cdc.agent.consumer_events import NEED_DATA, Ready
from dcp_cdc.agent.handshake import ConsumerSettings

HEAD = struct.Struct(">BBHBBHIIQ")


def reply(opcode: int, opaque: int, value: bytes = b"", status: int = 0) -> bytes:
    return HEAD.pack(0x81, opcode, 0, 0, 0, status, len(value), opaque, 0) + value


def answer_everything(conn: ConsumerConnection) -> None:
    """A trusting server: every request of the handshake gets success (PLAIN over TLS)."""
    while not conn.ready:
        out = conn.data_to_send()
        pos = 0
        replies = []
        while pos < len(out):
            _m, op, key_len, ext_len, _d, _vb, blen, opaque, _c = HEAD.unpack_from(out, pos)
            value = b""
            if op == 0x1F:  # HELLO: accept what was asked
                value = out[pos + 24 + ext_len + key_len : pos + 24 + blen]
            elif op == 0x20:
                value = b"PLAIN"
            elif op == 0xB5:
                value = b'{"rev":1}'
            replies.append(reply(op, opaque, value))
            pos += 24 + blen
        conn.receive_data(b"".join(replies))


def frames(count: int, vbuckets: int, snapshot: int) -> bytes:
    parts = []
    seqno = [0] * vbuckets
    made = 0
    vb = 0
    while made < count:
        start = seqno[vb] + 1
        n = min(snapshot, count - made)
        parts.append(
            HEAD.pack(0x80, 0x56, 0, 20, 0, vb, 20, vb, 0)
            + struct.pack(">QQI", start, start + n - 1, 1)
        )
        for i in range(n):
            key = b"\x00doc-%08d" % (made + i)
            value = b'{"name":"n%d","city":"somewhere","n":%d}' % (i, made)
            ext = struct.pack(">QQIIIHB", start + i, 1, 0, 0, 0, 0, 0)
            body = len(ext) + len(key) + len(value)
            parts.append(
                HEAD.pack(0x80, 0x57, len(key), 31, 1, vb, body, vb, 0x1234) + ext + key + value
            )
        seqno[vb] = start + n - 1
        made += n
        vb = (vb + 1) % vbuckets
    return b"".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=1_000_000)
    parser.add_argument("--chunk", type=int, default=64 * 1024)
    parser.add_argument("--snapshot", type=int, default=100, help="mutations per snapshot")
    parser.add_argument("--vbuckets", type=int, default=64)
    args = parser.parse_args()

    conn = ConsumerConnection(
        ConsumerSettings(
            node="bench:11210",
            bucket="b",
            username="u",
            password="p",
            tls=True,
            connection_name="dcp-cdc:bench",
            buffer_bytes=16 << 20,
        )
    )
    answer_everything(conn)
    assert isinstance(conn.next_event(), Ready)
    for vb in range(args.vbuckets):
        conn.open_stream(vb, None)
    conn.data_to_send()
    conn.receive_data(
        b"".join(reply(0x53, vb, struct.pack(">QQ", 1000 + vb, 0)) for vb in range(args.vbuckets))
    )
    conn.take_capture()
    while conn.next_event() is not NEED_DATA:
        pass

    data = frames(args.frames, args.vbuckets, args.snapshot)
    count = args.frames + -(-args.frames // args.snapshot)
    chunks = [data[i : i + args.chunk] for i in range(0, len(data), args.chunk)]
    captured = sent = 0
    started = time.perf_counter()
    cpu = time.process_time()
    for chunk in chunks:
        conn.receive_data(chunk)
        capture = conn.take_capture()
        captured += len(capture)
        conn.consumed(len(capture))
        sent += len(conn.data_to_send())
    cpu = time.process_time() - cpu
    wall = time.perf_counter() - started
    assert captured >= len(data), (captured, len(data))
    positions = conn.positions()
    assert sum(p.seqno for p in positions.values()) == args.frames
    print(
        f"{count:,} frames ({len(data) / 2**20:.1f} MiB, {len(chunks):,} chunks of "
        f"{args.chunk:,} B): {wall:.3f} s wall, {cpu:.3f} s CPU, "
        f"{count / cpu:,.0f} frames/s per core, {len(data) / cpu / 2**20:.0f} MiB/s; "
        f"{sent:,} bytes of BUFFER_ACKs sent"
    )


if __name__ == "__main__":
    main()
