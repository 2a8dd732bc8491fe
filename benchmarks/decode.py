"""Decode throughput of both decoder faces against a plain struct-loop baseline."""

from __future__ import annotations

import argparse
import struct
import time
from collections.abc import Callable

from benchmarks.corpus import build_stream
from dcp_cdc.columnar import decode_batch
from dcp_cdc.decoder import DcpDecoder
from dcp_cdc.leb128 import read_uleb128
from dcp_cdc.snappy import decompress
from dcp_cdc.xattrs import split_xattrs

CHUNK = 64 * 1024 * 1024


def iterator_face(data: bytes) -> int:
    decoder = DcpDecoder(collections=True)
    decoder.receive_data(data)
    decoder.receive_data(b"")
    return sum(1 for _ in decoder)


def columnar_face(data: bytes) -> int:
    count = 0
    pos = 0
    while pos < len(data):
        batch = decode_batch(
            data[pos : pos + CHUNK],
            collections=True,
            base_offset=pos,
            final=pos + CHUNK >= len(data),
        )
        count += batch.table.num_rows
        pos += batch.consumed
    return count


_HDR = struct.Struct(">BBHBBHIIQ")
_EXTRAS = {  # opcode -> {extras length: (struct, field names)}
    0x57: {31: (struct.Struct(">QQIIIHB"),
                ("by_seqno", "rev_seqno", "flags", "expiration", "lock_time", "nmeta", "nru"))},
    0x58: {18: (struct.Struct(">QQH"), ("by_seqno", "rev_seqno", "nmeta")),
           21: (struct.Struct(">QQIx"), ("by_seqno", "rev_seqno", "delete_time"))},
    0x59: {20: (struct.Struct(">QQI"), ("by_seqno", "rev_seqno", "delete_time"))},
    0x56: {20: (struct.Struct(">QQI"), ("start_seqno", "end_seqno", "snapshot_flags"))},
    0x64: {8: (struct.Struct(">Q"), ("by_seqno",))},
}  # fmt: skip
_DOC_OPS = {0x57, 0x58, 0x59}


def struct_loop(data: bytes) -> int:
    """The straightforward baseline: per frame, ``struct.unpack_from`` the header and extras,
    split the LEB128 collection id, decompress and split xattrs, and build a row dict."""
    pos = count = 0
    n = len(data)
    rows = []
    while pos + 24 <= n:
        magic, op, keylen, extlen, dt, vb, bodylen, opaque, cas = _HDR.unpack_from(data, pos)
        row = {"offset": pos, "magic": magic, "opcode": op, "datatype": dt, "vbucket": vb,
               "opaque": opaque, "cas": cas}  # fmt: skip
        spec = _EXTRAS.get(op, {}).get(extlen)
        if spec is not None:
            row.update(zip(spec[1], spec[0].unpack_from(data, pos + 24), strict=True))
        if op in _DOC_OPS:
            key_start = pos + 24 + extlen
            cid, key_at = read_uleb128(data, key_start, key_start + keylen)
            row["collection_id"] = cid
            row["key"] = data[key_at : key_start + keylen]
            value = data[key_start + keylen : pos + 24 + bodylen]
            if value and dt & 0x02:
                value = decompress(value)
            if value and dt & 0x04:
                row["xattrs"], value = split_xattrs(value)
            row["value"] = value
        rows.append(row)
        pos += 24 + bodylen
        count += 1
        if len(rows) >= 100_000:  # hand rows on in batches, as a job would
            rows = []
    return count


def timed(fn: Callable[[bytes], int], data: bytes, repeat: int) -> tuple[float, int]:
    best = float("inf")
    count = 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        count = fn(data)
        best = min(best, time.perf_counter() - t0)
    return best, count


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--frames", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    data = build_stream(args.frames)
    mb = len(data) / 1e6
    print(f"{args.frames} frames, {mb:.1f} MB")
    for name, fn in (
        ("struct loop (baseline)", struct_loop),
        ("iterator face", iterator_face),
        ("columnar face", columnar_face),
    ):
        seconds, count = timed(fn, data, args.repeat)
        assert count == args.frames, (name, count)
        print(
            f"{name:<24} {seconds:7.3f} s  {count / seconds:12,.0f} frames/s  {mb / seconds:8.1f} MB/s"
        )


if __name__ == "__main__":
    main()
