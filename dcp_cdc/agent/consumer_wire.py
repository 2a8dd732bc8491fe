"""The capture agent's DCP consumer's wire vocabulary: the frame layouts it packs and
unpacks, the magics, the kinds of server requests its fast path knows (:data:`KINDS`), and
the small helpers that build a request (:func:`make_frame`) or parse a reply body.

Shared by the handshake (:mod:`dcp_cdc.agent.handshake`) and the streams
(:mod:`dcp_cdc.agent.consumer`); no state, no I/O.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from dcp_cdc import flatbuf, layouts
from dcp_cdc.agent.positions import FailoverEntries
from dcp_cdc.errors import ProtocolError
from dcp_cdc.protocol import Opcode

# the 24-byte header (docs/protocol/dcp.md §1.1), from the one table
HEAD = layouts.joined(layouts.HEADER)
HEAD_SEQNO = struct.Struct(">BBHBBHI12xQ")  # header up to body_len, then extras' first u64
HEAD_SHORT = struct.Struct(">BBHBBHI")  # the same for a frame too short for the seqno
U64 = struct.Struct(">Q")
U64_PAIR = struct.Struct(">QQ")
U32 = struct.Struct(">I")
VB_SEQNO = struct.Struct(">HQ")
FAILOVER_ENTRY = struct.Struct(">QQ")
STREAM_REQ_EXTRAS = struct.Struct(">IIQQQQQ")
UID_ONLY: flatbuf.Schema = (("uid", "u64"),)

MAGIC_REQ = 0x80
MAGIC_RES = 0x81
MAGIC_SERVER_REQ = 0x82
MAGIC_ALT_REQ = 0x08
MAGIC_ALT_RES = 0x18

COMMAND_OPAQUE_BASE = 0x0001_0000
"""Opaques of our non-stream commands start above every u16 vbucket (STREAM_REQ opaque)."""

NO_SNAPSHOT = -2
"""``pending_end`` of a vbucket with no open snapshot: its items take the checked path."""
IN_OSO = -1
"""``pending_end`` of a vbucket inside an OSO snapshot (docs/protocol/dcp.md §6.9)."""

KIND_ITEM, KIND_SYSEV, KIND_MARKER, KIND_END, KIND_OSO, KIND_NOOP, KIND_OTHER = range(1, 8)
KINDS = bytearray(256)
for _op in (Opcode.DCP_MUTATION, Opcode.DCP_DELETION, Opcode.DCP_EXPIRATION):
    KINDS[_op] = KIND_ITEM
KINDS[Opcode.DCP_SEQNO_ADVANCED] = KIND_ITEM
KINDS[Opcode.DCP_SYSTEM_EVENT] = KIND_SYSEV
KINDS[Opcode.DCP_SNAPSHOT_MARKER] = KIND_MARKER
KINDS[Opcode.DCP_STREAM_END] = KIND_END
KINDS[Opcode.DCP_OSO_SNAPSHOT] = KIND_OSO
KINDS[Opcode.DCP_NOOP] = KIND_NOOP
for _op in (
    Opcode.DCP_SET_VBUCKET_STATE,
    Opcode.DCP_PREPARE,
    Opcode.DCP_COMMIT,
    Opcode.DCP_ABORT,
    Opcode.DCP_CACHE_TRANSFER,
    Opcode.DCP_CACHE_TRANSFER_END,
):
    KINDS[_op] = KIND_OTHER
"""Server requests (magic 0x80) the fast path knows; 0 = the checked slow path."""


def make_frame(
    magic: int,
    opcode: int,
    *,
    word: int = 0,
    opaque: int = 0,
    extras: bytes = b"",
    key: bytes = b"",
    value: bytes = b"",
) -> bytes:
    body = len(extras) + len(key) + len(value)
    head = HEAD.pack(magic, opcode, len(key), len(extras), 0, word, body, opaque, 0)
    return head + extras + key + value


def parse_failover_log(value: bytes, vbucket: int) -> FailoverEntries:
    if len(value) % 16:
        raise ProtocolError(
            f"vbucket {vbucket}: failover log of {len(value)} bytes is not a multiple of 16"
        )
    return tuple(FAILOVER_ENTRY.iter_unpack(value))


def parse_config(value: bytes, what: str) -> dict[str, Any]:
    try:
        config = json.loads(value)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"{what}: the cluster config is not JSON ({exc})") from None
    if not isinstance(config, dict):
        raise ProtocolError(f"{what}: the cluster config is not a JSON object")
    return config


def config_rev(config: dict[str, Any]) -> int:
    rev = config.get("rev", 0)
    return rev if isinstance(rev, int) else 0
