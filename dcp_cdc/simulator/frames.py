"""Document frames for the test producer, fast (docs/protocol/dcp.md §6.4–§6.6).

:class:`DocFrames` writes the very bytes ``encode(EventMaker.doc_event(...))`` writes, one
struct pack per frame: the header and the extras are packed together through
:func:`dcp_cdc.layouts.joined` (the layout tables stay the one source), the collection's key
prefix is cached, and so is the value of each document version that costs something to build
(xattrs joined, Snappy compressed): a version never changes, a new one is a new object. The
generic path builds an event object per document and encodes it field by field, ~25 µs a
frame; a benchmark producer must push half a million frames a second. A system event
(docs/protocol/dcp.md §6.7) is encoded the generic way once per shape (the same collection's
creation in every vbucket), then copied with its vbucket, opaque and seqno written in.
"""

from __future__ import annotations

import dataclasses
import operator
import struct
from collections.abc import Callable, Iterable

from dcp_cdc import layouts
from dcp_cdc.encoder import doc_value, encode
from dcp_cdc.protocol import HEADER_LEN, Datatype, Magic, Opcode
from dcp_cdc.simulator.model import Doc, Item, SysEvent, VBucket
from dcp_cdc.simulator.stream import DISK_MARKER_FLAGS, SNAPPY_MIN_BYTES, EventMaker
from dcp_cdc.varint import encode_uleb128

MUTATION = layouts.joined(layouts.HEADER, layouts.MUTATION)
DELETION_V1 = layouts.joined(layouts.HEADER, layouts.DELETION_V1)
DELETION_V2 = layouts.joined(layouts.HEADER, layouts.DELETION_V2)
EXPIRATION = layouts.joined(layouts.HEADER, layouts.EXPIRATION)
_REQUEST = int(Magic.CLIENT_REQUEST)
_JSON, _SNAPPY, _XATTR = int(Datatype.JSON), int(Datatype.SNAPPY), int(Datatype.XATTR)
_COSTLY = _SNAPPY | _XATTR
_MUT_EXT = layouts.MUTATION.length
_DEL1_EXT, _DEL2_EXT = layouts.DELETION_V1.length, layouts.DELETION_V2.length
_EXP_EXT = layouts.EXPIRATION.length
_SYS_SHAPE = operator.attrgetter(
    *(f.name for f in dataclasses.fields(SysEvent) if f.name != "seqno")
)
"""Everything of a system event but its seqno: what its frame is made of, the vbucket's
header and the seqno aside (the same collection's creation in every vbucket of a bucket)."""
_SYS_VBUCKET = layouts.HEADER.offset_of("vbucket_or_status")
_SYS_OPAQUE = layouts.HEADER.offset_of("opaque")
_SYS_SEQNO = HEADER_LEN + layouts.SYSTEM_EVENT.offset_of("by_seqno")
_U16, _U32, _U64 = struct.Struct(">H"), struct.Struct(">I"), struct.Struct(">Q")
_SYS_FRAMES_KEPT = 4096
_V2 = layouts.SNAPSHOT_MARKER_V2_EXTRAS
_MARKERS = {  # a V2 marker's version byte and its value's layout (docs/protocol/dcp.md §6.3)
    "2.0": (layouts.joined(layouts.HEADER, _V2, layouts.SNAPSHOT_MARKER_V2_0), 0),
    "2.2": (layouts.joined(layouts.HEADER, _V2, layouts.SNAPSHOT_MARKER_V2_2), 2),
}
_DISK_FLAGS = int(DISK_MARKER_FLAGS)


class ValueCache:
    """Values of document versions (xattrs joined, Snappy applied) by object, one table per
    datatype: entries hold their document, so an id is never reused while cached. A table is
    cleared when it reaches ``limit`` entries."""

    def __init__(self, limit: int = 1 << 20) -> None:
        self.limit = limit
        self._tables: dict[int, dict[int, tuple[Doc, bytes]]] = {}

    def value(self, doc: Doc, datatype: int, xattrs: dict[str, str] | None) -> bytes:
        table = self._tables.get(datatype)
        if table is None:
            table = self._tables[datatype] = {}
        hit = table.get(id(doc))
        if hit is not None and hit[0] is doc:
            return hit[1]
        value = doc_value(datatype, doc.body, xattrs)
        if len(table) >= self.limit:
            table.clear()
        table[id(doc)] = (doc, value)
        return value


class DocFrames:
    """Frames of bucket items for one connection's options, into a bytearray."""

    def __init__(self, maker: EventMaker, cache: ValueCache) -> None:
        opts = maker.options
        if opts.stream_ids or opts.vbucket_offset:
            raise ValueError("fast frames: stream ids and vbucket offsets are not served")
        self.maker = maker
        self.cache = cache
        self.collections = opts.collections
        self.xattrs = opts.xattrs
        self.snappy = opts.snappy
        self.delete_times = opts.delete_times
        self.expiry_opcode = opts.expiry_opcode and opts.delete_times
        self._prefixes: dict[int, bytes] = {}
        self._sys_frames: dict[tuple[object, ...], bytes] = {}

    def _prefix(self, collection_id: int) -> bytes:
        prefix = self._prefixes.get(collection_id)
        if prefix is None:
            prefix = self._prefixes[collection_id] = encode_uleb128(collection_id)
        return prefix

    def items(
        self,
        out: bytearray,
        vbid: int,
        items: Iterable[Item],
        *,
        disk: bool,
        opaque: int,
        collection_filter: tuple[int, ...] | None,
    ) -> tuple[int, int]:
        """Append the frames of the visible ``items`` (as :meth:`EventMaker.visible` says);
        returns (frames written, seqno of the last one or -1)."""
        maker = self.maker
        wanted = maker.options.collection_filter if collection_filter is None else collection_filter
        collections = self.collections
        count, last = 0, -1
        docs: list[Doc] = []
        for item in items:
            doc = item.doc
            if doc is not None:
                cid = doc.collection_id
                if (not collections and cid != 0) or (wanted is not None and cid not in wanted):
                    continue
                docs.append(doc)
                continue
            if not maker.visible(item, collection_filter):
                continue
            if docs:
                count += self.docs(out, vbid, docs, disk=disk, opaque=opaque)
                docs = []
            assert item.sys is not None
            self.sys_event(out, vbid, item.sys, opaque=opaque)
            count += 1
            last = item.seqno
        if docs:
            count += self.docs(out, vbid, docs, disk=disk, opaque=opaque)
            last = max(last, docs[-1].seqno)
        return count, last

    def backfill_marker(
        self, out: bytearray, vb: VBucket, start: int, *, end: int, opaque: int
    ) -> None:
        """Append ``encode(EventMaker.backfill_marker(vb, start, end=end, opaque=opaque))``,
        packed in one call: one per stream, where the generic path takes ~13 µs."""
        version = self.maker.backfill_marker_version(vb)
        packer, code = _MARKERS[version]
        body = packer.size - HEADER_LEN
        common = (_REQUEST, Opcode.DCP_SNAPSHOT_MARKER, 0, _V2.length, 0, vb.vbid, body, opaque)
        if version == "2.2":
            out += packer.pack(*common, 0, code, start, end, _DISK_FLAGS, end, 0, vb.purge_seqno, 0)
        else:
            out += packer.pack(*common, 0, code, start, end, _DISK_FLAGS, end, 0)

    def sys_event(self, out: bytearray, vbid: int, ev: SysEvent, *, opaque: int) -> None:
        """Append the system event's frame: encoded once per event shape
        (:data:`_SYS_SHAPE`), then its vbucket, opaque and seqno written in."""
        shape = _SYS_SHAPE(ev)
        frame = self._sys_frames.get(shape)
        if frame is None:
            if len(self._sys_frames) >= _SYS_FRAMES_KEPT:
                self._sys_frames.clear()
            frame = encode(self.maker.sys_event(0, ev, opaque=0))
            self._sys_frames[shape] = frame
        at = len(out)
        out += frame
        _U16.pack_into(out, at + _SYS_VBUCKET, vbid)
        _U32.pack_into(out, at + _SYS_OPAQUE, opaque)
        _U64.pack_into(out, at + _SYS_SEQNO, ev.seqno)

    def docs(
        self, out: bytearray, vbid: int, docs: Iterable[Doc], *, disk: bool, opaque: int
    ) -> int:
        """Append one frame per document (no visibility check); returns how many."""
        getrandbits: Callable[[int], int] = self.maker.rng.getrandbits
        cached = self.cache.value
        prefix = self._prefix if self.collections else None
        xattrs_on, snappy_on = self.xattrs, self.snappy
        mutation, n = MUTATION.pack, 0
        for doc in docs:
            key = doc.key if prefix is None else prefix(doc.collection_id) + doc.key
            xattrs = doc.xattrs if xattrs_on and doc.xattrs else None
            if doc.deleted:
                self._deletion(out, vbid, doc, key, xattrs, disk=disk, opaque=opaque)
                n += 1
                continue
            body = doc.body
            datatype = (_JSON if doc.is_json else 0) | (_XATTR if xattrs else 0)
            if snappy_on and len(body) >= SNAPPY_MIN_BYTES:
                datatype |= _SNAPPY
            value = cached(doc, datatype, xattrs) if datatype & _COSTLY else body
            nru = getrandbits(2)  # random.randrange(3), draw for draw (the generic path's NRU)
            while nru >= 3:
                nru = getrandbits(2)
            klen = len(key)
            out += mutation(
                _REQUEST, Opcode.DCP_MUTATION, klen, _MUT_EXT, datatype, vbid,
                _MUT_EXT + klen + len(value), opaque, doc.cas,
                doc.seqno, doc.rev_seqno, doc.flags, doc.expiry, 0, 0, nru,
            )  # fmt: skip
            out += key
            out += value
            n += 1
        return n

    def _deletion(
        self,
        out: bytearray,
        vbid: int,
        doc: Doc,
        key: bytes,
        xattrs: dict[str, str] | None,
        *,
        disk: bool,
        opaque: int,
    ) -> None:
        datatype = _XATTR if xattrs else 0  # a tombstone keeps system xattrs only
        value = self.cache.value(doc, datatype, xattrs) if xattrs else b""
        delete_time = doc.delete_time if disk else 0
        klen = len(key)
        if doc.change == "expire" and self.expiry_opcode:
            out += EXPIRATION.pack(
                _REQUEST, Opcode.DCP_EXPIRATION, klen, _EXP_EXT, datatype, vbid,
                _EXP_EXT + klen + len(value), opaque, doc.cas, doc.seqno, doc.rev_seqno, delete_time,
            )  # fmt: skip
        elif self.delete_times:
            out += DELETION_V2.pack(
                _REQUEST, Opcode.DCP_DELETION, klen, _DEL2_EXT, datatype, vbid,
                _DEL2_EXT + klen + len(value), opaque, doc.cas, doc.seqno, doc.rev_seqno, delete_time,
            )  # fmt: skip
        else:
            out += DELETION_V1.pack(
                _REQUEST, Opcode.DCP_DELETION, klen, _DEL1_EXT, datatype, vbid,
                _DEL1_EXT + klen + len(value), opaque, doc.cas, doc.seqno, doc.rev_seqno, 0,
            )  # fmt: skip
        out += key
        out += value
