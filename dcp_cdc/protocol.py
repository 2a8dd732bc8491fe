"""Wire constants of the memcached binary protocol as DCP uses it (docs/protocol/dcp.md §1, §2, §5, §6).

Every number here is cited from ``docs/protocol/dcp.md``; names follow the spec so that
a reader can grep the spec for any of them.
"""

from __future__ import annotations

import datetime as dt
from enum import IntEnum, IntFlag

HEADER_LEN = 24
"""Fixed memcached header length (docs/protocol/dcp.md §1.1)."""

MAX_BODY_LEN = 64 * 1024 * 1024
"""Largest body we accept as a plausible frame. Couchbase caps a document at 20 MiB plus 1 MiB
of xattrs (docs/protocol/dcp.md §2); anything far beyond is a corrupt length field, not a frame."""


class Magic(IntEnum):
    """Header byte 0 (docs/protocol/dcp.md §1.1, magic.h; 0x08 per errata E12)."""

    CLIENT_REQUEST = 0x80
    ALT_CLIENT_REQUEST = 0x08
    CLIENT_RESPONSE = 0x81
    ALT_CLIENT_RESPONSE = 0x18
    SERVER_REQUEST = 0x82
    SERVER_RESPONSE = 0x83


ALT_MAGICS = frozenset({Magic.ALT_CLIENT_REQUEST, Magic.ALT_CLIENT_RESPONSE})
RESPONSE_MAGICS = frozenset(
    {Magic.CLIENT_RESPONSE, Magic.ALT_CLIENT_RESPONSE, Magic.SERVER_RESPONSE}
)
KNOWN_MAGICS = frozenset(int(m) for m in Magic)


class Opcode(IntEnum):
    """DCP opcodes (docs/protocol/dcp.md §5, opcode.h)."""

    DCP_OPEN = 0x50
    DCP_ADD_STREAM = 0x51
    DCP_CLOSE_STREAM = 0x52
    DCP_STREAM_REQ = 0x53
    DCP_GET_FAILOVER_LOG = 0x54
    DCP_STREAM_END = 0x55
    DCP_SNAPSHOT_MARKER = 0x56
    DCP_MUTATION = 0x57
    DCP_DELETION = 0x58
    DCP_EXPIRATION = 0x59
    DCP_FLUSH = 0x5A
    DCP_SET_VBUCKET_STATE = 0x5B
    DCP_NOOP = 0x5C
    DCP_BUFFER_ACKNOWLEDGEMENT = 0x5D
    DCP_CONTROL = 0x5E
    DCP_SYSTEM_EVENT = 0x5F
    DCP_PREPARE = 0x60
    DCP_SEQNO_ACKNOWLEDGED = 0x61
    DCP_COMMIT = 0x62
    DCP_ABORT = 0x63
    DCP_SEQNO_ADVANCED = 0x64
    DCP_OSO_SNAPSHOT = 0x65
    DCP_CACHE_TRANSFER = 0x66
    DCP_CACHE_TRANSFER_END = 0x67


class Datatype(IntFlag):
    """Header byte 5 (docs/protocol/dcp.md §2, datatype.h)."""

    RAW = 0x00
    JSON = 0x01
    SNAPPY = 0x02
    XATTR = 0x04


DATATYPE_MASK = 0x07


class Status(IntEnum):
    """Response statuses a DCP consumer meets (docs/protocol/dcp.md §6.1, §6.15, status.h)."""

    SUCCESS = 0x0000
    KEY_EEXISTS = 0x0002
    EINVAL = 0x0004
    NOT_MY_VBUCKET = 0x0007
    DCP_STREAM_NOT_FOUND = 0x000A
    OPAQUE_NO_MATCH = 0x000B
    ERANGE = 0x0022
    ROLLBACK = 0x0023
    EACCESS = 0x0024
    ENOMEM = 0x0082
    NOT_SUPPORTED = 0x0083
    ETMPFAIL = 0x0086
    UNKNOWN_COLLECTION = 0x0088
    DCP_STREAM_ID_INVALID = 0x008D
    NO_BUCKET = 0x0008
    AUTH_ERROR = 0x0020
    AUTH_CONTINUE = 0x0021
    UNKNOWN_COMMAND = 0x0081
    NOT_INITIALIZED = 0x0025


def status_name(status: int) -> str:
    """Snake-case name of a status, or ``status_0xNNNN`` when we do not know it."""
    try:
        return Status(status).name.lower()
    except ValueError:
        return f"status_0x{status:04x}"


class SnapshotFlag(IntFlag):
    """Snapshot marker flags (docs/protocol/dcp.md §6.3; errata E5: 0x01 is Memory)."""

    MEMORY = 0x01
    DISK = 0x02
    CHECKPOINT = 0x04
    ACK = 0x08
    HISTORY = 0x10
    MAY_CONTAIN_DUPLICATES = 0x20


def _flag_names(kind: type[IntFlag], flags: int) -> tuple[str, ...]:
    """Names of the set bits of ``flags``, lowest first; unknown bits as ``0xNN``."""
    names = [f.name.lower() for f in kind if f.value and flags & f.value and f.name]
    unknown = flags & ~sum(int(f) for f in kind)
    bit = 1
    while unknown >= bit:
        if unknown & bit:
            names.append(f"0x{bit:02x}")
        bit <<= 1
    return tuple(names)


def snapshot_flag_names(flags: int) -> tuple[str, ...]:
    """Names of the set snapshot flags, lowest first; unknown bits as ``0xNN``."""
    return _flag_names(SnapshotFlag, flags)


class StreamEndReason(IntEnum):
    """DCP_STREAM_END reasons (docs/protocol/dcp.md §6.10, dcp_stream_end_status.h)."""

    OK = 0
    CLOSED = 1
    STATE_CHANGED = 2
    DISCONNECTED = 3
    TOO_SLOW = 4
    BACKFILL_FAILED = 5
    ROLLBACK = 6
    FILTER_EMPTY = 7
    LOST_PRIVILEGES = 8


def stream_end_reason_name(reason: int) -> str:
    """Snake-case reason name; an unknown code is reported generically (docs/protocol/dcp.md §6.10)."""
    try:
        return StreamEndReason(reason).name.lower()
    except ValueError:
        return f"unknown_{reason}"


class SystemEventId(IntEnum):
    """System event ids on the wire (docs/protocol/dcp.md §6.7; errata E7: ModifyCollection is 5)."""

    BEGIN_COLLECTION = 0
    END_COLLECTION = 1
    CREATE_SCOPE = 3
    DROP_SCOPE = 4
    MODIFY_COLLECTION = 5


SYSTEM_EVENT_NAMES: dict[int, str] = {
    SystemEventId.BEGIN_COLLECTION: "create_collection",
    SystemEventId.END_COLLECTION: "drop_collection",
    SystemEventId.CREATE_SCOPE: "create_scope",
    SystemEventId.DROP_SCOPE: "drop_scope",
    SystemEventId.MODIFY_COLLECTION: "modify_collection",
}


def system_event_name(event_id: int) -> str:
    return SYSTEM_EVENT_NAMES.get(event_id, f"unknown_{event_id}")


class OsoFlag(IntFlag):
    """DCP_OSO_SNAPSHOT flags (docs/protocol/dcp.md §6.9)."""

    START = 0x01
    END = 0x02


class DcpOpenFlag(IntFlag):
    """DCP_OPEN flags (docs/protocol/dcp.md §4.2); recorded by capture writers as features."""

    PRODUCER = 0x001
    INCLUDE_XATTRS = 0x004
    NO_VALUE = 0x008
    INCLUDE_DELETE_TIMES = 0x020
    NO_VALUE_WITH_UNDERLYING_DATATYPE = 0x040
    INCLUDE_DELETED_USER_XATTRS = 0x100
    SKIP_DELETES_IN_INITIAL_BACKFILL = 0x200


class StreamRequestFlag(IntFlag):
    """Stream flags of DCP_STREAM_REQ and DCP_ADD_STREAM (docs/protocol/dcp.md §4.4, add-stream.md)."""

    TAKEOVER = 0x01
    DISK_ONLY = 0x02
    TO_LATEST = 0x04
    NO_VALUE = 0x08  # removed in 5.0 (DCP_OPEN's NO_VALUE replaces it); still named
    ACTIVE_VB_ONLY = 0x10
    STRICT_VBUUID = 0x20
    FROM_LATEST = 0x40
    IGNORE_PURGED_TOMBSTONES = 0x80
    CACHE_TRANSFER = 0x100


def stream_flag_names(flags: int) -> tuple[str, ...]:
    """Names of the set stream flags (``takeover``, ``disk_only``, ...), lowest first;
    unknown bits as ``0xNN``."""
    return _flag_names(StreamRequestFlag, flags)


STREAM_ID_FRAME_INFO = 2
"""FrameInfo id of the DCP stream-id (docs/protocol/dcp.md §1.3); its value is a u16."""
STREAM_ID_LEN = 2
STREAM_ID_TAG = STREAM_ID_FRAME_INFO << 4 | STREAM_ID_LEN
"""First byte of a stream-id FrameInfo: id in the high nibble, length in the low (``0x22``)."""

NO_END_SEQNO = 0xFFFF_FFFF_FFFF_FFFF
"""End seqno meaning "stream forever" (docs/protocol/dcp.md §4.4)."""

HLC_COUNTER_MASK = 0xFFFF
"""The low 16 bits of a CAS: the hybrid logical clock's counter, not time (docs/protocol/dcp.md §1.5)."""
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def cas_time(cas: int) -> dt.datetime | None:
    """When a change happened, by its CAS (docs/protocol/dcp.md §1.5): the server's hybrid logical clock,
    nanoseconds since the Unix epoch with the low 16 bits (a logical counter) masked off, so
    within 65.5 µs of the active node's clock, truncated here to the microsecond. ``None``
    for CAS 0 (frames that carry none) and for values of 2**63 and more (past the year 2262:
    not a clock reading). Approximate by nature: the spec's open items (§11) note that
    Couchbase's docs tell clients not to read meaning into a CAS."""
    if not 0 < cas < 1 << 63:
        return None
    return _EPOCH + dt.timedelta(microseconds=(cas & ~HLC_COUNTER_MASK) // 1000)


class ClientOpcode(IntEnum):
    """Connection-level commands a DCP consumer sends besides the DCP ones (kv_engine
    include/mcbp/protocol/opcode.h; docs/BinaryProtocol.md). Only GET_ALL_VB_SEQNOS reaches a
    capture file: the high seqnos each capture session ends with (the decoder reads it)."""

    NOOP = 0x0A
    HELLO = 0x1F
    SASL_LIST_MECHS = 0x20
    SASL_AUTH = 0x21
    SASL_STEP = 0x22
    GET_ALL_VB_SEQNOS = 0x48
    SELECT_BUCKET = 0x89
    GET_CLUSTER_CONFIG = 0xB5
    GET_COLLECTIONS_MANIFEST = 0xBA
    GET_ERROR_MAP = 0xFE


class ServerOpcode(IntEnum):
    """Requests the server pushes over a duplex connection (magic 0x82)."""

    CLUSTERMAP_CHANGE_NOTIFICATION = 0x01


class HelloFeature(IntEnum):
    """HELLO (0x1f) feature codes (docs/protocol/dcp.md §4.1; kv_engine include/mcbp/protocol/feature.h)."""

    TLS = 0x02
    TCPNODELAY = 0x03
    MUTATION_SEQNO = 0x04
    XATTR = 0x06
    XERROR = 0x07
    SELECT_BUCKET = 0x08
    SNAPPY = 0x0A
    JSON = 0x0B
    DUPLEX = 0x0C
    CLUSTERMAP_CHANGE_NOTIFICATION = 0x0D
    UNORDERED_EXECUTION = 0x0E
    ALT_REQUEST = 0x10
    SYNC_REPLICATION = 0x11
    COLLECTIONS = 0x12


class VbucketState(IntEnum):
    """vbucket states (GET_ALL_VB_SEQNOS' filter, DCP_SET_VBUCKET_STATE; docs/protocol/dcp.md §6.13)."""

    ACTIVE = 1
    REPLICA = 2
    PENDING = 3
    DEAD = 4
