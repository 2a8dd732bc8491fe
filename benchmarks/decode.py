"""Decode throughput of both decoder faces against a plain struct-loop baseline.

Every face decodes the same capture files (benchmarks/corpus.py), held in memory, one file
buffer at a time as the bronze ingest does (files rotate at 64 MiB, the ingest's default
chunk), and, as its decode tasks do, in a process that keeps freed memory for reuse
(``dcp_cdc.columnar.keep_freed_memory``). The columnar face runs its compiled pass; "numpy
only" is its fallback. Runs are interleaved (baseline, iterator, columnar, then again) so
that load from other processes on the machine falls on every face alike; CPU seconds are kept
beside the wall-clock seconds for the same reason.

    python -m benchmarks.decode [--frames 1000000 --frames 10000000] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import struct
import time
from collections.abc import Callable

from benchmarks.common import Case, report
from benchmarks.corpus import captures, frames_of
from dcp_cdc.columnar import NATIVE, decode_batch, keep_freed_memory
from dcp_cdc.decoder import DcpDecoder
from dcp_cdc.snappy import decompress
from dcp_cdc.varint import read_uleb128
from dcp_cdc.xattrs import split_xattrs

LARGE = 5_000_000  # from this many frames, the two slow faces run once
KEEP_FREED_MEMORY = False  # set by main(), reported with the figures


def iterator_face(buffers: list[bytes]) -> int:
    count = 0
    for data in buffers:
        decoder = DcpDecoder(collections=True)
        decoder.receive_data(data)
        decoder.receive_data(b"")
        count += sum(1 for _ in decoder)
    return count


def columnar_face(buffers: list[bytes], *, native: bool | None = None) -> int:
    count = 0
    for data in buffers:
        batch = decode_batch(data, collections=True, native=native)
        assert batch.fatal is None and not batch.errors
        count += batch.table.num_rows
    return count


def columnar_numpy(buffers: list[bytes]) -> int:
    return columnar_face(buffers, native=False)


_HDR = struct.Struct(">BBHBBHIIQ")
_EXTRAS = {  # opcode -> {extras length: (struct, field names)}
    0x57: {
        31: (
            struct.Struct(">QQIIIHB"),
            ("by_seqno", "rev_seqno", "flags", "expiration", "lock_time", "nmeta", "nru"),
        )
    },
    0x58: {
        18: (struct.Struct(">QQH"), ("by_seqno", "rev_seqno", "nmeta")),
        21: (struct.Struct(">QQIx"), ("by_seqno", "rev_seqno", "delete_time")),
    },
    0x59: {20: (struct.Struct(">QQI"), ("by_seqno", "rev_seqno", "delete_time"))},
    0x56: {20: (struct.Struct(">QQI"), ("start_seqno", "end_seqno", "snapshot_flags"))},
    0x64: {8: (struct.Struct(">Q"), ("by_seqno",))},
}
_DOC_OPS = {0x57, 0x58, 0x59}


def struct_loop(buffers: list[bytes]) -> int:
    """The straightforward baseline: per frame, ``struct.unpack_from`` the header and extras,
    split the LEB128 collection id, decompress and split xattrs, and build a row dict."""
    count = 0
    for data in buffers:
        pos = 0
        n = len(data)
        rows = []
        while pos + 24 <= n:
            magic, op, keylen, extlen, dt, vb, bodylen, opaque, cas = _HDR.unpack_from(data, pos)
            row = {
                "offset": pos,
                "magic": magic,
                "opcode": op,
                "datatype": dt,
                "vbucket": vb,
                "opaque": opaque,
                "cas": cas,
            }
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


FACES: list[tuple[str, Callable[[list[bytes]], int]]] = [
    ("struct loop (baseline)", struct_loop),
    ("iterator face", iterator_face),
    ("columnar face, numpy only", columnar_numpy),
    ("columnar face", columnar_face),
]
"""The columnar face runs its compiled pass (dcp_cdc/_native.c) when built, as the ingest
does; "numpy only" is its fallback where the pass is not built."""


def run_size(n_frames: int, runs: int) -> None:
    corpus = captures(n_frames)
    buffers = [frames_of(p) for p in corpus.files]
    columnar_face(buffers[:1])  # imports and first-call set-up out of the timed runs
    wall: dict[str, list[float]] = {name: [] for name, _ in FACES}
    cpu: dict[str, list[float]] = {name: [] for name, _ in FACES}
    load_before = os.getloadavg()
    for run in range(runs):
        for name, face in FACES:
            if run and n_frames >= LARGE and face not in (columnar_face, columnar_numpy):
                continue
            started, cpu_started = time.perf_counter(), time.process_time()
            count = face(buffers)
            wall[name].append(time.perf_counter() - started)
            cpu[name].append(time.process_time() - cpu_started)
            assert count == corpus.frames, (name, count, corpus.frames)
    cases = []
    base_cpu = min(cpu[FACES[0][0]])
    for name, _ in FACES:
        cases.append(
            Case(
                name,
                corpus.frames,
                "frames",
                wall[name],
                nbytes=corpus.frame_bytes,
                baseline=name == FACES[0][0],
                extra={"cpu_s": cpu[name], "cpu_ratio_to_baseline": base_cpu / min(cpu[name])},
            )
        )
    label = f"{n_frames // 1_000_000}m" if n_frames % 1_000_000 == 0 else str(n_frames)
    params = {
        "native": NATIVE,
        "keep_freed_memory": KEEP_FREED_MEMORY,
        "frames": corpus.frames,
        "frame_bytes": corpus.frame_bytes,
        "files": len(corpus.files),
        "runs": runs,
        "load_avg_before": load_before,
        "load_avg_after": os.getloadavg(),
    }
    report(f"decode_{label}", cases, params=params)
    for case in cases:
        print(
            f"  {case.name:<34}cpu min {min(case.extra['cpu_s']):.3f} s, "
            f"{case.extra['cpu_ratio_to_baseline']:.2f}× baseline by CPU time"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.decode", description=__doc__)
    parser.add_argument(
        "--frames",
        type=int,
        action="append",
        help="capture size in frames (repeatable; default 1M and 10M)",
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--return-freed-memory",
        action="store_true",
        help="leave glibc to hand freed memory back to the system (the bronze decode tasks "
        "keep it: dcp_cdc.columnar.keep_freed_memory); for every face alike",
    )
    args = parser.parse_args(argv)
    global KEEP_FREED_MEMORY
    KEEP_FREED_MEMORY = not args.return_freed_memory and keep_freed_memory()
    print(f"compiled pass: {NATIVE}; freed memory kept: {KEEP_FREED_MEMORY}")
    for n_frames in args.frames or [1_000_000, 10_000_000]:
        run_size(n_frames, args.runs)


if __name__ == "__main__":
    main()
