"""Synthetic captures for the decode and ingest benchmarks, cached under benchmarks/.data.

One DCP session of ``n_frames`` frames over 64 vbuckets, written as capture files that rotate
at 64 MiB (as a consumer writes them): first a successful stream-request response per vbucket
(its failover log), then snapshots, each a V1 snapshot marker and 49 frames of one vbucket
with consecutive seqnos. The frames mix ops like a busy bucket: 70 % JSON mutations with
~200-byte bodies, 10 % mutations with Snappy-compressed values that carry XATTRs, 10 %
deletions, 5 % expirations, 5 % seqno-advanced. Deterministic for a given size and seed.
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dcp_cdc.capture import EXTENSION, CaptureWriter, read_capture_header
from dcp_cdc.encoder import encode, make_header
from dcp_cdc.events import (
    Deletion,
    Event,
    Expiration,
    Mutation,
    SeqnoAdvanced,
    SnapshotMarker,
    StreamRequestResponse,
)
from dcp_cdc.protocol import Datatype, Opcode

DATA = Path(__file__).resolve().parent / ".data"
VBUCKETS = 64
SNAPSHOT = 50  # frames per snapshot, its marker included
MAX_FILE_BYTES = 64 << 20
_POOL = 2048  # data frames to start from; the stream gives each new numbers (see below)
_DIGITS = 8
_SEQ = b'"seq": "'
_BLOCK = 5000 * SNAPSHOT  # frames built at once (whole snapshots)
_COLLECTION = 8


@dataclass(frozen=True)
class Corpus:
    """Capture files of one session, and what they hold."""

    landing: Path
    files: list[Path]
    frames: int
    frame_bytes: int  # bytes of frames (capture headers not counted)


def _body(rng: random.Random, i: int) -> bytes:
    doc = {
        "seq": "0" * _DIGITS,  # the stream writes each frame's number here: values differ
        "id": i,
        "type": "order",
        "customer": {"name": f"customer-{rng.randrange(10_000)}", "tier": rng.choice("abc")},
        "items": [
            {"sku": f"sku-{rng.randrange(1000)}", "qty": rng.randrange(1, 9)} for _ in range(3)
        ],
        "total": round(rng.random() * 1000, 2),
        "note": "héllo wörld",
    }
    return json.dumps(doc, ensure_ascii=False).encode()


def _pool(rng: random.Random) -> list[bytes]:
    """Data frames of vbucket 0 with seqno 0: the stream patches both in place."""
    pool: list[bytes] = []
    event: Event
    for i in range(_POOL):
        key = b"order::" + b"0" * _DIGITS  # the stream writes a document number here
        r = rng.random()
        cas = 0x17A8B0D8E6F40000 + (i << 16)
        if r < 0.70:
            h = make_header(Opcode.DCP_MUTATION, cas=cas, datatype=Datatype.JSON)
            event = Mutation(h, 0, 1, 0, 0, 0, 0, 0, _COLLECTION, key, _body(rng, i), None)
        elif r < 0.80:
            dt = Datatype.JSON | Datatype.SNAPPY | Datatype.XATTR
            h = make_header(Opcode.DCP_MUTATION, cas=cas, datatype=dt)
            xattrs = {"_sync": '{"rev":"1-a"}', "meta": '{"src":"bench"}'}
            event = Mutation(h, 0, 2, 0, 0, 0, 0, 0, _COLLECTION, key, _body(rng, i), xattrs)
        elif r < 0.90:
            h = make_header(Opcode.DCP_DELETION, cas=cas)
            event = Deletion(h, 0, 3, 1_700_000_000, _COLLECTION, key, b"", None)
        elif r < 0.95:
            h = make_header(Opcode.DCP_EXPIRATION, cas=cas)
            event = Expiration(h, 0, 3, 1_700_000_000, _COLLECTION, key, b"", None)
        else:
            event = SeqnoAdvanced(make_header(Opcode.DCP_SEQNO_ADVANCED), 0)
        pool.append(encode(event))
    return pool


def _put_digits(buf: np.ndarray, at: np.ndarray, values: np.ndarray) -> None:
    """Write ``values`` as ``_DIGITS`` ASCII decimal digits at offsets ``at`` of ``buf``."""
    for i in range(_DIGITS):
        buf[at + i] = (values // 10 ** (_DIGITS - 1 - i) % 10 + ord("0")).astype(np.uint8)


def _put_be(buf: np.ndarray, at: np.ndarray, values: np.ndarray, width: int) -> None:
    """Write ``values`` big-endian, ``width`` bytes each, at offsets ``at`` of ``buf``."""
    values = values.astype(np.uint64)
    for i in range(width):
        buf[at + i] = ((values >> np.uint64(8 * (width - 1 - i))) & np.uint64(0xFF)).astype(
            np.uint8
        )


class Stream:
    """The session's frames (without its stream-request responses), built a block at a time."""

    def __init__(self, n_frames: int, *, seed: int = 7) -> None:
        self.n_frames = n_frames
        self.seed = seed
        marker = encode(
            SnapshotMarker(make_header(Opcode.DCP_SNAPSHOT_MARKER), "1", 0, 0, 0x01)  # memory
        )
        self.templates = [marker, *_pool(random.Random(seed))]
        self.lengths = np.array([len(t) for t in self.templates], dtype=np.int64)
        self.key_at = np.array([_key_offset(t) for t in self.templates], dtype=np.int64)
        self.seq_at = np.array(
            [-1 if t[5] & Datatype.SNAPPY else t.find(_SEQ) for t in self.templates],
            dtype=np.int64,
        )  # Snappy values are left as they are

    def frames(self, first: int, count: int) -> tuple[bytes, list[int]]:
        """Frames ``first .. first + count - 1`` back to back, and where their snapshots start.

        Frame i is template ``pick[i]``: a V1 marker, then 49 pool frames, repeatedly.
        Snapshot s belongs to vbucket s % 64 and its frames take that vbucket's next seqnos.
        Keys take one of 1M document numbers; plain JSON bodies carry the frame number, so no
        two values are alike.
        """
        index = np.arange(first, min(first + count, self.n_frames), dtype=np.int64)
        is_marker = index % SNAPSHOT == 0
        pick = np.where(is_marker, 0, (index - index // SNAPSHOT - 1) % _POOL + 1)
        starts = np.zeros(len(index), dtype=np.int64)
        np.cumsum(self.lengths[pick][:-1], out=starts[1:])
        data = bytearray(b"".join([self.templates[p] for p in pick.tolist()]))
        buf = np.frombuffer(data, dtype=np.uint8)
        snapshot = index // SNAPSHOT
        first_seqno = (snapshot // VBUCKETS) * (SNAPSHOT - 1) + 1
        _put_be(buf, starts + 6, snapshot % VBUCKETS, 2)
        body = ~is_marker
        _put_be(buf, starts[body] + 24, (first_seqno + index % SNAPSHOT - 1)[body], 8)
        at = starts[is_marker]
        _put_be(buf, at + 24, first_seqno[is_marker], 8)  # start_seqno
        last = np.minimum(SNAPSHOT, self.n_frames - index[is_marker]) - 2
        _put_be(buf, at + 32, first_seqno[is_marker] + last, 8)  # end_seqno
        key_at = self.key_at[pick]
        keyed = key_at >= 0
        doc = (index * 7919 + self.seed) % 1_000_000
        _put_digits(buf, starts[keyed] + key_at[keyed], doc[keyed])
        seq_at = self.seq_at[pick]
        plain = seq_at >= 0
        _put_digits(buf, starts[plain] + seq_at[plain] + len(_SEQ), index[plain])
        return bytes(data), at.tolist()


def _key_offset(frame: bytes) -> int:
    """Where the document number of a pool frame's key starts (-1: a frame without a key)."""
    at = frame.find(b"order::")
    return at + len(b"order::") if at >= 0 else -1


def _stream_responses() -> bytes:
    out = bytearray()
    for vb in range(VBUCKETS):
        h = make_header(Opcode.DCP_STREAM_REQ, status=0, opaque=vb)
        uuid = 0x1000_0000_0000 + vb * 7919
        out += encode(StreamRequestResponse(h, "success", ((uuid, 0),), None, b""))
    return bytes(out)


def captures(n_frames: int, *, seed: int = 7) -> Corpus:
    """The capture files of ``n_frames`` frames (built once, then read from the cache)."""
    root = DATA / f"captures-v2-{n_frames}-seed{seed}"
    done = root / "complete.json"
    landing = root / "landing"
    if not done.exists():
        for old in landing.glob(f"*{EXTENSION}"):
            old.unlink()
        stream = Stream(n_frames - VBUCKETS, seed=seed)
        with CaptureWriter(
            landing,
            bucket="bench",
            session_id=f"bench-{n_frames}-{seed}",
            collections=True,
            started_at="2026-01-01T00:00:00Z",
            max_file_bytes=MAX_FILE_BYTES,
        ) as writer:
            writer.write(_stream_responses())
            for first in range(0, stream.n_frames, _BLOCK):
                frames, snapshots = stream.frames(first, _BLOCK)
                # Whole snapshots at a time: a file rotates between them, never in a frame.
                for a, b in itertools.pairwise([*snapshots, len(frames)]):
                    writer.write(frames[a:b])
        done.write_text(json.dumps({"frames": n_frames, "seed": seed}) + "\n")
    files = sorted(landing.glob(f"*{EXTENSION}"))
    frame_bytes = sum(p.stat().st_size - read_capture_header(p)[1] for p in files)
    return Corpus(landing, files, n_frames, frame_bytes)


def frames_of(path: Path) -> bytes:
    """The frames of one capture file (its header skipped)."""
    _, start = read_capture_header(path)
    with open(path, "rb") as fh:
        fh.seek(start)
        return fh.read()
