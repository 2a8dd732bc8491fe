"""Throughput of the whole capture agent: socket, consumer core, bounded queue, capture files.

A minimal DCP node in another process (handshake with SCRAM-SHA512, one vbucket map, then for
each STREAM_REQ a pre-encoded snapshot of mutations and STREAM_END OK, as fast as TCP takes
them) feeds ``dcp_cdc.agent.driver.capture(mode="until-now")``; the agent's process CPU time
is what the issue's goal (≥ 250,000 frames/s per core) is about.

    python -m benchmarks.capture_agent [--frames 1000000] [--vbuckets 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import struct
import tempfile
import time
from pathlib import Path

from dcp_cdc.scram import ScramServer, StoredCredential

HEAD = struct.Struct(">BBHBBHIIQ")
MECH = "SCRAM-SHA512"


def reply(op: int, opaque: int, value: bytes = b"", status: int = 0) -> bytes:
    return HEAD.pack(0x81, op, 0, 0, 0, status, len(value), opaque, 0) + value


def stream_frames(vb: int, count: int) -> bytes:
    parts = [HEAD.pack(0x80, 0x56, 0, 20, 0, vb, 20, vb, 0) + struct.pack(">QQI", 1, count, 2)]
    for i in range(1, count + 1):
        key = b"\x00doc-%d-%08d" % (vb, i)
        value = b'{"name":"n%d","city":"somewhere","n":%d}' % (i, i)
        ext = struct.pack(">QQIIIHB", i, 1, 0, 0, 0, 0, 0)
        parts.append(
            HEAD.pack(0x80, 0x57, len(key), 31, 1, vb, 31 + len(key) + len(value), vb, 7)
            + ext + key + value
        )  # fmt: skip
    parts.append(HEAD.pack(0x80, 0x55, 0, 4, 0, vb, 4, vb, 0) + b"\0\0\0\0")
    return b"".join(parts)


def serve(port_q: multiprocessing.Queue[int], vbuckets: int, per_vb: int) -> None:
    streams = {vb: stream_frames(vb, per_vb) for vb in range(vbuckets)}
    cred = StoredCredential.make(MECH, "password", b"salt", 4096)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        port = writer.get_extra_info("sockname")[1]
        config = json.dumps({
            "rev": 1, "name": "b", "uuid": "u1", "nodeLocator": "vbucket",
            "nodesExt": [{"hostname": "$HOST", "services": {"kv": port, "mgmt": 8091}}],
            "vBucketServerMap": {"serverList": [f"$HOST:{port}"],
                                 "vBucketMap": [[0] for _ in range(vbuckets)]},
        }).encode()  # fmt: skip
        scram = ScramServer(MECH, lambda user: cred, "servernonce")
        while True:
            try:
                head = await reader.readexactly(24)
            except asyncio.IncompleteReadError:
                return
            _m, op, key_len, ext_len, _d, vb, blen, opaque, _c = HEAD.unpack(head)
            body = await reader.readexactly(blen)
            value = body[ext_len + key_len :]
            if op == 0x1F:
                writer.write(reply(op, opaque, body[key_len:]))
            elif op == 0x20:
                writer.write(reply(op, opaque, MECH.encode()))
            elif op == 0x21:
                writer.write(reply(op, opaque, scram.first(value), 0x21))
            elif op == 0x22:
                writer.write(reply(op, opaque, scram.final(value)))
            elif op == 0xB5:
                writer.write(reply(op, opaque, config))
            elif op == 0x48:
                entries = b"".join(struct.pack(">HQ", v, per_vb) for v in range(vbuckets))
                writer.write(reply(op, opaque, entries))
            elif op == 0x53:
                writer.write(reply(op, opaque, struct.pack(">QQ", 0xABC, 0)))
                writer.write(streams[vb])
            elif op == 0x5D:
                continue  # buffer acks: this node does not enforce flow control
            else:  # SELECT_BUCKET, DCP_OPEN, DCP_CONTROL, CLOSE_STREAM
                writer.write(reply(op, opaque))
            await writer.drain()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port_q.put(server.sockets[0].getsockname()[1])
        await server.serve_forever()

    asyncio.run(main())


def main() -> None:
    from dcp_cdc.agent.driver import capture
    from dcp_cdc.agent.settings import CaptureSettings

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=1_000_000)
    parser.add_argument("--vbuckets", type=int, default=16)
    args = parser.parse_args()
    per_vb = args.frames // args.vbuckets
    port_q: multiprocessing.Queue[int] = multiprocessing.Queue()
    proc = multiprocessing.Process(target=serve, args=(port_q, args.vbuckets, per_vb), daemon=True)
    proc.start()
    port = port_q.get(timeout=120)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            landing = Path(tmp) / "landing"
            settings = CaptureSettings(
                connection_string=f"couchbase://127.0.0.1:{port}",
                bucket="b",
                username="u",
                password="password",
                landing=landing,
                staging=landing / ".dcp-cdc-capture",
                state_dir=landing / ".dcp-cdc-capture",
            )
            cpu = time.process_time()
            wall = time.perf_counter()
            summary = asyncio.run(capture(settings, mode="until-now"))
            wall = time.perf_counter() - wall
            cpu = time.process_time() - cpu
            frames = args.vbuckets * (per_vb + 3)  # marker, mutations, stream end, reply
            size = sum(p.stat().st_size for p in summary.files)
            assert sorted(summary.done) == list(range(args.vbuckets))
            print(
                f"{frames:,} frames ({size / 2**20:.1f} MiB in {len(summary.files)} files): "
                f"{wall:.2f} s wall, {cpu:.2f} s agent CPU, {frames / cpu:,.0f} frames/s per "
                f"core ({frames / wall:,.0f} frames/s wall)"
            )
    finally:
        proc.terminate()


if __name__ == "__main__":
    main()
