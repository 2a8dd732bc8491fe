"""The bronze ingest's decisions, without Spark and without I/O: what the ingest log says
(:class:`LogState`), which listed files a run plans (:func:`plan_files`) and which of a plan
are written once their problems are known (:func:`settle`), the stream state each file starts
and ends in (:func:`stream_states`), how the files are grouped into tasks
(:func:`task_groups`), and what a run reports (:class:`IngestSummary`).

:mod:`pipelines.bronze.job` runs the steps these decide; tests check them without Spark.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipelines.bronze.decode import FileScan, StreamState
from pipelines.landing import CaptureFile, Problem


@dataclass
class IngestSummary:
    bucket: str
    run_version: int | None = None
    run_id: str = ""
    files: int = 0
    frames: int = 0
    errors: int = 0
    seconds: float = 0.0
    waiting: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)
    resumed: bool = False

    @property
    def events_per_second(self) -> float:
        return self.frames / self.seconds if self.seconds else 0.0

    def render(self) -> str:
        lines = [
            f"bronze ingest of bucket {self.bucket!r}: "
            + (
                f"run {self.run_version}{' (resumed)' if self.resumed else ''}: {self.files} "
                f"files, {self.frames} frames, {self.errors} quarantined, {self.seconds:.1f} s "
                f"({self.events_per_second:,.0f} events/s)"
                if self.run_version is not None
                else "nothing new to ingest"
            )
        ]
        lines += [
            f"  waiting (an earlier file of its session is missing): {w}" for w in self.waiting
        ]
        lines += [f"  CHANGED after ingest, not re-read: {c}" for c in self.changed]
        lines += [
            f"  LEFT OUT (changed or gone since planned, not ingested): {x}" for x in self.left_out
        ]
        lines += [f"  unreadable (not a capture file): {u}" for u in self.unreadable]
        lines += [f"  skipped (not a file to read): {k}" for k in self.skipped]
        return "\n".join(lines)


CLOSING = ("ingested", "changed", "missing")
"""The statuses that close a planned file in its run (logged together, in one commit)."""


@dataclass
class LogState:
    ingested: dict[str, dict[str, Any]]  # path -> the ingested row
    changed_seen: set[tuple[str, int, int]]
    open_plan: list[dict[str, Any]]  # planned rows of a run without closing rows
    last_version: int

    @classmethod
    def of(cls, rows: list[dict[str, Any]]) -> LogState:
        """The state of an ingest log with ``rows``. A run is closed once it has a closing
        row (:data:`CLOSING`) of its own run id: they are appended in one commit."""
        ingested = {r["file"]: r for r in rows if r["status"] == "ingested"}
        changed = {
            (r["file"], r["size"], r["modified_ms"]) for r in rows if r["status"] == "changed"
        }
        closed = {(r["run_version"], r["ingest_run_id"]) for r in rows if r["status"] in CLOSING}
        planned = [
            r
            for r in rows
            if r["status"] == "planned" and (r["run_version"], r["ingest_run_id"]) not in closed
        ]
        open_version = max((r["run_version"] for r in planned), default=None)
        open_plan = [r for r in planned if r["run_version"] == open_version]
        last = max((r["run_version"] for r in rows if r["run_version"] is not None), default=0)
        return cls(ingested, changed, open_plan, last)


def plan_files(
    files: list[CaptureFile],
    state: LogState,
    bucket: str,
    limit: int,
    max_bytes: int,
    summary: IngestSummary,
    header: Callable[[CaptureFile], CaptureFile | Problem],
) -> tuple[list[CaptureFile], list[dict[str, Any]]]:
    """The files to ingest now, in session order, and ``changed`` rows to log. ``header``
    reads a listed file's header (:func:`pipelines.landing.header_or_problem`): the one read
    the plan needs, passed in so that the decisions here do no I/O."""
    changed_rows = []
    candidates = []
    for f in files:
        done = state.ingested.get(f.path)
        if done is not None:
            if (done["size"], done["modified_ms"]) != (f.size, f.modified_ms):
                summary.changed.append(f.path)
                if (f.path, f.size, f.modified_ms) not in state.changed_seen:
                    changed_rows.append(
                        {
                            "file": f.path,
                            "size": f.size,
                            "modified_ms": f.modified_ms,
                            "message": f"was {done['size']} bytes at {done['modified_ms']} ms when "
                            f"ingested in run {done['run_version']}",
                        }
                    )
            continue
        if f.size > max_bytes:
            summary.unreadable.append(f"{f.path} ({f.size} bytes > max_file_bytes)")
            continue
        found = header(f)
        if isinstance(found, Problem):
            if found.status == "missing":
                summary.skipped.append(f"{f.path}: {found.message} before it was read")
            else:
                summary.unreadable.append(f"{f.path}: {found.message}")
            continue
        if found.bucket == bucket:
            candidates.append(found)
    next_seq: dict[str, int] = {}
    for row in state.ingested.values():
        sid = row["session_id"]
        next_seq[sid] = max(next_seq.get(sid, 0), row["file_sequence"] + 1)
    chosen = []
    for f in sorted(candidates, key=lambda c: (c.session_id, c.file_sequence)):
        expected = next_seq.get(f.session_id, 0)
        if f.file_sequence == expected:
            chosen.append(f)
            next_seq[f.session_id] = expected + 1
        else:
            summary.waiting.append(
                f"{f.path} (session {f.session_id} sequence {f.file_sequence}, "
                f"needs sequence {expected} first)"
            )
    if limit:
        chosen = _keep_session_prefixes(chosen, limit)
    return chosen, changed_rows


def _keep_session_prefixes(files: list[CaptureFile], limit: int) -> list[CaptureFile]:
    return files[:limit]  # files are sorted by session then sequence: any prefix is in order


@dataclass
class Settled:
    """A plan once its files' problems are known (:func:`settle`)."""

    kept: list[CaptureFile]
    left_out: list[tuple[CaptureFile, Problem]]
    waiting: list[str]


def settle(plan: list[CaptureFile], problems: Mapping[str, Problem]) -> Settled:
    """The files of ``plan`` (in session order) that are written as planned: all but those
    with a problem and, since a file waits for the previous file of its session, the later
    files of their sessions (those wait for a later run)."""
    first_left: dict[str, int] = {}
    for f in plan:
        if f.path in problems:
            first_left.setdefault(f.session_id, f.file_sequence)
    kept, left_out, waiting = [], [], []
    for f in plan:
        if f.path in problems:
            left_out.append((f, problems[f.path]))
        elif f.file_sequence > first_left.get(f.session_id, f.file_sequence):
            waiting.append(
                f"{f.path} (session {f.session_id} sequence {f.file_sequence}, needs sequence "
                f"{first_left[f.session_id]}, left out, first)"
            )
        else:
            kept.append(f)
    return Settled(kept, left_out, waiting)


def stream_states(
    state: LogState, files: list[CaptureFile], scans: dict[str, FileScan]
) -> tuple[dict[str, str], dict[str, str]]:
    """Each file's ``carry`` (its session's stream states before it) and end state, as JSON.

    Folded in session order from the end state the log holds for the file before the run's
    first file of each session; a file's scan says what it changes."""
    previous: dict[str, dict[int, StreamState]] = {}
    for row in state.ingested.values():
        states = json.loads(row["end_state"] or "{}")
        previous[f"{row['session_id']}#{row['file_sequence']}"] = {
            int(k): tuple(v) for k, v in states.items()
        }
    carries, ends = {}, {}
    for f in sorted(files, key=lambda f: (f.session_id, f.file_sequence)):
        before = previous.get(f"{f.session_id}#{f.file_sequence - 1}", {})
        after = scans[f.path].apply(before) if f.path in scans else before
        previous[f"{f.session_id}#{f.file_sequence}"] = after
        carries[f.path], ends[f.path] = _states_json(before), _states_json(after)
    return carries, ends


def _states_json(states: dict[int, StreamState]) -> str:
    return json.dumps(
        {str(k): list(v) for k, v in states.items()}, separators=(",", ":"), sort_keys=True
    )


def problems_of(scans: Mapping[str, FileScan]) -> dict[str, Problem]:
    return {
        path: Problem("missing" if scan.missing else "changed", scan.problem)
        for path, scan in scans.items()
        if scan.problem is not None
    }


def task_groups(sizes: Sequence[int], *, target_bytes: int, parallelism: int) -> list[list[int]]:
    """The files of each decode task, as indices into ``sizes``: as many tasks as the bytes
    need (``target_bytes`` each), and at least ``parallelism`` while there are files for
    them; the biggest file first, each to the task with the fewest bytes. A follow mode's
    many small files then cost a task per core, not one each."""
    if not sizes:
        return []
    total = sum(sizes)
    count = min(len(sizes), max(parallelism, -(-total // max(target_bytes, 1))))
    groups: list[list[int]] = [[] for _ in range(count)]
    loads = [0] * count
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        lightest = loads.index(min(loads))
        groups[lightest].append(i)
        loads[lightest] += sizes[i]
    return [sorted(g) for g in groups]
