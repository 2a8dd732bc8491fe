"""The bronze ingest's decisions, without Spark and without I/O: what the ingest log says
(:class:`LogState`), which listed files a run plans (:func:`plan_files`) and which of a plan
are written once their problems are known (:func:`settle`), the stream state each file starts
and ends in (:func:`stream_states`), how the files are grouped into tasks
(:func:`task_groups`), what a run reports (:class:`IngestSummary`), and the files a missing
one holds back (:class:`HeldBack`, :func:`held_back`): what the ingest line, the quality
suite ``landing_continuity``, ``dcp-cdc status`` and follow mode's readiness all report.

:mod:`pipelines.bronze.job` runs the steps these decide; tests check them without Spark.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipelines.bronze.decode import NO_STATE, FileScan, StreamState
from pipelines.bronze.landing import CaptureFile, Problem


@dataclass(frozen=True, slots=True)
class HeldBack:
    """The files of one capture session that wait for an earlier file the landing does not
    have (lost in transfer, deleted, never uploaded, or there but not readable): ingest
    takes a session's files in sequence order only, so these wait until it comes or is
    declared lost (``dcp-cdc landing skip``).

    ``missing`` lists the sequences absent below the last held-back file, the first being
    the one ingest waits for; ``files`` are in sequence order. A file arrived when it was
    last modified (its ``modified_ms`` as listed, on a local landing and on an object store
    alike), so the group waits ``since_ms``: the earliest arrival among its files.
    """

    session_id: str
    missing: tuple[int, ...]
    files: tuple[CaptureFile, ...]

    @property
    def sequence(self) -> int:
        """The sequence ingest waits for."""
        return self.missing[0]

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def since_ms(self) -> int:
        return min(f.modified_ms for f in self.files)

    def waited_s(self, now_ms: int) -> float:
        return max(0, now_ms - self.since_ms) / 1000

    def describe(self) -> str:
        """One line: the session, the sequence missing, the files held back and since when."""
        missing = ", ".join(str(n) for n in self.missing)
        since = dt.datetime.fromtimestamp(self.since_ms / 1000, dt.UTC)
        paths = ", ".join(f.path for f in self.files)
        return (
            f"session {self.session_id}: sequence{'s' if len(self.missing) > 1 else ''} "
            f"{missing} missing; {len(self.files)} file{'s' if len(self.files) > 1 else ''} "
            f"({self.bytes:,} bytes) held back since {since:%Y-%m-%dT%H:%M:%SZ}: {paths}"
        )


def held_back(candidates: Iterable[CaptureFile], state: LogState) -> list[HeldBack]:
    """The files of ``candidates`` (headers read, not ingested) that wait for a missing
    earlier file of their session, per session: those past the first sequence that is
    neither ingested, nor declared lost, nor in ``candidates``. Sorted by session."""
    by_session: dict[str, dict[int, CaptureFile]] = {}
    for f in candidates:
        by_session.setdefault(f.session_id, {}).setdefault(f.file_sequence, f)
    next_sequence = state.next_sequences()
    out = []
    for sid, files in sorted(by_session.items()):
        expected = next_sequence.get(sid, 0)
        while expected in files:
            expected = state.past_lost(sid, expected + 1)
        later = sorted(n for n in files if n > expected)
        if not later:
            continue
        missing = tuple(
            n for n in range(expected, later[-1]) if n not in files and (sid, n) not in state.lost
        )
        out.append(HeldBack(sid, missing, tuple(files[n] for n in later)))
    return out


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
    held_back: list[HeldBack] = field(default_factory=list)
    """The files a missing earlier file of their session holds back (in ``waiting`` too)."""
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
        lines += [
            f"  HELD BACK: {h.describe()} (find the file, or declare it lost: dcp-cdc landing "
            f"skip --bucket {self.bucket} --session {h.session_id} --sequence {h.sequence})"
            for h in self.held_back
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


LOST = "lost"
"""The status of an ingest log row that declares a session's file lost (``dcp-cdc landing
skip``): ingest goes on from the next sequence."""


def lost_row(session_id: str, sequence: int, message: str) -> dict[str, Any]:
    """The ingest log row that declares sequence ``sequence`` of ``session_id`` lost; its
    ``file`` names the session and sequence (there is no file)."""
    return {
        "file": f"(lost) session {session_id} sequence {sequence}",
        "session_id": session_id,
        "file_sequence": sequence,
        "status": LOST,
        "message": message,
    }


@dataclass
class LogState:
    ingested: dict[str, dict[str, Any]]  # path -> the ingested row
    changed_seen: set[tuple[str, int, int]]
    open_plan: list[dict[str, Any]]  # planned rows of a run without closing rows
    last_version: int
    lost: set[tuple[str, int]] = field(default_factory=set)  # (session, sequence) declared lost

    def next_sequences(self) -> dict[str, int]:
        """Each session's next sequence to ingest: past its last ingested file and past the
        sequences declared lost that follow it."""
        found: dict[str, int] = {}
        for row in self.ingested.values():
            sid = row["session_id"]
            found[sid] = max(found.get(sid, 0), row["file_sequence"] + 1)
        for sid in {s for s, _ in self.lost}:
            found[sid] = self.past_lost(sid, found.get(sid, 0))
        return found

    def past_lost(self, session_id: str, sequence: int) -> int:
        """``sequence``, or the first after it not declared lost when it is."""
        while (session_id, sequence) in self.lost:
            sequence += 1
        return sequence

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
        lost = {(r["session_id"], r["file_sequence"]) for r in rows if r["status"] == LOST}
        return cls(ingested, changed, open_plan, last, lost)


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
    reads a listed file's header (:func:`pipelines.bronze.landing.header_or_problem`): the one read
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
    next_seq = state.next_sequences()
    summary.held_back = held_back(candidates, state)
    chosen = []
    for f in sorted(candidates, key=lambda c: (c.session_id, c.file_sequence)):
        expected = next_seq.get(f.session_id, 0)
        if f.file_sequence == expected:
            chosen.append(f)
            next_seq[f.session_id] = state.past_lost(f.session_id, expected + 1)
        elif (f.session_id, f.file_sequence) in state.lost:  # found after it was skipped
            summary.skipped.append(
                f"{f.path}: session {f.session_id} sequence {f.file_sequence} is declared "
                "lost (dcp-cdc landing skip); its session went on without it"
            )
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
    first file of each session; a file's scan says what it changes. The file after one
    declared lost starts from :func:`past_a_gap`'s state."""
    previous: dict[str, dict[int, StreamState]] = {}
    for row in state.ingested.values():
        states = json.loads(row["end_state"] or "{}")
        previous[f"{row['session_id']}#{row['file_sequence']}"] = {
            int(k): tuple(v) for k, v in states.items()
        }
    carries, ends = {}, {}
    for f in sorted(files, key=lambda f: (f.session_id, f.file_sequence)):
        before = previous.get(f"{f.session_id}#{f.file_sequence - 1}")
        if before is None:
            before = past_a_gap(state, previous, f.session_id, f.file_sequence)
        after = scans[f.path].apply(before) if f.path in scans else before
        previous[f"{f.session_id}#{f.file_sequence}"] = after
        carries[f.path], ends[f.path] = _states_json(before), _states_json(after)
    return carries, ends


def past_a_gap(
    state: LogState,
    previous: Mapping[str, dict[int, StreamState]],
    session_id: str,
    sequence: int,
) -> dict[int, StreamState]:
    """The stream states file ``sequence`` starts in when the file before it is declared
    lost: each vbucket's stream as the last file before the gap left it (its ``vb_uuid``),
    in no snapshot, since what the lost files did to the snapshots is unknown. Its items
    before their vbucket's next snapshot marker then lie in no snapshot, and the snapshot the
    gap cut stays incomplete: the ``snapshot_completeness`` suite reports both. Nothing when
    no file is lost there (a session's first file)."""
    before = sequence - 1
    while (session_id, before) in state.lost:
        before -= 1
    if before == sequence - 1:
        return {}
    known = previous.get(f"{session_id}#{before}", {})
    return {vb: (*NO_STATE[:4], s[4]) for vb, s in known.items()}


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
