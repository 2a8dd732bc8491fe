"""Bulk documents: a bucket of millions of small documents for benchmarks, built in seconds.

The simulator's documents are Python objects, a few hundred bytes each and microseconds to
make; ten million of them would take minutes and gigabytes. Bulk documents are a numbered
range instead: document ``k`` of collection 0 has key ``bulk::<k, 10 digits>``, a JSON body of
``body_bytes`` bytes naming it, rev seqno 1 and its own CAS. Each vbucket (the key's CRC32,
docs/protocol/dcp.md §7.1, computed with numpy) holds its documents at consecutive seqnos right above what the
vbucket had when they were made; only their numbers are kept (4 bytes a document). The test
producer serves them in backfills as mutations, whole chunks built with numpy records made of
the layout tables (``HEADER`` and ``MUTATION``; a chunk of fewer than :data:`FEW` documents
frame by frame, from the same template); nothing else changes them, and the truth
files do not list them (their summary's ``bulk`` describes them). :class:`NumberedDocs` is
what every shape shares (the numbers, vbuckets, seqnos and CAS); the realistic shape is
:mod:`dcp_cdc.simulator.realistic`.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dcp_cdc import layouts
from dcp_cdc.errors import ConfigError
from dcp_cdc.protocol import HEADER_LEN, Datatype, Magic, Opcode
from dcp_cdc.simulator.model import Bucket
from dcp_cdc.simulator.stream import SNAPPY_MIN_BYTES, SessionOptions

if TYPE_CHECKING:
    import numpy as np

KEY_PREFIX = b"bulk::"
DIGITS = 10
COLLECTION_ID = 0
_BODY_HEAD, _BODY_MID, _BODY_TAIL = b'{"id":"', b'","pad":"', b'"}'
MIN_BODY = len(_BODY_HEAD) + DIGITS + len(_BODY_MID) + len(_BODY_TAIL)
MAX_BODY = SNAPPY_MIN_BYTES - 1
"""Bodies stay below the size the producer would Snappy-compress: frames stay fixed-size."""
FEW = 16
"""A chunk of fewer documents is packed frame by frame (:meth:`BulkDocs.frames`): numpy's
cost per call, some 50 µs, is more than theirs (a vbucket of a few documents, as 5,000
documents on 1,024 vbuckets give)."""


def _field(layout: layouts.Layout, name: str, base: int = 0) -> tuple[int, struct.Struct]:
    """Where field ``name`` of ``layout`` (at ``base`` in a frame) starts, and its struct."""
    size = next(f.size for f in layout.fields if f.name == name)
    return base + layout.offset_of(name), struct.Struct(">" + {2: "H", 4: "I", 8: "Q"}[size])


_VBUCKET = _field(layouts.HEADER, "vbucket_or_status")
_OPAQUE = _field(layouts.HEADER, "opaque")
_CAS = _field(layouts.HEADER, "cas")
_BY_SEQNO = _field(layouts.MUTATION, "by_seqno", HEADER_LEN)


def crc32_of_numbered(prefix: bytes, numbers: np.ndarray[Any, Any], digits: int) -> Any:
    """zlib.crc32 of ``prefix + b"%0{digits}d" % n`` for every ``n``, vectorized."""
    import numpy as np

    poly = np.uint32(0xEDB88320)
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ poly, table >> 1).astype(np.uint32)
    state = 0xFFFFFFFF
    for b in prefix:
        state = int(table[(state ^ b) & 0xFF]) ^ (state >> 8)
    crc = np.full(len(numbers), state, dtype=np.uint32)
    for i in range(digits - 1, -1, -1):
        digit = (numbers // 10**i) % 10 + 48
        crc = table[(crc ^ digit.astype(np.uint32)) & 0xFF] ^ (crc >> 8)
    return crc ^ np.uint32(0xFFFFFFFF)


@dataclass(frozen=True)
class Chunk:
    """What a stream asks of bulk documents: the vbucket's documents ``lo``..``hi - 1``
    in the collections ``visible``, as a connection with ``options`` receives them, with
    the stream's ``opaque``."""

    vbid: int
    lo: int
    hi: int
    opaque: int
    options: SessionOptions
    visible: Collection[int]


class NumberedDocs:
    """``count`` numbered documents added to ``bucket``: document ``k`` has key
    ``bulk::<k, 10 digits>`` and lives in the vbucket of its key's CRC32, at a seqno right
    above what the vbucket had when they were made (numbers in vbucket order, 4 bytes a
    document), rev seqno 1 and CAS ``cas_base + k``. A shape (:class:`BulkDocs`,
    :class:`dcp_cdc.simulator.realistic.RealisticDocs`) says which collection each one is in
    (``collections_of``) and writes their frames (``frames``)."""

    shape = "small"
    collection_ids: tuple[int, ...] = (COLLECTION_ID,)

    def __init__(self, bucket: Bucket, count: int) -> None:
        import numpy as np

        if count < 1 or count >= 10**DIGITS:
            raise ConfigError(f"bulk docs: expected 1..{10**DIGITS - 1}, got {count}")
        self.count = count
        nvb = len(bucket.vbuckets)
        numbers = np.arange(count, dtype=np.uint32)
        vbs = ((crc32_of_numbered(KEY_PREFIX, numbers, DIGITS) >> 16) & 0x7FFF) % nvb
        order = np.argsort(vbs, kind="stable")
        self.numbers = numbers[order]
        counts = np.bincount(vbs, minlength=nvb)
        self.offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        self._counts: list[int] = counts.tolist()
        """Each vbucket's documents as Python ints: asked per stream, numpy's scalars are slow."""
        self.cas_base = bucket.last_cas + 1
        bucket.last_cas += count
        self.base_seqno: list[int] = []
        for vb in bucket.vbuckets:
            self.base_seqno.append(vb.high_seqno)
            vb.high_seqno += int(counts[vb.vbid])
        self._last_in = self._collection_last_seqnos(vbs[order], nvb)

    def collections_of(self, numbers: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """The index in ``collection_ids`` of each document's collection."""
        import numpy as np

        return np.zeros(len(numbers), dtype=np.int64)

    def _collection_last_seqnos(self, vbs: np.ndarray[Any, Any], nvb: int) -> list[list[int]]:
        """Per collection, per vbucket: the seqno of its last document there (0: none)."""
        import numpy as np

        colls = self.collections_of(self.numbers)
        out = []
        for index in range(len(self.collection_ids)):
            where = np.flatnonzero(colls == index)
            ends = np.searchsorted(vbs[where], np.arange(nvb), side="right")
            starts = np.searchsorted(vbs[where], np.arange(nvb), side="left")
            last = where[np.maximum(ends - 1, 0)] if len(where) else np.zeros(nvb, np.int64)
            out.append(
                [
                    self.seqno(v, int(last[v] - self.offsets[v])) if ends[v] > starts[v] else 0
                    for v in range(nvb)
                ]
            )
        return out

    def describe(self) -> dict[str, object]:
        """What the truth's summary says of them: shape, number, key prefix, collections."""
        return {
            "shape": self.shape,
            "documents": self.count,
            "key_prefix": KEY_PREFIX.decode(),
            "collection_ids": list(self.collection_ids),
        }

    def collection_last_seqno(self, vbid: int, collection_id: int) -> int:
        """The seqno of the vbucket's last document of the collection (0: none there)."""
        if collection_id not in self.collection_ids:
            return 0
        return self._last_in[self.collection_ids.index(collection_id)][vbid]

    def in_vbucket(self, vbid: int) -> int:
        return self._counts[vbid]

    def seqno(self, vbid: int, index: int) -> int:
        """The seqno of the vbucket's ``index``-th bulk document (0-based)."""
        return self.base_seqno[vbid] + index + 1

    def last_seqno(self, vbid: int) -> int:
        return self.base_seqno[vbid] + self.in_vbucket(vbid)

    def key(self, number: int) -> bytes:
        return KEY_PREFIX + b"%0*d" % (DIGITS, number)

    def frames(self, chunk: Chunk) -> tuple[bytes, int, int]:
        """The mutations of a chunk of a vbucket's documents: (frames, count, seqno of the
        last one or -1)."""
        raise NotImplementedError


class BulkDocs(NumberedDocs):
    """Small bulk documents: collection 0, a JSON body of ``body_bytes`` naming the document
    (see the module's doc)."""

    def __init__(self, bucket: Bucket, count: int, body_bytes: int) -> None:
        if not MIN_BODY <= body_bytes <= MAX_BODY:
            raise ConfigError(f"body bytes: expected {MIN_BODY}..{MAX_BODY}, got {body_bytes}")
        super().__init__(bucket, count)
        self.body_bytes = body_bytes
        head, tail = self.body_around(body_bytes)
        self.body = head + b"0" * DIGITS + tail
        self._records: dict[bool, tuple[np.dtype[Any], np.ndarray[Any, Any], int, int]] = {}

    @staticmethod
    def body_around(body_bytes: int) -> tuple[bytes, bytes]:
        """A body of ``body_bytes``: what comes before and after the document's digits."""
        return _BODY_HEAD, _BODY_MID + b"x" * (body_bytes - MIN_BODY) + _BODY_TAIL

    def _record(self, collections: bool) -> tuple[np.dtype[Any], np.ndarray[Any, Any], int, int]:
        """The frame as a numpy record, its template, and where the key's and the body's
        digits start."""
        cached = self._records.get(collections)
        if cached is not None:
            return cached
        import numpy as np

        key_prefix = (b"\x00" if collections else b"") + KEY_PREFIX  # uleb128(0)
        klen = len(key_prefix) + DIGITS
        ext = layouts.MUTATION.length
        size = HEADER_LEN + ext + klen + self.body_bytes
        dtype = np.dtype(
            {
                "names": ["header", "extras", "key", "value"],
                "formats": [
                    layouts.HEADER.numpy_dtype(),
                    layouts.MUTATION.numpy_dtype(),
                    f"S{klen}",
                    f"S{self.body_bytes}",
                ],
                "offsets": [0, HEADER_LEN, HEADER_LEN + ext, HEADER_LEN + ext + klen],
                "itemsize": size,
            }
        )
        template = np.zeros(1, dtype)
        h = template["header"]
        h["magic"], h["opcode"], h["key_len"] = Magic.CLIENT_REQUEST, Opcode.DCP_MUTATION, klen
        h["ext_len"], h["datatype"], h["body_len"] = ext, Datatype.JSON, size - HEADER_LEN
        template["extras"]["rev_seqno"] = 1
        template["key"] = key_prefix + b"0" * DIGITS
        template["value"] = self.body
        key_digits = HEADER_LEN + ext + len(key_prefix)
        body_digits = HEADER_LEN + ext + klen + len(_BODY_HEAD)
        cached = self._records[collections] = (dtype, template, key_digits, body_digits)
        return cached

    def frames(self, chunk: Chunk) -> tuple[bytes, int, int]:
        import numpy as np

        vbid, lo, hi, opaque = chunk.vbid, chunk.lo, chunk.hi, chunk.opaque
        n = hi - lo
        if n <= 0 or COLLECTION_ID not in chunk.visible:
            return b"", 0, -1
        dtype, template, key_digits, body_digits = self._record(chunk.options.collections)
        start = self.offsets[vbid] + lo
        if n < FEW:
            return self._few(chunk, template.tobytes(), key_digits, body_digits)
        rec = np.empty(n, dtype)
        rec[:] = template[0]
        rec["header"]["vbucket_or_status"] = vbid
        rec["header"]["opaque"] = opaque
        numbers = self.numbers[start : start + n].astype(np.uint64)
        rec["header"]["cas"] = numbers + np.uint64(self.cas_base)
        rec["extras"]["by_seqno"] = np.arange(
            self.seqno(vbid, lo), self.seqno(vbid, hi), dtype=np.uint64
        )
        raw = rec.view(np.uint8).reshape(n, dtype.itemsize)
        for i in range(DIGITS):
            digit = ((numbers // np.uint64(10 ** (DIGITS - 1 - i))) % np.uint64(10) + 48).astype(
                np.uint8
            )
            raw[:, key_digits + i] = digit
            raw[:, body_digits + i] = digit
        return rec.tobytes(), n, self.seqno(vbid, hi - 1)

    def _few(
        self, chunk: Chunk, template: bytes, key_digits: int, body_digits: int
    ) -> tuple[bytes, int, int]:
        """:meth:`frames` of a few documents, the same bytes: one struct pack a frame, the
        template's bytes between the fields that vary (:func:`_frame_packer`)."""
        vbid, lo, hi, opaque = chunk.vbid, chunk.lo, chunk.hi, chunk.opaque
        packer, c0, c1, c2, c3, c4 = _frame_packer(template, key_digits, body_digits)
        pack, cas_base, seqno = packer.pack, self.cas_base, self.seqno(vbid, lo)
        start = int(self.offsets[vbid]) + lo
        out = []
        for i, number in enumerate(self.numbers[start : start + hi - lo].tolist()):
            digits = b"%0*d" % (DIGITS, number)
            out.append(
                pack(c0, vbid, c1, opaque, cas_base + number, seqno + i, c2, digits, c3, digits, c4)
            )
        return b"".join(out), hi - lo, self.seqno(vbid, hi - 1)


@functools.lru_cache(maxsize=8)
def _frame_packer(
    template: bytes, key_digits: int, body_digits: int
) -> tuple[struct.Struct, bytes, bytes, bytes, bytes, bytes]:
    """A struct for a whole bulk frame: the header's vbucket, opaque and CAS, the by_seqno,
    the key's and the body's digits, and the five runs of the template's bytes around them
    (the layout tables' offsets: the header's fields, then by_seqno first in the extras)."""
    (vb_at, vb), (op_at, op), (cas_at, cas), (seq_at, seq) = _VBUCKET, _OPAQUE, _CAS, _BY_SEQNO
    assert op_at + op.size == cas_at and cas_at + cas.size == seq_at
    after_seqno = seq_at + seq.size
    fmt = (
        f">{vb_at}s{vb.format[1:]}{op_at - vb_at - vb.size}s{op.format[1:]}{cas.format[1:]}"
        f"{seq.format[1:]}{key_digits - after_seqno}s{DIGITS}s"
        f"{body_digits - key_digits - DIGITS}s{DIGITS}s{len(template) - body_digits - DIGITS}s"
    )
    return (
        struct.Struct(fmt),
        template[:vb_at],
        template[vb_at + vb.size : op_at],
        template[after_seqno:key_digits],
        template[key_digits + DIGITS : body_digits],
        template[body_digits + DIGITS :],
    )
