"""The compiled pass's wiring: :mod:`dcp_cdc._native` (``dcp_cdc/_native.c``, built by ``pip
install``), configured from the layout tables and the protocol constants (it holds no table of
its own), the memory pool it allocates from, and the choice between it and the numpy path.

Where it is not built (a zip of the sources on a cluster), :data:`NATIVE` is False and the numpy
path runs.
"""

from __future__ import annotations

import importlib
import struct
from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from dcp_cdc import layouts, snappy, varint
from dcp_cdc.columnar.hot import (
    DOC_OPCODES,
    FAST,
    MAX_XATTR_PAIRS,
    SERVER_REQUEST,
    SNAPPY,
    UNKNOWN_DATATYPE_BITS,
    XATTR,
)
from dcp_cdc.columnar.schema import OP_INDEX
from dcp_cdc.errors import DecoderUsageError
from dcp_cdc.protocol import (
    ALT_MAGICS,
    HEADER_LEN,
    KNOWN_MAGICS,
    MAX_BODY_LEN,
    RESPONSE_MAGICS,
    STREAM_ID_LEN,
    STREAM_ID_TAG,
    Datatype,
)
from dcp_cdc.varint import CONTINUATION

_compiled: Any
try:
    _compiled = importlib.import_module("dcp_cdc._native")
except ImportError:  # not built (e.g. the sources shipped as a zip): the numpy path
    _compiled = None

NATIVE = _compiled is not None
"""Whether the compiled pass is built; :func:`decode_batch` uses it unless told not to."""

_NATIVE_FIXED = (
    "offset", "frame_len", "magic", "opcode", "vbucket", "status", "opaque", "cas",
    "datatype", "stream_id", "collection_id", "is_json",
)  # fmt: skip
"""The compiled pass's column slots, in the order of its enum (``C_OFFSET`` ...)."""
ALWAYS_VALID = frozenset(("offset", "frame_len", "magic", "opcode", "opaque", "cas", "datatype"))
"""Header columns every frame has (the compiled pass is given no validity for them)."""
NATIVE_COLUMNS = _NATIVE_FIXED + tuple(
    dict.fromkeys(f.name for _, layout, _, _ in FAST for f in layout.fields if f.name != "nmeta")
)


def _table256(members: Iterable[int]) -> bytes:
    table = bytearray(256)
    for m in members:
        table[int(m)] = 1
    return bytes(table)


def _native_rules() -> bytes:
    """:data:`FAST` as the compiled pass reads it: per rule opcode, extras length, has a key,
    where ``nmeta`` is (-1: none), op index, field count, then (offset, size, column slot)."""
    rules: list[int] = []
    for op_code, layout, op, has_key in FAST:
        fields = [f for f in layout.fields if f.name != "nmeta"]
        nmeta_at = layout.offset_of("nmeta") if "nmeta" in layout.names else -1
        rules += [int(op_code), layout.length, int(has_key), nmeta_at, OP_INDEX[op], len(fields)]
        for f in fields:
            rules += [f.offset, f.size, NATIVE_COLUMNS.index(f.name)]
    return struct.pack(f"={len(rules)}i", *rules)


def _configure_native(native: Any) -> None:
    """Hand the compiled pass the header layout, the hot messages' layouts and the protocol
    constants: it holds no table of its own."""
    # The header's fields in the order of dcp_cdc.layouts.HEADER, which is that of the compiled
    # pass's enum (H_MAGIC ...): the frame header's layout is declared once.
    header = [v for f in layouts.HEADER.fields for v in (f.offset, f.size)]
    native.configure(
        header_len=HEADER_LEN,
        header=struct.pack(f"={len(header)}i", *header),
        known_magic=_table256(KNOWN_MAGICS),
        alt_magic=_table256(ALT_MAGICS),
        response_magic=_table256(RESPONSE_MAGICS),
        doc_opcode=_table256(DOC_OPCODES),
        server_request=SERVER_REQUEST,
        stream_id_tag=STREAM_ID_TAG,
        stream_id_frame_len=1 + STREAM_ID_LEN,
        max_body_len=MAX_BODY_LEN,
        snappy_bit=SNAPPY,
        xattr_bit=XATTR,
        json_bit=int(Datatype.JSON),
        unknown_datatype_bits=UNKNOWN_DATATYPE_BITS,
        max_uncompressed=snappy.MAX_UNCOMPRESSED,
        max_ratio=snappy.MAX_RATIO,
        max_ratio_slack=snappy.RATIO_SLACK,
        varint_max_bytes=varint.MAX_BYTES,
        varint_max_value=varint.MAX_VALUE,
        varint_continuation=CONTINUATION,
        max_xattr_pairs=MAX_XATTR_PAIRS,
        rules=_native_rules(),
    )


if _compiled is not None:
    _configure_native(_compiled)


_pool: pa.MemoryPool | None = None  # where the compiled pass's columns are allocated


def keep_freed_memory() -> bool:
    """Keep this process's freed memory for reuse rather than handing it back to the system.

    A batch is a 64 MiB buffer decoded into some 100 MiB of fresh columns, and fresh memory
    costs a page fault per page when first written: on a virtual machine that is more than
    the decode itself (a 1M-frame capture: 0.26 s with the faults, 0.20 s without). With
    this, glibc keeps freed blocks (no ``mmap`` for large ones, no trim of the heap) and the
    compiled pass allocates through pyarrow's system pool, so each batch reuses the pages of
    the one before. The cost: the process keeps its peak memory. For decode workers (the
    bronze tasks call it); process-wide, so a library leaves the choice to its caller.
    Returns whether it applied (the compiled pass is built and the C library is glibc).
    """
    global _pool
    if _compiled is None or not _compiled.keep_freed_memory():
        return False
    _pool = pa.system_memory_pool()
    return True


def allocate(size: int) -> pa.Buffer:
    return pa.allocate_buffer(size, memory_pool=_pool)


def use_native(native: bool | None) -> bool:
    if native is None:
        return NATIVE
    if native and not NATIVE:
        raise DecoderUsageError("the compiled decoder (dcp_cdc._native) is not built")
    return native


def native_module() -> Any:
    assert _compiled is not None, "checked by use_native"
    return _compiled
