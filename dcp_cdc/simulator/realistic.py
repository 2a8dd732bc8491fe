"""Realistic bulk documents: numbered documents shaped like a real bucket's, built fast.

Bulk documents of this shape (:class:`RealisticDocs`, ``--bulk-shape realistic`` of the test
producer) are numbered as the small ones (:class:`~dcp_cdc.simulator.bulk.NumberedDocs`:
key ``bulk::<k, 10 digits>``, the vbucket of its CRC32, rev seqno 1), but each is what a real
bucket holds:

- a nested JSON body of 0.5 to 4 KB (sizes spread log-uniformly, most near the small end),
  filled from one of :data:`TEMPLATES` templates of varied shape (document ``k`` from template
  ``k % TEMPLATES``) with its own id, a price and a timestamp; about 2 % are binary
  (datatype RAW, mostly incompressible bytes, :data:`BINARY_TEMPLATES` of them);
- about 10 % carry XATTRs: a system ``_sync`` xattr and a user ``meta`` xattr, in the XATTR
  section of docs/protocol/dcp.md §2;
- spread over the four collections of :data:`SCOPES` (two scopes), which the bucket creates
  before the documents: their system events come first in every vbucket (§6.7);
- Snappy-compressed on the wire when the connection negotiated Snappy, as the test
  producer compresses every value of :data:`~dcp_cdc.simulator.stream.SNAPPY_MIN_BYTES` or
  more (§2: the whole value, XATTR section and body, in Snappy's raw block format);
- the document flags the SDKs write: ``0x02000006`` for JSON, ``0x03000000`` for binary.

Everything about document ``k`` follows from ``k`` (:func:`attributes`): nothing is kept per
document but its number. Frames are built a document at a time by one ``bytes % mapping``
per document: each template is kept as a format whose slots are the document's digits, both
as it is and Snappy-compressed. Snappy's literal elements carry bytes verbatim, so the
compressed form is the template's text between slots, each piece compressed on its own, and
each slot a literal element of fixed width: patching the digits of the compressed bytes gives
the compressed document.

:func:`truth` is what silver must hold for them, per collection: the number of documents and
an order-independent digest (the sum of :func:`row_digest` over them), cheap enough for
millions of documents; :meth:`RealisticDocs.document` is one document's expected values.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from dcp_cdc.protocol import Datatype, Magic, Opcode
from dcp_cdc.simulator.bulk import DIGITS, KEY_PREFIX, BulkDocs, Chunk, NumberedDocs
from dcp_cdc.simulator.frames import MUTATION
from dcp_cdc.simulator.model import Bucket
from dcp_cdc.simulator.stream import SNAPPY_MIN_BYTES
from dcp_cdc.snappy import compress, preamble
from dcp_cdc.varint import encode_uleb128
from dcp_cdc.xattrs import split_xattrs

if TYPE_CHECKING:
    import numpy as np

SCOPES = (("shop", ("products", "orders")), ("people", ("profiles", "activity")))
"""The scopes and collections the documents are spread over, in this order."""
COLLECTION_TENTHS = (0, 0, 0, 0, 1, 1, 1, 2, 2, 3)
"""Collection index by ``h % 10``: 40 % products, 30 % orders, 20 % profiles, 10 % activity."""
TEMPLATES = 256
BINARY_TEMPLATES = 16
BINARY_IN = 50
"""One document in 50 is binary."""
XATTRS_IN = 10
"""One document in 10 carries XATTRs."""
MIN_VALUE, MAX_VALUE = 512, 4096
"""Bounds of a document's value once decompressed (XATTR section and body)."""
JSON_FLAGS, BINARY_FLAGS = 0x02000006, 0x03000000
SEED = 42
TS_BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
_YEAR_MS = 365 * 86_400_000
_SLOTS = {"ID": (b"i", DIGITS), "N6": (b"p", 6), "TS": (b"t", 13)}
"""Slot name → (mapping key of the format, width in digits)."""
_REQUEST, _MUT_EXT = int(Magic.CLIENT_REQUEST), 31
_JSON, _SNAPPY, _XATTR = int(Datatype.JSON), int(Datatype.SNAPPY), int(Datatype.XATTR)

Part = bytes | str
"""A template's piece: bytes as they are, or the name of a slot (``ID``, ``N6``, ``TS``)."""


# --- what document k is ----------------------------------------------------------------------


def _mix(numbers: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """A 64-bit hash of each number (splitmix64's finalizer)."""
    import numpy as np

    with np.errstate(over="ignore"):
        h = numbers.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


@dataclass(frozen=True)
class Attributes:
    """What follows from the documents' numbers, one numpy array each: the collection's
    index in :data:`SCOPES` order, the variant (template and XATTRs, :func:`variants`), and
    the price (``N6``) and timestamp (``TS``) slots."""

    collection: np.ndarray[Any, Any]
    variant: np.ndarray[Any, Any]
    price: np.ndarray[Any, Any]
    ts: np.ndarray[Any, Any]


def collection_index(numbers: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """Each document's collection, as its index in :data:`SCOPES` order."""
    return _collection(_mix(numbers))


def _collection(h: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    import numpy as np

    tenths = np.array(COLLECTION_TENTHS, dtype=np.int64)
    return tenths[((h >> np.uint64(8)) % np.uint64(10)).astype(np.int64)]


def attributes(numbers: np.ndarray[Any, Any]) -> Attributes:
    import numpy as np

    k = numbers.astype(np.uint64)
    h = _mix(k)
    collection = _collection(h)
    binary = (h >> np.uint64(16)) % np.uint64(BINARY_IN) == 0
    xattrs = (h >> np.uint64(24)) % np.uint64(XATTRS_IN) == 0
    template = np.where(
        binary,
        TEMPLATES + (k % np.uint64(BINARY_TEMPLATES)).astype(np.int64),
        (k % np.uint64(TEMPLATES)).astype(np.int64),
    )
    variant = template * 2 + xattrs
    price = 100_000 + ((h >> np.uint64(32)) % np.uint64(900_000)).astype(np.int64)
    ts = TS_BASE_MS + ((k * np.uint64(7919)) % np.uint64(_YEAR_MS)).astype(np.int64)
    return Attributes(collection, variant, price, ts)


# --- the templates ------------------------------------------------------------------------------

_WORDS = (
    "blue", "quick", "order", "shipped", "returned", "warranty", "size", "colour", "premium",
    "value", "fresh", "organic", "limited", "edition", "classic", "modern", "steel", "cotton",
    "leather", "wooden", "glass", "compact", "portable", "wireless", "eco", "bundle", "gift",
)  # fmt: skip
_CITIES = ("Paris", "Lyon", "Zürich", "Tokyo", "São Paulo", "Kraków", "Oslo", "Montréal")
_KINDS = ("product", "order", "profile", "event", "invoice", "review")


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def _piece(rng: random.Random, depth: int) -> object:
    """One field's value: scalars, arrays, nested objects."""
    roll = rng.random()
    if depth >= 3 or roll < 0.35:
        return rng.choice(
            [
                rng.randint(0, 10_000),
                round(rng.uniform(0, 1000), 2),
                rng.random() < 0.5,
                None,
                _text(rng, rng.randint(1, 6)),
                rng.choice(_CITIES),
            ]
        )
    if roll < 0.6:
        return [_piece(rng, depth + 1) for _ in range(rng.randint(1, 5))]
    return {f"{rng.choice(_WORDS)}_{i}": _piece(rng, depth + 1) for i in range(rng.randint(2, 6))}


def _dump(doc: object) -> bytes:
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()


def json_template(index: int) -> bytes:
    """Template ``index``: a nested JSON object of a size drawn log-uniformly in 512..3,700
    bytes once filled, with ``"@ID@"`` (a string of 10 digits), ``"@N6@"`` and ``"@TS@"``
    (numbers of 6 and 13 digits) left for each document."""
    rng = random.Random(SEED * 100_003 + index)
    target = int(512 * (3700 / 512) ** rng.random())
    doc: dict[str, object] = {
        "type": rng.choice(_KINDS),
        "id": "@ID@",
        "schema": rng.randint(1, 4),
        "price": "@N6@",
        "updated": "@TS@",
        "details": {f"{rng.choice(_WORDS)}_{i}": _piece(rng, 1) for i in range(rng.randint(2, 4))},
    }
    filled = 6 + 0 + 7  # what the slots add once filled (the numbers lose their quotes)
    while True:
        name = f"{rng.choice(_WORDS)}_{len(doc)}"
        doc[name] = _piece(rng, 0)
        if len(_dump(doc)) + filled > target:
            del doc[name]
            break
    room = target - len(_dump(doc)) - filled - len(',"notes":""')
    notes = _text(rng, max(1, room // 6))
    doc["notes"] = (notes + " " * room)[: max(room, 1)]
    return _dump(doc)


def binary_template(index: int) -> list[Part]:
    """Binary template ``index``: a short header naming the document, then random bytes
    (a thumbnail, an encrypted blob): 512..3,000 bytes once filled."""
    rng = random.Random(SEED * 200_003 + index)
    size = rng.randint(512, 3000) - 16
    return [b"\x89DOC\r\n\x1a\n", "ID", rng.randbytes(size)]


_SYNC = (
    b'{"rev":"1-@ID@","sequence":@TS@,"recent_sequences":[@TS@],'
    b'"history":{"revs":["1-@ID@"],"parents":[-1],"channels":[["bulk"]]},'
    b'"channels":{"bulk":null},"time_saved":"2026-01-05T09:30:00.000Z"}'
)
_META = b'{"source":"import","batch":@N6@,"owner":"@ID@"}'


def xattr_section() -> bytes:
    """The XATTR section of a document that has XATTRs (docs/protocol/dcp.md §2): a system
    ``_sync`` xattr and a user ``meta`` xattr, with ``@ID@``, ``@N6@`` and ``@TS@`` slots."""
    pairs = b""
    for name, value in ((b"_sync", _SYNC), (b"meta", _META)):
        pair = name + b"\x00" + value + b"\x00"
        pairs += _filled(pair).to_bytes(4, "big") + pair
    return _filled(pairs).to_bytes(4, "big") + pairs


def _filled(template: bytes) -> int:
    """The length of ``template`` once its slots are filled."""
    return len(_fill(_parts(template), 0, 0, 0))


def _parts(template: bytes) -> list[Part]:
    """``template`` split at its slots (a number slot in quotes loses them: JSON)."""
    text = re.sub(rb'"@(N6|TS)@"', rb"@\1@", template)
    parts: list[Part] = []
    pos = 0
    for m in re.finditer(rb"@(ID|N6|TS)@", text):
        parts += [text[pos : m.start()], m.group(1).decode()]
        pos = m.end()
    parts.append(text[pos:])
    return [p for p in parts if p != b""]


@dataclass(frozen=True)
class Variant:
    """One template with or without XATTRs: its parts, and what its frames carry."""

    xattrs: list[Part]
    body: list[Part]
    is_json: bool

    def value_parts(self, with_xattrs: bool) -> list[Part]:
        return [*self.xattrs, *self.body] if with_xattrs else list(self.body)

    @cached_property
    def body_format(self) -> bytes:
        return _format(self.body)

    @cached_property
    def xattrs_format(self) -> bytes:
        return _format(self.xattrs)


def variants() -> list[Variant]:
    """Every variant, by number: template ``t`` without XATTRs is ``2 t``, with them
    ``2 t + 1``; the binary templates follow the JSON ones."""
    section = _parts(xattr_section())
    bodies: list[tuple[list[Part], bool]] = [
        (_parts(json_template(t)), True) for t in range(TEMPLATES)
    ]
    bodies += [(binary_template(t), False) for t in range(BINARY_TEMPLATES)]
    return [
        Variant(section if x else [], body, is_json) for body, is_json in bodies for x in (0, 1)
    ]


def _format(parts: Sequence[Part]) -> bytes:
    """A ``bytes % mapping`` format of the parts, its slots the documents' digits."""
    out = b""
    for part in parts:
        if isinstance(part, str):
            key, width = _SLOTS[part]
            out += b"%(" + key + b")0" + str(width).encode() + b"d"
        else:
            out += part.replace(b"%", b"%%")
    return out


def _compressed_format(parts: Sequence[Part]) -> bytes:
    """The format of the Snappy block of the parts: the preamble (the filled length), each
    piece of text compressed on its own (its elements only copy from itself), and each slot
    a literal element of its width (docs/protocol/dcp.md §2: Snappy's raw block format)."""
    total = sum(_SLOTS[p][1] if isinstance(p, str) else len(p) for p in parts)
    pieces: list[Part] = [encode_uleb128(total)]
    for part in parts:
        if isinstance(part, str):
            pieces += [bytes([(_SLOTS[part][1] - 1) << 2]), part]  # literal tag, len - 1 < 60
        else:
            block = compress(part)
            pieces.append(block[preamble(block)[1] :])
    return _format(pieces)


def _fill(parts: Sequence[Part], number: int, price: int, ts: int) -> bytes:
    return _format(parts) % {b"i": number, b"p": price, b"t": ts}


# --- the documents ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RealisticDoc:
    """One document as silver must hold it."""

    collection: int
    """Its collection's index in :data:`SCOPES` order."""
    key: bytes
    body: bytes
    is_json: bool
    xattrs: dict[str, str] | None
    flags: int

    @property
    def user_xattrs(self) -> dict[str, str]:
        return {k: v for k, v in (self.xattrs or {}).items() if not k.startswith("_")}


class RealisticDocs(NumberedDocs):
    """``count`` realistic bulk documents (see the module's doc) added to ``bucket``, their
    scopes and collections created first."""

    shape = "realistic"

    def __init__(self, bucket: Bucket, count: int) -> None:
        ids = []
        for scope_name, names in SCOPES:
            scope = bucket.create_scope(scope_name)
            ids += [bucket.create_collection(scope.scope_id, n).collection_id for n in names]
        self.collection_ids = tuple(ids)
        self.variants = variants()
        self._forms: dict[tuple[bool, bool], list[tuple[bytes, int, int, int]]] = {}
        super().__init__(bucket, count)

    def collections_of(self, numbers: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        return collection_index(numbers)

    def forms(self, *, xattrs: bool, snappy: bool) -> list[tuple[bytes, int, int, int]]:
        """Per variant, as a connection that negotiated ``xattrs`` and ``snappy`` receives
        it: (the format of key digits and value, datatype, value length, flags)."""
        cached = self._forms.get((xattrs, snappy))
        if cached is not None:
            return cached
        out = []
        for v in self.variants:
            parts = v.value_parts(xattrs)
            datatype = (_JSON if v.is_json else 0) | (_XATTR if xattrs and v.xattrs else 0)
            value = _fill(parts, 0, 0, 0)
            if snappy and len(_fill(v.body, 0, 0, 0)) >= SNAPPY_MIN_BYTES:
                datatype |= _SNAPPY
                fmt = _compressed_format(parts)
                size = len(fmt % {b"i": 0, b"p": 0, b"t": 0})
            else:
                fmt, size = _format(parts), len(value)
            key = KEY_PREFIX.replace(b"%", b"%%") + b"%(i)0" + str(DIGITS).encode() + b"d"
            out.append((key + fmt, datatype, size, JSON_FLAGS if v.is_json else BINARY_FLAGS))
        self._forms[(xattrs, snappy)] = out
        return out

    def frames(self, chunk: Chunk) -> tuple[bytes, int, int]:
        import numpy as np

        vbid, lo, hi, options = chunk.vbid, chunk.lo, chunk.hi, chunk.options
        if hi <= lo:
            return b"", 0, -1
        start = int(self.offsets[vbid]) + lo
        numbers = self.numbers[start : start + hi - lo]
        a = attributes(numbers)
        wanted = [i for i, c in enumerate(self.collection_ids) if c in chunk.visible]
        keep = np.flatnonzero(np.isin(a.collection, wanted))
        if not len(keep):
            return b"", 0, -1
        seqnos = keep + self.seqno(vbid, lo)
        forms = self.forms(xattrs=options.xattrs, snappy=options.snappy)
        prefixes = [encode_uleb128(c) if options.collections else b"" for c in self.collection_ids]
        klens = [len(p) + len(KEY_PREFIX) + DIGITS for p in prefixes]
        out = bytearray()
        pack, cas_base, opaque = MUTATION.pack, self.cas_base, chunk.opaque
        for (k, c, v, p, t), seqno in zip(
            _rows(numbers[keep], a, keep), seqnos.tolist(), strict=True
        ):
            fmt, datatype, size, flags = forms[v]
            klen = klens[c]
            out += pack(
                _REQUEST, Opcode.DCP_MUTATION, klen, _MUT_EXT, datatype, vbid,
                _MUT_EXT + klen + size, opaque, cas_base + k, seqno, 1, flags, 0, 0, 0, 0,
            )  # fmt: skip
            out += prefixes[c]
            out += fmt % {b"i": k, b"p": p, b"t": t}
        return bytes(out), len(keep), int(seqnos[-1])

    def document(self, number: int) -> RealisticDoc:
        """Document ``number`` as silver must hold it."""
        return document(number, self.variants)


def document(number: int, kinds: Sequence[Variant] | None = None) -> RealisticDoc:
    """Document ``number`` (see the module's doc); ``kinds``: :func:`variants`, made once."""
    import numpy as np

    return next(_documents(np.array([number], dtype=np.uint64), kinds or variants()))


def documents(count: int, chunk: int = 65_536) -> Iterator[RealisticDoc]:
    """The first ``count`` documents in number order, their attributes computed a chunk at
    a time."""
    import numpy as np

    kinds = variants()
    for lo in range(0, count, chunk):
        yield from _documents(np.arange(lo, min(count, lo + chunk), dtype=np.uint64), kinds)


def _rows(
    numbers: np.ndarray[Any, Any], a: Attributes, keep: np.ndarray[Any, Any] | None = None
) -> Iterator[tuple[int, int, int, int, int]]:
    """(number, collection, variant, price, timestamp) of each document (of those at
    ``keep``, when given)."""
    columns = (a.collection, a.variant, a.price, a.ts)
    if keep is not None:
        columns = tuple(c[keep] for c in columns)
    return zip(numbers.tolist(), *(c.tolist() for c in columns), strict=True)


def _documents(numbers: np.ndarray[Any, Any], kinds: Sequence[Variant]) -> Iterator[RealisticDoc]:
    for k, c, v, p, t in _rows(numbers, attributes(numbers)):
        kind, values = kinds[v], {b"i": k, b"p": p, b"t": t}
        xattrs = split_xattrs(kind.xattrs_format % values)[0] if kind.xattrs else None
        yield RealisticDoc(
            c,
            KEY_PREFIX + b"%0*d" % (DIGITS, k),
            kind.body_format % values,
            kind.is_json,
            xattrs,
            JSON_FLAGS if kind.is_json else BINARY_FLAGS,
        )


# --- the truth ----------------------------------------------------------------------------------


def row_digest(
    key: str,
    body: bytes,
    *,
    is_json: bool,
    user_xattrs: Mapping[str, str] | None,
    flags: int,
    expiry: int,
    rev_seqno: int,
) -> int:
    """A silver row's digest: the first 60 bits of the MD5 of its key, body (``j`` and the
    JSON text, or ``b`` and the bytes in upper-case hex), user xattrs (``name \\x01 value``
    in name order, joined by ``\\x02``), flags, expiry and rev seqno, joined by NUL. Summed
    over rows (exactly, as integers) it does not depend on their order."""
    text = "j" + body.decode("utf-8") if is_json else "b" + body.hex().upper()
    xattrs = "\x02".join(f"{k}\x01{v}" for k, v in sorted((user_xattrs or {}).items()))
    row = "\x00".join([key, text, xattrs, str(flags), str(expiry), str(rev_seqno)])
    return int(hashlib.md5(row.encode("utf-8")).hexdigest()[:15], 16)


@dataclass
class CollectionTruth:
    """What a collection's live rows must add up to."""

    documents: int = 0
    digest: int = 0

    def add(self, digest: int) -> None:
        self.documents += 1
        self.digest += digest


def _row_format(kind: Variant) -> bytes | None:
    """The ``bytes % mapping`` format of the text :func:`row_digest` hashes, for a JSON
    variant (None for a binary one, whose body it hexes)."""
    if not kind.is_json:
        return None
    user = _parts(b"meta\x01" + _META) if kind.xattrs else []
    key: list[Part] = [KEY_PREFIX, "ID"]
    tail = b"\x00%d\x000\x001" % JSON_FLAGS
    return _format([*key, b"\x00j", *kind.body, b"\x00", *user, tail])


def truth(count: int, chunk: int = 65_536) -> list[CollectionTruth]:
    """Per collection (:data:`SCOPES` order), what silver holds of the first ``count``
    realistic documents: a JSON document's row is hashed straight from its variant's
    format, a binary one through :func:`row_digest`."""
    import numpy as np

    kinds = variants()
    rows = [_row_format(kind) for kind in kinds]
    out = [CollectionTruth() for _ in range(sum(len(n) for _, n in SCOPES))]
    md5 = hashlib.md5
    for lo in range(0, count, chunk):
        numbers = np.arange(lo, min(count, lo + chunk), dtype=np.uint64)
        for k, c, v, p, t in _rows(numbers, attributes(numbers)):
            row = rows[v]
            if row is not None:
                out[c].add(int(md5(row % {b"i": k, b"p": p, b"t": t}).hexdigest()[:15], 16))
                continue
            kind, values = kinds[v], {b"i": k, b"p": p, b"t": t}
            user = split_xattrs(kind.xattrs_format % values)[0] if kind.xattrs else {}
            key = KEY_PREFIX + b"%0*d" % (DIGITS, k)
            out[c].add(
                row_digest(
                    key.decode(),
                    kind.body_format % values,
                    is_json=False,
                    user_xattrs={n: x for n, x in user.items() if not n.startswith("_")},
                    flags=BINARY_FLAGS,
                    expiry=0,
                    rev_seqno=1,
                )
            )
    return out


def small_truth(count: int, body_bytes: int) -> list[CollectionTruth]:
    """What silver holds of ``count`` small bulk documents of ``body_bytes``
    (:class:`~dcp_cdc.simulator.bulk.BulkDocs`, collection 0): one :class:`CollectionTruth`."""
    head, tail = BulkDocs.body_around(body_bytes)
    row = _format([KEY_PREFIX, "ID", b"\x00j" + head, "ID", tail + b"\x00\x000\x000\x001"])
    out = CollectionTruth()
    md5 = hashlib.md5
    for k in range(count):
        out.add(int(md5(row % {b"i": k}).hexdigest()[:15], 16))
    return [out]
