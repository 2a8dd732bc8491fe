"""The hot messages: the frames both passes of the columnar face decode for all rows at once,
and the protocol constants and limits both passes test them with."""

from __future__ import annotations

from dcp_cdc import layouts
from dcp_cdc.events import (
    Deletion,
    Expiration,
    Mutation,
    SeqnoAdvanced,
    SnapshotMarker,
)
from dcp_cdc.protocol import (
    ALT_MAGICS,
    DATATYPE_MASK,
    RESPONSE_MAGICS,
    Datatype,
    Magic,
    Opcode,
)

# Plain ints: IntFlag arithmetic builds enum objects on every operation.
SNAPPY = int(Datatype.SNAPPY)
XATTR = int(Datatype.XATTR)
DOC_OPCODES = [int(Opcode.DCP_MUTATION), int(Opcode.DCP_DELETION), int(Opcode.DCP_EXPIRATION)]
ALT = sorted(int(m) for m in ALT_MAGICS)
SERVER_REQUEST = int(Magic.SERVER_REQUEST)  # duplex, server-initiated: the per-frame path
UNKNOWN_DATATYPE_BITS = 0xFF & ~DATATYPE_MASK
RESPONSE = sorted(int(m) for m in RESPONSE_MAGICS)

# Hot messages decoded for all rows at once: (opcode, extras layout, op, has a document key).
FAST = (
    (Opcode.DCP_MUTATION, layouts.MUTATION, Mutation.op, True),
    (Opcode.DCP_DELETION, layouts.DELETION_V1, Deletion.op, True),
    (Opcode.DCP_DELETION, layouts.DELETION_V2, Deletion.op, True),
    (Opcode.DCP_EXPIRATION, layouts.EXPIRATION, Expiration.op, True),
    (Opcode.DCP_SNAPSHOT_MARKER, layouts.SNAPSHOT_MARKER_V1, SnapshotMarker.op, False),
    (Opcode.DCP_SEQNO_ADVANCED, layouts.SEQNO_ADVANCED, SeqnoAdvanced.op, False),
)

MAX_XATTR_PAIRS = 64  # more pairs than this in one value: that frame is decoded alone
