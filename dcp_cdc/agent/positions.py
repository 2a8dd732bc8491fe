"""Per-vbucket resume positions of the capture agent (docs/protocol/dcp.md §7.2, §7.4, §7.5).

A position is the last *consistent* seqno of a vbucket: the end of the last complete snapshot
(docs/protocol/dcp.md §6.3), never a point inside one. Resuming there replays at most one snapshot (silver is
idempotent) and never leaves a gap.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dcp_cdc.errors import CheckpointError

FailoverEntries = tuple[tuple[int, int], ...]
"""(vb_uuid, seqno) pairs, newest first, as the server sent them (docs/protocol/dcp.md §6.1)."""

_U64 = (1 << 64) - 1


def uuid_at(failover_log: FailoverEntries, seqno: int) -> int:
    """The uuid of the newest failover-log entry at or below ``seqno``; 0 when none is
    (docs/protocol/dcp.md §7.5: the branch our history at ``seqno`` belongs to)."""
    for uuid, start in failover_log:
        if start <= seqno:
            return uuid
    return 0


def prune_log(failover_log: FailoverEntries, seqno: int) -> FailoverEntries:
    """The log without the entries above ``seqno`` (docs/protocol/dcp.md §7.5, as java-dcp-client does)."""
    return tuple(entry for entry in failover_log if entry[1] <= seqno)


@dataclass(frozen=True, slots=True)
class VbPosition:
    """Where a vbucket's stream resumes: STREAM_REQ start = snap_start = snap_end = ``seqno``
    with vb uuid ``vb_uuid`` (docs/protocol/dcp.md §7.2)."""

    vbucket: int
    seqno: int
    vb_uuid: int
    failover_log: FailoverEntries = ()
    manifest_uid: int = 0
    purge_seqno: int = 0

    def to_json(self) -> dict[str, object]:
        """A JSON-ready dict (uuids are u64 integers; from_json also takes decimal strings)."""
        return {
            "vbucket": self.vbucket,
            "seqno": self.seqno,
            "vb_uuid": self.vb_uuid,
            "failover_log": [[uuid, seqno] for uuid, seqno in self.failover_log],
            "manifest_uid": self.manifest_uid,
            "purge_seqno": self.purge_seqno,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> VbPosition:
        """The inverse of :meth:`to_json`; :class:`CheckpointError` names the bad field."""
        if not isinstance(data, Mapping):
            raise CheckpointError(f"a vbucket position must be an object, got {data!r}")
        vbucket = _u(data, "vbucket", 0xFFFF)
        try:
            raw_log = data.get("failover_log", [])
            if not isinstance(raw_log, list):
                raise TypeError
            log = tuple(
                (
                    _int(entry[0], "failover_log uuid", _U64),
                    _int(entry[1], "failover_log seqno", _U64),
                )
                for entry in raw_log
            )
        except (TypeError, IndexError, KeyError):
            raise CheckpointError(
                f"vbucket {vbucket}: failover_log must be a list of [uuid, seqno] pairs"
            ) from None
        return cls(
            vbucket=vbucket,
            seqno=_u(data, "seqno", _U64, vbucket),
            vb_uuid=_u(data, "vb_uuid", _U64, vbucket),
            failover_log=log,
            manifest_uid=_u(data, "manifest_uid", _U64, vbucket, default=0),
            purge_seqno=_u(data, "purge_seqno", _U64, vbucket, default=0),
        )


def _int(value: object, what: str, limit: int) -> int:
    if type(value) is int and 0 <= value <= limit:  # what a checkpoint holds (bool is not int)
        return value
    if isinstance(value, bool):
        raise CheckpointError(f"{what} must be an integer, got {value!r}")
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if not isinstance(value, int) or not 0 <= value <= limit:
        raise CheckpointError(f"{what} must be an integer in 0..{limit}, got {value!r}")
    return value


def _u(
    data: Mapping[str, object],
    name: str,
    limit: int,
    vbucket: int | None = None,
    *,
    default: int | None = None,
) -> int:
    if name not in data:
        if default is not None:
            return default
        raise CheckpointError(
            f"position field {name!r} is missing"
            + (f" (vbucket {vbucket})" if vbucket is not None else "")
        )
    value = data[name]
    if type(value) is int and 0 <= value <= limit:
        return value
    return _int(value, f"position field {name!r}", limit)
