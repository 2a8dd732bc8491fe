"""``dcp-cdc status``'s two faces: one screen of text (:func:`screen`) and one JSON object
(:func:`as_json`, its fields documented in docs/commands.md). Pure: ``now`` is passed in, so
that the ages are the caller's and the tests'.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from pipelines.bronze.plan import HeldBack
from pipelines.status.lag import BucketStatus, Lag, QualityResult, Stage

FORMAT = 1
"""The JSON object's ``format``: raised when a field changes meaning or goes away (fields
may be added without it)."""

MOVED = {"cluster": "asked", "capture": "checkpoint", "bronze": "ingest", "silver": "apply"}
"""What a stage's ``moved_at`` is, as the screen's last column names it."""


def _iso(at: dt.datetime | None) -> str | None:
    if at is None:
        return None
    return at.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _age_s(at: dt.datetime | None, now: dt.datetime) -> float | None:
    return None if at is None else round(max(0.0, (now - at).total_seconds()), 3)


def age(seconds: float) -> str:
    """A duration as a person reads it: ``4 s``, ``12 min``, ``3.5 h``, ``2.1 d``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 36 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


# --- JSON ----------------------------------------------------------------------------------


def _lag_json(found: Lag | None) -> dict[str, Any] | None:
    if found is None:
        return None
    return {
        "against": found.against,
        "seqnos": found.seqnos,
        "vbuckets": found.vbuckets,
        "worst": [{"vbucket": vb, "seqnos": n} for vb, n in found.worst],
    }


def _stage_json(stage: Stage, found: Lag | None, now: dt.datetime) -> dict[str, Any]:
    positions = stage.positions
    return {
        "stage": stage.name,
        "known": stage.known,
        "vbuckets": None if positions is None else len(positions),
        "seqnos": None if positions is None else stage.seqnos,
        "moved_at": _iso(stage.moved_at),
        "age_s": _age_s(stage.moved_at, now),
        "behind": _lag_json(found),
        "note": stage.note,
    }


def _quality_json(result: QualityResult | None) -> dict[str, Any] | None:
    if result is None:
        return None
    return {
        "run_id": result.run_id,
        "checked_at": _iso(result.checked_at),
        "passed": result.passed,
        "expectations": result.expectations,
        "failed_errors": result.failed_errors,
        "failed_warnings": result.failed_warnings,
        "report": result.report,
    }


def bucket_json(status: BucketStatus, now: dt.datetime) -> dict[str, Any]:
    lags = status.lags()
    end = status.end_to_end()
    return {
        "bucket": status.bucket,
        "stages": [_stage_json(s, lags.get(s.name), now) for s in status.stages],
        "end_to_end": None if end is None else {"stage": end.stage, **(_lag_json(end) or {})},
        "newest_change_at": _iso(status.newest_change),
        "freshness_s": _age_s(status.newest_change, now),
        "quality": _quality_json(status.quality),
        "held_back": [_held_back_json(h, now) for h in status.held_back],
    }


def _held_back_json(group: HeldBack, now: dt.datetime) -> dict[str, Any]:
    since = dt.datetime.fromtimestamp(group.since_ms / 1000, dt.UTC)
    return {
        "session_id": group.session_id,
        "missing_sequences": list(group.missing),
        "files": [f.path for f in group.files],
        "bytes": group.bytes,
        "since": _iso(since),
        "age_s": _age_s(since, now),
    }


def as_json(statuses: Sequence[BucketStatus], now: dt.datetime) -> dict[str, Any]:
    """The status of every bucket as one JSON-ready object (docs/commands.md)."""
    return {
        "format": FORMAT,
        "generated_at": _iso(now),
        "buckets": [bucket_json(s, now) for s in statuses],
    }


# --- the screen ----------------------------------------------------------------------------

_COLUMNS = (
    "stage",
    "vbuckets",
    "seqnos",
    "behind",
    "vbuckets behind",
    "worst vbuckets (seqnos behind)",
    "last moved",
)
_RIGHT = {1, 2, 3, 4}  # numbers align right

_NAMED = {"cluster": "the cluster", "capture": "the capture"}
"""Stages as a sentence names them."""


def plural(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


SCREEN_WORST = 3
"""How many of a lag's worst vbuckets the screen names (the JSON object has them all)."""


def _worst(found: Lag) -> str:
    shown = found.worst[:SCREEN_WORST]
    text = ", ".join(f"{vb} ({n:,})" for vb, n in shown)
    return text + (", ..." if found.vbuckets > len(shown) else "")


def _row(stage: Stage, found: Lag | None, now: dt.datetime) -> list[str]:
    if stage.positions is None:
        return [stage.name, "-", "-", "", "", "", "not known (below)"]
    behind = ["", "", ""]
    if found is not None:
        behind = [f"{found.seqnos:,}", f"{found.vbuckets:,}", _worst(found)]
    moved = ""
    if stage.moved_at is not None:
        moved = f"{MOVED[stage.name]} {age((now - stage.moved_at).total_seconds())} ago"
    return [stage.name, f"{len(stage.positions):,}", f"{stage.seqnos:,}", *behind, moved]


def _table(rows: list[list[str]]) -> list[str]:
    table = [list(_COLUMNS), *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(_COLUMNS))]
    return [
        "  "
        + "  ".join(
            v.rjust(w) if i in _RIGHT and n else v.ljust(w)
            for i, (v, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for n, r in enumerate(table)
    ]


def _end_to_end(status: BucketStatus, now: dt.datetime) -> str:
    end = status.end_to_end()
    if end is None:
        text = "end to end: not known (fewer than two stages known)"
    elif end.seqnos:
        text = (
            f"end to end: {_NAMED.get(end.stage, end.stage)} is {plural(end.seqnos, 'seqno')} "
            f"behind {_NAMED.get(end.against, end.against)} in {plural(end.vbuckets, 'vbucket')}"
        )
    else:
        text = (
            f"end to end: {_NAMED.get(end.stage, end.stage)} is level with "
            f"{_NAMED.get(end.against, end.against)}"
        )
    if status.newest_change is not None:
        text += (
            f"; silver's newest change is {age((now - status.newest_change).total_seconds())} old"
        )
    return text


def _quality(result: QualityResult | None, now: dt.datetime) -> str:
    if result is None:
        return "quality: no check yet (dcp-cdc check)"
    verdict = "passed" if result.passed else "FAILED"
    failed = f"{result.failed_errors} failed"
    if result.failed_warnings:
        failed += f", {plural(result.failed_warnings, 'warning')}"
    when = age((now - result.checked_at).total_seconds())
    return (
        f"quality: {verdict} {when} ago ({plural(result.expectations, 'expectation')}, "
        f"{failed}), report {result.report}"
    )


def bucket_screen(status: BucketStatus, now: dt.datetime) -> list[str]:
    lags = status.lags()
    lines = [f"bucket {status.bucket}"]
    lines += _table([_row(s, lags.get(s.name), now) for s in status.stages])
    lines.append("  " + _end_to_end(status, now))
    lines.append("  " + _quality(status.quality, now))
    lines += [f"  {s.name}: {s.note}" for s in status.stages if s.note]
    lines += [_held_back(status.bucket, h, now) for h in status.held_back]
    return lines


def _held_back(bucket: str, group: HeldBack, now: dt.datetime) -> str:
    waited = age(group.waited_s(int(now.timestamp() * 1000)))
    return (
        f"  HELD BACK for {waited}: {group.describe()}; find the file, or declare it lost: "
        f"dcp-cdc landing skip --bucket {bucket} --session {group.session_id} "
        f"--sequence {group.sequence}"
    )


def screen(statuses: Sequence[BucketStatus], now: dt.datetime) -> str:
    """Every bucket's status as one screen of text."""
    stamp = now.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    lines = [f"dcp-cdc status at {stamp}"]
    for status in statuses:
        lines += ["", *bucket_screen(status, now)]
    return "\n".join(lines) + "\n"
