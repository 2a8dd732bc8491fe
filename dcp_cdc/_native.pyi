"""Types of the compiled pass (dcp_cdc/_native.c); dcp_cdc.columnar is its only caller."""

from typing import Any

def configure(
    *,
    header_len: int,
    header: bytes,
    known_magic: bytes,
    alt_magic: bytes,
    response_magic: bytes,
    doc_opcode: bytes,
    server_request: int,
    stream_id_tag: int,
    stream_id_frame_len: int,
    max_body_len: int,
    snappy_bit: int,
    xattr_bit: int,
    json_bit: int,
    unknown_datatype_bits: int,
    max_uncompressed: int,
    max_ratio: int,
    max_ratio_slack: int,
    varint_max_bytes: int,
    varint_max_value: int,
    varint_continuation: int,
    max_xattr_pairs: int,
    rules: bytes,
) -> None: ...
def walk(buf: bytes, pos: int, stop: int, /) -> tuple[bytes, int, bool]: ...
def decode(
    buf: bytes,
    starts: Any,
    base_offset: int,
    collections: bool,
    columns: tuple[Any, ...],
    valid: tuple[Any, ...],
    op: Any,
    fast: Any,
    xattr: Any,
    key_start: Any,
    key_len: Any,
    value_src: Any,
    value_start: Any,
    value_len: Any,
    xattr_offsets: Any,
    alloc: Any,
    /,
) -> tuple[Any, bytes]: ...
def gather(
    sources: tuple[Any, ...], src: Any, start: Any, length: Any, offsets: Any, alloc: Any, /
) -> Any: ...
def keep_freed_memory() -> bool: ...
