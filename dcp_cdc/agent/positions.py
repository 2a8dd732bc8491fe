"""Per-vbucket resume positions of the capture agent (spec §7.2, §7.5)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from dcp_cdc.errors import CheckpointError

_U64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class VbPosition:
    """Where a vbucket's stream resumes: STREAM_REQ start = snap_start = snap_end = ``seqno``,
    vb uuid = ``vb_uuid``. Only complete snapshots count, so a resume never starts mid-snapshot:
    replays are fine (silver is idempotent), gaps are not."""

    vbucket: int
    seqno: int
    """The last consistent seqno: the end of the last complete snapshot (spec §7.2)."""
    vb_uuid: int
    """The uuid of the newest failover-log entry at or below ``seqno`` (0 = no history)."""
    failover_log: tuple[tuple[int, int], ...] = ()
    """``(uuid, seqno)`` entries, newest first, as last received."""
    manifest_uid: int = 0
    purge_seqno: int = 0

    def to_json(self) -> dict[str, object]:
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
        """The position :meth:`to_json` wrote; :class:`CheckpointError` on anything else."""
        if not isinstance(data, Mapping):
            raise CheckpointError(f"a position must be an object, got {type(data).__name__}")
        missing = [k for k in ("vbucket", "seqno", "vb_uuid") if k not in data]
        if missing:
            raise CheckpointError(f"position lacks {', '.join(missing)}")
        unknown = set(data) - {
            "vbucket",
            "seqno",
            "vb_uuid",
            "failover_log",
            "manifest_uid",
            "purge_seqno",
        }
        if unknown:
            raise CheckpointError(f"position has unknown fields {sorted(unknown)}")
        vbucket = _uint(data, "vbucket", 1023)
        log = data.get("failover_log", [])
        if not isinstance(log, list) or not all(
            isinstance(e, list) and len(e) == 2 and all(_is_u64(x) for x in e) for e in log
        ):
            raise CheckpointError(
                f"vbucket {vbucket}: failover_log must be a list of [uuid, seqno] pairs"
            )
        return cls(
            vbucket=vbucket,
            seqno=_uint(data, "seqno", _U64),
            vb_uuid=_uint(data, "vb_uuid", _U64),
            failover_log=tuple((int(u), int(s)) for u, s in log),
            manifest_uid=_uint(data, "manifest_uid", _U64, default=0),
            purge_seqno=_uint(data, "purge_seqno", _U64, default=0),
        )


def _is_u64(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _U64


def _uint(data: Mapping[str, object], key: str, high: int, default: int | None = None) -> int:
    value = data.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= high:
        raise CheckpointError(f"position field {key!r} must be an integer 0..{high}, got {value!r}")
    return value
