"""One open stream on the test producer's connection (:class:`ProducerStream`): what it still
has to send (its backfill, the live changes queued for it, frames already encoded) as
runs of whole frames (:data:`Run`), and :func:`frames_end`, where a run is cut when the
flow-control window ends inside it.

Apart from the connection so that the cluster (:mod:`dcp_cdc.simulator.cluster`), which
queues live changes on open streams, can name them without importing the connection.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass, field

from dcp_cdc import layouts
from dcp_cdc.protocol import HEADER_LEN
from dcp_cdc.simulator.model import Item

_U32 = struct.Struct(">I")

Run = tuple[bytes, int]
"""Whole frames back to back, and how many: what streams queue and connections send.
A run is cut at a frame boundary when the flow-control window ends inside it."""


def frames_end(run: bytes, budget: int, most: int) -> tuple[int, int]:
    """(bytes, frames) of the leading whole frames of ``run`` that first reach ``budget``
    bytes, at most ``most`` frames (at least one frame when ``run`` has one)."""
    pos = count = 0
    while pos < len(run) and pos < budget and count < most:
        pos += HEADER_LEN + _U32.unpack_from(run, pos + layouts.BODY_LEN_OFFSET)[0]
        count += 1
    return pos, count


@dataclass
class ProducerStream:
    """One open stream on one connection."""

    vbid: int
    opaque: int
    end_seqno: int
    collection_filter: tuple[int, ...] | None
    sent_upto: int
    backfill: list[Item] = field(default_factory=list)
    backfill_end: int = 0
    pending: list[Item] = field(default_factory=list)
    frames: deque[Run] = field(default_factory=deque)
    marker_sent: bool = False
    backfill_last: int = -1
    """The seqno of the last item this backfill sent (-1: none yet), over all its chunks."""
    ended: bool = False
    bulk_next: int = 0
    """The next bulk document of the vbucket to send (:mod:`dcp_cdc.simulator.bulk`)."""
    bulk_stop: int = 0

    @property
    def backfilling(self) -> bool:
        return bool(self.backfill) or self.bulk_next < self.bulk_stop

    def drop_backfill(self) -> None:
        self.backfill = []
        self.bulk_next = self.bulk_stop
