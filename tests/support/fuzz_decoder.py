"""A seeded mutation fuzzer of both decoder faces.

Inputs are built from valid frames of every message (the spec examples, the seed's add-stream
frames, frames with Snappy and XATTR values, stream-id frames) and from the inputs that once
escaped the typed errors; each is one to three frames, mutated a few times (bytes flipped or
set to edge values, header lengths rewritten, cut, spliced, bytes inserted). For each input:

- the iterator face (``iter_decode``) and ``decode_frame`` raise nothing but ``DcpError``;
- the columnar face (``decode_batch``, whole, and batch after batch under a tight
  ``max_expanded``; with its compiled pass and with numpy alone) raises nothing but
  ``DcpError`` and gives, row for row, the iterator's
  events, its skipped frames at the same offsets with the same reasons, and its fatal error
  at the same offset. One columnar call per input would cost most of the time, so an input
  goes through the columnar face within a stream of up to :data:`GROUP` inputs (both faces
  decode that stream); an input that cannot be framed to its end is cut where framing stops
  for that, and the columnar framing (``frame_starts``) must stop there with the same error.
  Every 16th of those goes through the whole columnar path alone as well.

Run ``python -m tests.support.fuzz_decoder --inputs 1000000`` for a long campaign (it prints the
counts, the time and every finding); ``tests/unit/test_decoder_fuzz.py`` runs a bounded one.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Iterator
from typing import Any

from dcp_cdc.columnar import NATIVE, decode_batch, frame_starts
from dcp_cdc.columnar.schema import COLUMNS, event_to_row
from dcp_cdc.decoder import decode_frame, iter_decode
from dcp_cdc.encoder import encode, frame, make_header
from dcp_cdc.errors import DcpError, MalformedFrameError
from dcp_cdc.events import Deletion, Mutation, StreamRequest
from dcp_cdc.protocol import Datatype, Opcode
from tests.support.spec_examples import EXAMPLES  # the docs/protocol/dcp.md §8 examples

REPRODUCERS = [
    bytes.fromhex("8057000000000000ffffffff"),
    bytes.fromhex("18" + "00" * 23),  # alt magic, empty body, last: IndexError (columnar)
    bytes.fromhex("085c" + "00" * 22),
    # a stream request whose JSON value nests 1,000 deep: RecursionError (both faces)
    encode(
        StreamRequest(make_header(Opcode.DCP_STREAM_REQ), 0, 0, 0, 0, 0, 0, "[" * 999 + "]" * 999)
    ),
]
"""Inputs that once escaped the typed errors."""


def _doc_frames() -> list[bytes]:
    """Mutations and deletions with every value encoding, with and without stream-ids."""
    out = []
    xattrs = {"_sync": '{"rev":"1-a"}', "meta": "{}"}
    for sid in (None, 7):
        for datatype in range(8):
            body = b'{"a":1,"b":"' + b"x" * 40 + b'"}'
            h = make_header(Opcode.DCP_MUTATION, vbucket=3, datatype=datatype, stream_id=sid)
            xa = xattrs if datatype & Datatype.XATTR else None
            for cid in (None, 8, 300):
                out.append(encode(Mutation(h, 5, 1, 0, 0, 0, 0, 0, cid, b"key", body, xa)))
        h = make_header(Opcode.DCP_DELETION, datatype=Datatype.XATTR | Datatype.SNAPPY)
        out.append(encode(Deletion(h, 6, 2, 1234, 8, b"gone", b"", {"_sync": "{}"})))
        out.append(encode(Deletion(h._replace(datatype=0), 7, 2, None, 8, b"gone", b"", None)))
    out.append(frame(make_header(0x66, vbucket=1), b"", b"", b"packed"))  # no reader: unknown
    return out


def corpus() -> list[bytes]:
    """Valid frames of every message, and the reproducers."""
    return [bytes.fromhex(e.hex) for e in EXAMPLES] + _doc_frames() + REPRODUCERS


_EDGE = (0x00, 0x01, 0x02, 0x07, 0x08, 0x18, 0x22, 0x7F, 0x80, 0x81, 0xFE, 0xFF)
_LENGTH_FIELDS = ((2, 2), (4, 1), (8, 4))  # key_len, ext_len, body_len in the header (§1.1)


def _mutate(rng: random.Random, data: bytearray, pieces: list[bytes]) -> None:
    kind = rng.randrange(9)
    if not data:
        data += rng.choice(pieces)
        return
    pos = rng.randrange(len(data))
    if kind == 0:
        data[pos] ^= 1 << rng.randrange(8)
    elif kind == 1:
        data[pos] = rng.choice(_EDGE)
    elif kind == 2:
        data[pos] = rng.randrange(256)
    elif kind == 3:  # a header length field of the first frame, to a small or edge value
        at, size = rng.choice(_LENGTH_FIELDS)
        if len(data) >= at + size:
            value = rng.choice(
                [0, 1, 2, 3, 4, 8, 16, 31, 48, rng.randrange(256), (1 << 8 * size) - 1]
            )
            data[at : at + size] = value.to_bytes(size, "big")
    elif kind == 4:
        del data[pos:]
    elif kind == 5:
        data[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
    elif kind == 6:
        del data[pos : pos + rng.randint(1, 8)]
    elif kind == 7:  # splice a piece of another frame in
        other = rng.choice(pieces)
        start = rng.randrange(len(other))
        data[pos:pos] = other[start : start + rng.randint(1, 40)]
    else:  # opcode or magic of the first frame
        if len(data) > 1:
            data[rng.randrange(2)] = rng.choice([*_EDGE, *range(0x50, 0x68)])


def inputs(seed: int, count: int) -> Iterator[tuple[bytes, bool]]:
    """``count`` fuzzed inputs and whether each is decoded with collections."""
    pieces = corpus()
    rng = random.Random(seed)
    for i in range(count):
        if i < len(pieces):  # every valid frame and reproducer as it is, first
            yield pieces[i], bool(i % 2)
            continue
        data = bytearray().join(rng.choice(pieces) for _ in range(rng.randint(1, 3)))
        for _ in range(rng.randint(1, 4)):
            _mutate(rng, data, pieces)
        yield bytes(data), rng.random() < 0.5


def reference_rows(items: list[Any]) -> list[dict[str, Any]]:
    """The columnar face's rows as the iterator face's events say they must be."""
    rows = []
    for item in items:
        if isinstance(item, MalformedFrameError):
            continue
        row = {name: None for name, _ in COLUMNS}
        row.update(event_to_row(item))
        if row["xattrs"] is not None:
            row["xattrs"] = list(row["xattrs"].items())
        if row["failover_log"] is not None:
            row["failover_log"] = [{"vb_uuid": u, "seqno": s} for u, s in row["failover_log"]]
        if row["high_seqnos"] is not None:
            row["high_seqnos"] = [{"vbucket": v, "seqno": s} for v, s in row["high_seqnos"]]
        rows.append(row)
    return rows


def _batches(
    data: bytes, collections: bool, max_expanded: int | None, native: bool | None = None
) -> tuple[list[Any], ...]:
    """Rows, skipped errors and the fatal error of the columnar face, batch after batch."""
    rows: list[Any] = []
    errors: list[tuple[int, str]] = []
    pos = 0
    while True:
        batch = decode_batch(
            data[pos:],
            collections=collections,
            base_offset=pos,
            max_expanded=max_expanded,
            native=native,
        )
        rows += batch.table.to_pylist()
        errors += [(e.offset, e.reason) for e in batch.errors]
        pos += batch.consumed
        if batch.fatal is not None or pos >= len(data) or max_expanded is None:
            fatal = None if batch.fatal is None else batch.fatal.offset
            return rows, errors, [fatal]


def _iterator_face(data: bytes, collections: bool) -> list[Any]:
    """The iterator face's items; ``decode_frame`` must agree on the first one."""
    items = list(iter_decode(data, collections=collections))
    try:
        first = decode_frame(data, collections=collections)
    except DcpError as exc:
        if items:  # an empty input is no frame: iter_decode ends, decode_frame raises
            assert isinstance(items[0], MalformedFrameError), exc
            assert exc.offset == items[0].offset, (exc, items[0])  # type: ignore[attr-defined]
    else:
        assert items and items[0] == first
    return items


def _expected(items: list[Any]) -> tuple[list[Any], ...]:
    errors = [i for i in items if isinstance(i, MalformedFrameError)]
    skipped = [(e.offset, e.reason) for e in errors if e.recoverable]
    fatal = [e.offset for e in errors if not e.recoverable][:1] or [None]
    return reference_rows(items), skipped, fatal


def _columnar_agrees(data: bytes, collections: bool, items: list[Any], bounded: bool) -> None:
    """The columnar face, with its compiled pass (when built) and with numpy alone."""
    expected = _expected(items)
    for native in (True, False) if NATIVE else (False,):
        got = _batches(data, collections, None, native)
        assert got == expected, f"columnar face (native={native}) differs from the iterator face"
        if bounded:
            got = _batches(data, collections, 64, native)
            assert got == expected, f"bounded columnar batches (native={native}) differ"


def check(data: bytes, collections: bool, *, bounded: bool = False) -> None:
    """Only ``DcpError`` escapes and both faces agree; AssertionError (or the escaped
    exception) otherwise."""
    _columnar_agrees(data, collections, _iterator_face(data, collections), bounded)


def _same_fatal(data: bytes, fatal: MalformedFrameError) -> None:
    for native in (True, False) if NATIVE else (False,):
        _, consumed, error = frame_starts(data, final=True, native=native)
        assert error is not None and (consumed, error.offset) == (fatal.offset, fatal.offset), (
            f"columnar framing (native={native}) stops elsewhere",
            consumed,
            error,
        )
        assert type(error) is type(fatal) and error.reason == fatal.reason, (error, fatal)


GROUP = 64
"""Inputs that frame whole (no unrecoverable error) are also checked as one stream of up to
this many, through both faces at once; a group that disagrees is checked input by input."""


class _Campaign:
    def __init__(self) -> None:
        self.findings: list[tuple[bytes, bool, str]] = []
        self.groups: dict[bool, list[bytes]] = {False: [], True: []}
        self.checked_groups = 0

    def _run(self, data: bytes, collections: bool, step: Any) -> Any:
        try:
            return step()
        except Exception as exc:  # anything but agreement is a finding, kept with its input
            self.findings.append((data, collections, f"{type(exc).__name__}: {exc}"[:300]))
            return None

    def add(self, data: bytes, collections: bool, n: int) -> None:
        items = self._run(data, collections, lambda: _iterator_face(data, collections))
        if items is None:
            return
        fatal = [i for i in items if isinstance(i, MalformedFrameError) and not i.recoverable]
        if fatal and n % 16 == 0:  # the whole columnar path, alone
            self._run(
                data, collections, lambda: _columnar_agrees(data, collections, items, n % 32 == 0)
            )
            return
        if fatal:  # the columnar face's framing stops where the iterator's does
            self._run(data, collections, lambda: _same_fatal(data, fatal[0]))
            data = data[: fatal[0].offset]  # whole frames: their rows are checked in a group
        group = self.groups[collections]
        group.append(data)
        if len(group) == GROUP:
            self.flush(collections)

    def flush(self, collections: bool) -> None:
        group, self.groups[collections] = self.groups[collections], []
        if not group:
            return
        self.checked_groups += 1
        stream = b"".join(group)
        bounded = self.checked_groups % 8 == 0
        try:
            check(stream, collections, bounded=bounded)
        except Exception:  # find which inputs disagree on their own
            before = len(self.findings)
            for data in group:
                self._run(data, collections, lambda d=data: check(d, collections, bounded=True))
            if len(self.findings) == before:
                self._run(stream, collections, lambda: check(stream, collections, bounded=True))


def campaign(seed: int, count: int, out: Any = sys.stdout) -> list[tuple[bytes, bool, str]]:
    """Fuzz ``count`` inputs; the findings as (input, collections, what went wrong)."""
    state = _Campaign()
    started = time.perf_counter()
    for n, (data, collections) in enumerate(inputs(seed, count), 1):
        known = len(state.findings)
        state.add(data, collections, n)
        if out is not None and len(state.findings) > known:
            for bad, coll, what in state.findings[known:]:
                out.write(f"finding at input {n}: collections={coll} {bad.hex()}: {what}\n")
        if out is not None and n % 100_000 == 0:
            rate = n / (time.perf_counter() - started)
            out.write(f"{n} inputs, {len(state.findings)} findings, {rate:,.0f} inputs/s\n")
            out.flush()
    state.flush(False)
    state.flush(True)
    return state.findings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    findings = campaign(args.seed, args.inputs)
    seconds = time.perf_counter() - started
    untyped = [f for f in findings if not f[2].startswith("AssertionError")]
    print(
        f"{args.inputs} inputs (seed {args.seed}) through both faces in {seconds:.0f} s: "
        f"{len(untyped)} untyped exceptions, {len(findings) - len(untyped)} disagreements"
    )
    for data, collections, what in findings[:20]:
        print(f"  collections={collections} {data.hex()}: {what}")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
