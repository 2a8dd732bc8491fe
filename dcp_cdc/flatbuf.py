"""Version-2 system-event values: FlatBuffers tables (docs/protocol/dcp.md §6.7, events.fbs).

Just enough FlatBuffers to read (and, for the simulator and tests, write) the four tables of
``Collections.VB``; every offset is bounds-checked so a corrupt value is a :class:`FieldError`,
never an IndexError. FlatBuffers are little-endian, unlike the rest of the protocol.
"""

from __future__ import annotations

import functools
import struct
from typing import Literal

from dcp_cdc.errors import FieldError

Kind = Literal["u64", "u32", "bool", "str"]
Schema = tuple[tuple[str, Kind], ...]

# Field order is the schema's declaration order (= FlatBuffers field index).
COLLECTION: Schema = (
    ("uid", "u64"),
    ("scope_id", "u32"),
    ("collection_id", "u32"),
    ("ttl_valid", "bool"),
    ("max_ttl", "u32"),
    ("name", "str"),
    ("history", "bool"),
    ("default_collection_mvs", "u64"),
    ("metered", "bool"),
    ("flush_uid", "u64"),
)
DROPPED_COLLECTION: Schema = (
    ("uid", "u64"),
    ("scope_id", "u32"),
    ("collection_id", "u32"),
    ("system_collection", "bool"),
)
SCOPE: Schema = (("uid", "u64"), ("scope_id", "u32"), ("name", "str"))
DROPPED_SCOPE: Schema = (("uid", "u64"), ("scope_id", "u32"), ("system_scope", "bool"))

_SCALARS: dict[str, struct.Struct] = {
    "u64": struct.Struct("<Q"),
    "u32": struct.Struct("<I"),
    "bool": struct.Struct("<B"),
}
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")

FlatValue = int | bool | str | None


def _need(buf: bytes, pos: int, size: int, what: str) -> None:
    if pos < 0 or pos + size > len(buf):
        raise FieldError(
            f"bad FlatBuffers value: {what} outside the buffer",
            expected=f"{size} bytes at {pos} within {len(buf)}",
            got="out of bounds",
        )


def read_table(value: bytes | memoryview, schema: Schema) -> dict[str, FlatValue]:
    """The root table of ``value`` as a dict; absent fields take the schema default.

    A bucket's system events repeat the same value in each of its vbuckets (a collection's
    creation, 1,024 times): the last values read are remembered, and each caller gets a
    dict of its own."""
    return dict(_read_table(bytes(value), schema))


@functools.lru_cache(maxsize=256)
def _read_table(buf: bytes, schema: Schema) -> dict[str, FlatValue]:
    _need(buf, 0, 4, "root offset")
    table = _U32.unpack_from(buf, 0)[0]
    _need(buf, table, 4, "root table")
    vtable = table - _I32.unpack_from(buf, table)[0]
    _need(buf, vtable, 4, "vtable")
    vt_size, tbl_size = _U16.unpack_from(buf, vtable)[0], _U16.unpack_from(buf, vtable + 2)[0]
    if vt_size < 4 or vt_size % 2:
        raise FieldError(
            "bad FlatBuffers value: vtable size", expected=">= 4, even", got=str(vt_size)
        )
    _need(buf, vtable, vt_size, "vtable")
    _need(buf, table, tbl_size, "table")
    out: dict[str, FlatValue] = {}
    for index, (name, kind) in enumerate(schema):
        slot = 4 + 2 * index
        field_off = _U16.unpack_from(buf, vtable + slot)[0] if slot < vt_size else 0
        if field_off == 0:
            out[name] = None if kind == "str" else (False if kind == "bool" else 0)
            continue
        pos = table + field_off
        if kind == "str":
            if field_off + 4 > tbl_size:
                raise FieldError(f"bad FlatBuffers value: field {name} outside its table")
            _need(buf, pos, 4, f"field {name}")
            start = pos + _U32.unpack_from(buf, pos)[0]
            _need(buf, start, 4, f"string {name}")
            length = _U32.unpack_from(buf, start)[0]
            _need(buf, start + 4, length, f"string {name}")
            try:
                out[name] = buf[start + 4 : start + 4 + length].decode("utf-8")
            except UnicodeDecodeError:
                raise FieldError(f"bad FlatBuffers value: string {name} is not UTF-8") from None
            continue
        scalar = _SCALARS[kind]
        if field_off + scalar.size > tbl_size:
            raise FieldError(f"bad FlatBuffers value: field {name} outside its table")
        raw = scalar.unpack_from(buf, pos)[0]
        out[name] = bool(raw) if kind == "bool" else raw
    return out


def build_table(schema: Schema, values: dict[str, FlatValue]) -> bytes:
    """A FlatBuffers buffer whose root table holds ``values`` (None or missing = absent)."""
    unknown = set(values) - {n for n, _ in schema}
    if unknown:
        raise TypeError(f"schema has no field(s) {sorted(unknown)}")
    present = [(i, n, k) for i, (n, k) in enumerate(schema) if values.get(n) is not None]
    n_slots = max((i + 1 for i, _, _ in present), default=0)
    vt_size = 4 + 2 * n_slots
    vtable_pos = 4
    table_pos = vtable_pos + vt_size
    table_pos += (-table_pos - 4) % 8  # keep 8-byte scalars aligned after the soffset
    # Lay out the table: soffset, then 8-, 4- and 1-byte fields (strings as u32 offsets).
    field_offsets: dict[int, int] = {}
    cursor = 4
    order = sorted(present, key=lambda p: -(_SCALARS[p[2]].size if p[2] != "str" else 4))
    for index, _, kind in order:
        size = _SCALARS[kind].size if kind != "str" else 4
        cursor += (-cursor - table_pos) % size
        field_offsets[index] = cursor
        cursor += size
    tbl_size = cursor
    buf = bytearray(table_pos + tbl_size)
    _U32.pack_into(buf, 0, table_pos)
    _U16.pack_into(buf, vtable_pos, vt_size)
    _U16.pack_into(buf, vtable_pos + 2, tbl_size)
    for index in range(n_slots):
        _U16.pack_into(buf, vtable_pos + 4 + 2 * index, field_offsets.get(index, 0))
    _I32.pack_into(buf, table_pos, table_pos - vtable_pos)
    for index, name, kind in present:
        pos = table_pos + field_offsets[index]
        value = values[name]
        if kind == "str":
            buf += b"\x00" * ((-len(buf)) % 4)
            encoded = str(value).encode()
            _U32.pack_into(buf, pos, len(buf) - pos)
            buf += _U32.pack(len(encoded)) + encoded + b"\x00"
        else:
            _SCALARS[kind].pack_into(buf, pos, int(value))  # type: ignore[arg-type]
    return bytes(buf)
