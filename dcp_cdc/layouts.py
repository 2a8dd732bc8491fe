"""Frame layouts, declared once.

Each :class:`Layout` is one fixed-size section of a frame (the 24-byte header, an extras block,
or the fixed part of a value) as a table of big-endian unsigned fields. Both faces of the
decoder read through these tables: the event iterator unpacks them with :mod:`struct`, the
columnar decoder gathers them with numpy (:meth:`Layout.numpy_dtype`), and the encoder packs
them. Offsets are relative to the section start (docs/protocol/dcp.md §6: "extras offsets").
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dcp_cdc.protocol import HEADER_LEN

if TYPE_CHECKING:
    import numpy as np

_CODES = {1: "B", 2: "H", 4: "I", 8: "Q"}


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    offset: int
    size: int


@dataclass(frozen=True)
class Layout:
    """A fixed-size section: ``length`` bytes holding ``fields`` (unsigned, big-endian)."""

    name: str
    length: int
    fields: tuple[Field, ...]
    spec: str
    _struct: struct.Struct = field(init=False, repr=False, compare=False)
    _names: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _known: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        fmt = ">"
        pos = 0
        for f in self.fields:
            if f.offset < pos or f.size not in _CODES:
                raise ValueError(f"layout {self.name}: bad field {f}")
            fmt += "x" * (f.offset - pos) + _CODES[f.size]
            pos = f.offset + f.size
        if pos > self.length:
            raise ValueError(f"layout {self.name}: fields exceed length {self.length}")
        fmt += "x" * (self.length - pos)
        object.__setattr__(self, "_struct", struct.Struct(fmt))
        object.__setattr__(self, "_names", tuple(f.name for f in self.fields))
        object.__setattr__(self, "_known", frozenset(self._names))

    @property
    def names(self) -> tuple[str, ...]:
        return self._names

    def unpack(self, buf: bytes | bytearray | memoryview, offset: int = 0) -> tuple[int, ...]:
        """Field values in declaration order; ``buf`` must hold ``length`` bytes at ``offset``."""
        return self._struct.unpack_from(buf, offset)

    def unpack_dict(self, buf: bytes | bytearray | memoryview, offset: int = 0) -> dict[str, int]:
        return dict(zip(self.names, self._struct.unpack_from(buf, offset), strict=True))

    def pack(self, **values: int) -> bytes:
        """Bytes of the section; fields not given are 0, unknown names are an error."""
        if not values.keys() <= self._known:
            unknown = sorted(values.keys() - self._known)
            raise TypeError(f"layout {self.name} has no field(s) {unknown}")
        return self._struct.pack(*(values.get(n, 0) for n in self._names))

    def offset_of(self, name: str) -> int:
        """Where field ``name`` starts in the section."""
        for f in self.fields:
            if f.name == name:
                return f.offset
        raise KeyError(f"layout {self.name} has no field {name!r}")

    def numpy_dtype(self) -> np.dtype[np.void]:
        """The section as a numpy structured dtype: big-endian fields at their offsets, one
        item per ``length`` bytes (the columnar face gathers sections with it)."""
        import numpy as np  # only the columnar face needs numpy; the event iterator does not

        return np.dtype(
            {
                "names": list(self.names),
                "formats": [f">u{f.size}" for f in self.fields],
                "offsets": [f.offset for f in self.fields],
                "itemsize": self.length,
            }
        )


def joined(*sections: Layout) -> struct.Struct:
    """One :class:`struct.Struct` for ``sections`` back to back (e.g. the header and a
    mutation's extras): a writer packs a whole fixed part with one call, still from these
    tables. Its values are the sections' fields in order."""
    return struct.Struct(">" + "".join(s._struct.format.lstrip(">") for s in sections))


def _layout(name: str, length: int, spec: str, *fields: tuple[str, int, int]) -> Layout:
    return Layout(name, length, tuple(Field(*f) for f in fields), spec)


# --- the header (docs/protocol/dcp.md §1.1) ----------------------------------------------------------------

HEADER = _layout(
    "header", HEADER_LEN, "§1.1",
    ("magic", 0, 1), ("opcode", 1, 1), ("key_len", 2, 2), ("ext_len", 4, 1), ("datatype", 5, 1),
    ("vbucket_or_status", 6, 2), ("body_len", 8, 4), ("opaque", 12, 4), ("cas", 16, 8),
)  # fmt: skip
"""The 24-byte header. With an alt magic (§1.3) the u16 ``key_len`` holds the framing extras
length in its high byte and the key length in its low byte."""
BODY_LEN_OFFSET = HEADER.offset_of("body_len")
"""Where the frame's length is: enough of a header to frame a stream (§1.1)."""

# --- extras sections (docs/protocol/dcp.md §6) -------------------------------------------------------------

MUTATION = _layout(
    "mutation", 31, "§6.4",
    ("by_seqno", 0, 8), ("rev_seqno", 8, 8), ("flags", 16, 4), ("expiration", 20, 4),
    ("lock_time", 24, 4), ("nmeta", 28, 2), ("nru", 30, 1),
)  # fmt: skip
DELETION_V1 = _layout(
    "deletion_v1", 18, "§6.5", ("by_seqno", 0, 8), ("rev_seqno", 8, 8), ("nmeta", 16, 2)
)
DELETION_V2 = _layout(
    "deletion_v2", 21, "§6.5", ("by_seqno", 0, 8), ("rev_seqno", 8, 8), ("delete_time", 16, 4)
)  # byte 20 is unused (formerly clen, errata E2)
EXPIRATION = _layout(
    "expiration", 20, "§6.6", ("by_seqno", 0, 8), ("rev_seqno", 8, 8), ("delete_time", 16, 4)
)
SNAPSHOT_MARKER_V1 = _layout(
    "snapshot_marker_v1", 20, "§6.3",
    ("start_seqno", 0, 8), ("end_seqno", 8, 8), ("snapshot_flags", 16, 4),
)  # fmt: skip
SNAPSHOT_MARKER_V2_EXTRAS = _layout(
    "snapshot_marker_v2_extras", 1, "§6.3", ("marker_version", 0, 1)
)
SYSTEM_EVENT = _layout(
    "system_event", 13, "§6.7", ("by_seqno", 0, 8), ("event_id", 8, 4), ("version", 12, 1)
)
SEQNO_ADVANCED = _layout("seqno_advanced", 8, "§6.8", ("by_seqno", 0, 8))
OSO_SNAPSHOT = _layout("oso_snapshot", 4, "§6.9", ("oso_flags", 0, 4))
STREAM_END = _layout("stream_end", 4, "§6.10", ("reason_code", 0, 4))
PREPARE = _layout(
    "prepare", 31, "§6.12",
    ("by_seqno", 0, 8), ("rev_seqno", 8, 8), ("flags", 16, 4), ("expiration", 20, 4),
    ("lock_time", 24, 4), ("nru", 28, 1), ("deleted", 29, 1), ("durability_level", 30, 1),
)  # fmt: skip
COMMIT = _layout("commit", 16, "§6.12", ("prepared_seqno", 0, 8), ("commit_seqno", 8, 8))
ABORT = _layout("abort", 16, "§6.12", ("prepared_seqno", 0, 8), ("abort_seqno", 8, 8))
SET_VBUCKET_STATE = _layout("set_vbucket_state", 1, "§6.13", ("vbucket_state", 0, 1))
STREAM_REQUEST = _layout(
    "stream_request", 48, "§4.4",
    ("flags", 0, 4), ("start_seqno", 8, 8), ("end_seqno", 16, 8), ("vb_uuid", 24, 8),
    ("snap_start_seqno", 32, 8), ("snap_end_seqno", 40, 8),
)  # fmt: skip
BUFFER_ACK = _layout("buffer_ack", 4, "§7.6", ("buffer_bytes", 0, 4))
VB_SEQNOS_REQUEST = _layout("vb_seqnos_request", 4, "GET_ALL_VB_SEQNOS", ("vbucket_state", 0, 4))
"""GET_ALL_VB_SEQNOS 0x48 request: the vbucket state asked for (1 active; 0 every state)."""
VB_SEQNOS_COLLECTION_REQUEST = _layout(
    "vb_seqnos_collection_request",
    8,
    "GET_ALL_VB_SEQNOS",
    ("vbucket_state", 0, 4),
    ("collection_id", 4, 4),
)
"""The same, for the high seqnos of one collection."""
ADD_STREAM = _layout("add_stream", 4, "§4.4, add-stream.md", ("flags", 0, 4))
"""DCP_ADD_STREAM 0x51 request: the stream flags (§4.4's flag bits)."""
ADD_STREAM_RESPONSE = _layout("add_stream_response", 4, "add-stream.md", ("stream_opaque", 0, 4))
"""Its response: the opaque the new stream's messages will carry."""

# --- fixed value sections ------------------------------------------------------------------

SNAPSHOT_MARKER_V2_0 = _layout(
    "snapshot_marker_v2_0", 36, "§6.3",
    ("start_seqno", 0, 8), ("end_seqno", 8, 8), ("snapshot_flags", 16, 4),
    ("max_visible_seqno", 20, 8), ("high_completed_seqno", 28, 8),
)  # fmt: skip
SNAPSHOT_MARKER_V2_2 = _layout(
    "snapshot_marker_v2_2", 52, "§6.3",
    ("start_seqno", 0, 8), ("end_seqno", 8, 8), ("snapshot_flags", 16, 4),
    ("max_visible_seqno", 20, 8), ("high_completed_seqno", 28, 8),
    ("purge_seqno", 36, 8), ("high_prepared_seqno", 44, 8),
)  # fmt: skip
COLLECTION_EVENT_V0 = _layout(
    "collection_event_v0", 16, "§6.7",
    ("manifest_uid", 0, 8), ("scope_id", 8, 4), ("collection_id", 12, 4),
)  # fmt: skip
COLLECTION_EVENT_V1 = _layout(
    "collection_event_v1", 20, "§6.7",
    ("manifest_uid", 0, 8), ("scope_id", 8, 4), ("collection_id", 12, 4), ("max_ttl", 16, 4),
)  # fmt: skip
SCOPE_EVENT_V0 = _layout("scope_event_v0", 12, "§6.7", ("manifest_uid", 0, 8), ("scope_id", 8, 4))
FAILOVER_ENTRY = _layout("failover_entry", 16, "§6.1", ("vb_uuid", 0, 8), ("seqno", 8, 8))
VB_SEQNO_ENTRY = _layout(
    "vb_seqno_entry", 10, "GET_ALL_VB_SEQNOS", ("vbucket", 0, 2), ("seqno", 2, 8)
)
"""One entry of a GET_ALL_VB_SEQNOS (0x48) reply: a vbucket and its high seqno."""
ROLLBACK = _layout("rollback", 8, "§6.1", ("rollback_seqno", 0, 8))
