"""The bronze ingest job: new capture files of the landing location into bronze Delta tables.

Run it as often as you like (``dcp-cdc ingest``, ``python -m pipelines.bronze.job``,
``spark-submit``). Exactly once per frame comes from the ingest log plus Delta's idempotent
writes:

1. **plan**: the files to ingest are chosen (in session order; a file waits until the previous
   file of its session is in);
2. **scan**: each file's first ``size`` bytes (its size when listed) are read once: hashed
   (the plan binds to them), framed, and only their state-setting frames decoded (snapshot
   markers, OSO markers, stream-request responses), so that the state every file starts in
   (its ``carry``) and ends in is known before any event is written. A file that vanished or
   grew meanwhile is left for a later run. The plan is written to the ingest log as
   ``planned`` (size, digest, end state) under a new run version N, before any data is written;
3. **write**: each file is decoded once, in one task, its events given their session-order
   state there and appended with ``txnAppId``/``txnVersion = N``, so a write that already
   committed is skipped by Delta when the run is repeated; the tasks read exactly the planned
   bytes and fail the write if they are not those planned. They count frames and malformed
   frames per file, and only files with malformed frames are decoded again for their
   quarantine records (appended the same way);
4. **close**: the files are logged ``ingested`` with their counts and end-of-file stream state.

A run that dies anywhere is finished by the next run, which finds the plan without its closing
rows. If the killed attempt's events write committed (the events table holds transaction
version N), the run's counts are read from bronze, never decoded again from bytes that may
have changed since. If it did not, each planned file is checked again (still there, same size,
same digest): one that changed or vanished is logged ``changed`` or ``missing`` and left out
(with the later files of its session, which wait), and the others are written as planned.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

import pyarrow as pa

from dcp_cdc.capture import EXTENSION, PREAMBLE_LEN, parse_header
from dcp_cdc.config import AppConfig, BucketConfig, load_config
from dcp_cdc.errors import CaptureFormatError, ConfigError
from pipelines import delta_io, landing
from pipelines.bronze import writer
from pipelines.bronze.decode import FileScan, StreamState, decode_files, scan_files
from pipelines.errors import LandingChangedError
from pipelines.tables import BucketTables

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# pyspark, and the modules that import it (pipelines.schemas, pipelines.bronze.transforms), are
# imported where used: the command line imports this module to print its help without Spark.

log = logging.getLogger("dcp_cdc.bronze")
TXN_APP_ID = "dcp-cdc-bronze"
EVENTS_CLUSTERING = ("vbucket", "by_seqno")
"""Liquid clustering keys of the events table (applied by OPTIMIZE, not at ingest)."""

STATS_COLUMNS_PROPERTY = "delta.dataSkippingStatsColumns"
EVENTS_STATS = {
    STATS_COLUMNS_PROPERTY: ",".join(
        (
            *EVENTS_CLUSTERING,
            *("op", "opcode", "collection_id", "rev_seqno", "cas", "offset", "frame_len"),
            *("session_started_at", "session_id", "file", "file_sequence", "frame_index"),
            *("ingest_run_id", "ingested_at"),
        )
    )
}
"""The events columns Delta keeps file statistics of: those runs filter on, ``ingest_run_id``
above all (silver reads only the runs it has not consumed: files of other runs are skipped).
Not the default first 32 columns, which include document bodies and miss the run."""


@dataclass(frozen=True, order=True)
class CaptureFile:
    path: str
    size: int
    modified_ms: int
    bucket: str = ""
    session_id: str = ""
    file_sequence: int = -1
    collections: bool = True
    header_length: int = 0
    started_at: str = ""

    def log_row(self, run_id: str, **more: Any) -> dict[str, Any]:
        """The file's row of the ingest log in run ``run_id``."""
        return {
            "file": self.path,
            "size": self.size,
            "modified_ms": self.modified_ms,
            "session_id": self.session_id,
            "file_sequence": self.file_sequence,
            "ingest_run_id": run_id,
            **more,
        }


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


# --- landing -----------------------------------------------------------------------------


def check_landing(
    config: AppConfig, buckets: list[BucketConfig], config_file: object = None
) -> None:
    """Each of ``buckets``' landing locations can be listed (:func:`landing.location_problem`),
    else a :class:`ConfigError` naming the field (and ``config_file``, when known). Costs no
    Spark: jobs call it before they start a session.

    A landing folder that does not exist is an error, not an empty landing: a mistyped path
    would otherwise ingest nothing, run after run, with success. A capture agent creates its
    folder when it starts; a pipeline scheduled before that fails until it has (or until the
    folder is created empty). On object stores only the store's bucket must exist.
    """
    for index, bucket in enumerate(config.buckets):
        if bucket not in buckets:
            continue
        location = config.landing_for(bucket)
        problem = landing.location_problem(location, config.spark.conf)
        if problem is not None:
            name = f"buckets[{index}].landing" if bucket.landing else "landing"
            where = f"{config_file}: " if config_file else ""
            raise ConfigError(
                f"{where}{name}: the landing location {location!r} of bucket {bucket.name!r} "
                f"{problem}"
            )


def list_captures(
    location: str, storage: Mapping[str, str] | None = None
) -> tuple[list[CaptureFile], list[landing.Skipped]]:
    """Every ``*.dcpcap`` file below ``location`` (a local path or a filesystem URI), through
    the landing filesystem (:mod:`pipelines.landing`) that the decode tasks read them with;
    and the entries so named that are not files to read (folders, dangling links, empty)."""
    found = landing.list_files(location, EXTENSION, storage)
    return [CaptureFile(f.path, f.size, f.modified_ms) for f in found.files], found.skipped


def read_header(file: CaptureFile, storage: Mapping[str, str] | None = None) -> CaptureFile:
    with landing.open_input(file.path, storage) as fh:
        head = fh.read(PREAMBLE_LEN)
        if len(head) == PREAMBLE_LEN:
            head += fh.read(int.from_bytes(head[8:12], "big"))
    header, length = parse_header(head, file=file.path)
    return CaptureFile(
        file.path,
        file.size,
        file.modified_ms,
        header.bucket,
        header.session_id,
        header.sequence,
        header.collections,
        length,
        header.started_at or "",
    )


@dataclass(frozen=True)
class Problem:
    """Why a file is not read as planned: ``status`` ``missing`` (vanished, or no longer a
    file) or ``changed`` (other bytes than those planned), and what was found."""

    status: str
    message: str


def header_or_problem(
    file: CaptureFile, storage: Mapping[str, str] | None = None
) -> CaptureFile | Problem:
    """:func:`read_header`, or why the file cannot be read: it vanished or became a folder
    (``missing``), or is not a capture file (``changed``, with the header's fault). Other I/O
    errors are raised."""
    try:
        return read_header(file, storage)
    except CaptureFormatError as exc:
        return Problem("changed", exc.reason)
    except OSError:
        reason = landing.gone(file.path, storage)
        if reason is None:  # still a file there: an I/O error, not a change
            raise
        return Problem("missing", reason)


# --- tables ------------------------------------------------------------------------------


def ensure_tables(spark: SparkSession, config: AppConfig, bucket: str) -> BucketTables:
    """The bronze tables of ``bucket`` exist (the events table clustered by
    :data:`EVENTS_CLUSTERING`); returns the bucket's names."""
    from pipelines import schemas

    names = BucketTables(bucket)
    delta_io.ensure_database(spark, names.events)
    for table, schema in (
        (names.events, schemas.EVENTS),
        (names.quarantine, schemas.QUARANTINE),
        (names.ingest_log, schemas.INGEST_LOG),
    ):
        events = table == names.events
        clustering = EVENTS_CLUSTERING if events else ()
        properties = {**config.tables.properties, **(EVENTS_STATS if events else {})}
        delta_io.create_table(spark, table, schema, properties, cluster_by=clustering)
        # a table made by an earlier version: an ingest log without ``digest``, events
        # without ``stream_flag_names``, ``stream_opaque`` or ``high_seqnos``
        delta_io.add_missing_columns(spark, table, schema)
    return names


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


def read_log(spark: SparkSession, table: str) -> LogState:
    return LogState.of([r.asDict() for r in spark.table(table).collect()])


def _log_rows(
    spark: SparkSession, table: str, rows: list[dict[str, Any]], version: int, status: str
) -> None:
    """Append ``rows`` to the ingest log in one commit, under run ``version``, each with
    ``status`` unless it has its own."""
    from pyspark.sql import functions as F

    from pipelines import schemas

    full = [
        {
            **{f.name: None for f in schemas.INGEST_LOG.fields},
            "status": status,  # unless the row has its own
            **r,
            "run_version": version,
            "logged_at": None,
        }
        for r in rows
    ]
    df = spark.createDataFrame(full, schema=schemas.INGEST_LOG).withColumn(
        "logged_at", F.current_timestamp()
    )
    delta_io.append(df, table)


# --- the run -----------------------------------------------------------------------------


def plan_files(
    files: list[CaptureFile],
    state: LogState,
    bucket: str,
    limit: int,
    max_bytes: int,
    summary: IngestSummary,
    storage: Mapping[str, str] | None = None,
) -> tuple[list[CaptureFile], list[dict[str, Any]]]:
    """The files to ingest now, in session order, and ``changed`` rows to log."""
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
        header = header_or_problem(f, storage)
        if isinstance(header, Problem):
            if header.status == "missing":
                summary.skipped.append(f"{f.path}: {header.message} before it was read")
            else:
                summary.unreadable.append(f"{f.path}: {header.message}")
            continue
        if header.bucket == bucket:
            candidates.append(header)
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


class ByFile:
    """Accumulator of ``{file: value}`` from the tasks (counts, scan outcomes). A file's value
    is set, not added: a task that runs again for the same file sets the same value."""

    def zero(self, value: dict[str, Any]) -> dict[str, Any]:
        return {}

    def addInPlace(  # pyspark's AccumulatorParam protocol
        self, total: dict[str, Any], more: dict[str, Any]
    ) -> dict[str, Any]:
        total.update(more)
        return total


Hook = Callable[[str], None]


def _no_hook(point: str) -> None:
    return None


def ingest_bucket(
    spark: SparkSession, config: AppConfig, bucket: BucketConfig, *, hook: Hook = _no_hook
) -> IngestSummary:
    """One run for one bucket. ``hook(point)`` is called between the steps (tests use it).

    Each file is decoded once for its events: session order is worked out in the decode task
    from the file's ``carry``, which a scan of the run's files (framing and state-setting
    frames only) gives before. Malformed frames are counted there; only files with some are
    decoded again, for their quarantine records. A planned file that changes while its task
    reads it fails the write (nothing commits); the run is then resumed at once, which leaves
    the file out.
    """
    started = time.perf_counter()
    first = IngestSummary(bucket.name)
    try:
        summary = _Run.start(spark, config, bucket, hook, first)
    except LandingChangedError as exc:
        log.warning("%s: resuming the run without it", exc)
        summary = _Run.start(spark, config, bucket, hook, IngestSummary(bucket.name))
        # what the first attempt found before it failed, and the landing no longer shows
        summary.skipped = list(dict.fromkeys(first.skipped + summary.skipped))
        summary.waiting = list(dict.fromkeys(first.waiting + summary.waiting))
    summary.seconds = time.perf_counter() - started
    log.info(summary.render())
    return summary


@dataclass
class _Run:
    """One attempt at a run of one bucket, and what it needs at each step."""

    spark: SparkSession
    config: AppConfig
    names: BucketTables
    state: LogState
    summary: IngestSummary
    hook: Hook

    @property
    def storage(self) -> Mapping[str, str]:
        return self.config.spark.conf  # what the landing filesystem is built from, in tasks too

    @classmethod
    def start(
        cls,
        spark: SparkSession,
        config: AppConfig,
        bucket: BucketConfig,
        hook: Hook,
        summary: IngestSummary,
    ) -> IngestSummary:
        """List, plan and write, or finish the run that did not finish; ``summary`` is
        filled as it goes."""
        check_landing(config, [bucket])
        names = ensure_tables(spark, config, bucket.name)
        state = read_log(spark, names.ingest_log)
        run = cls(spark, config, names, state, summary, hook)
        files, skipped = list_captures(config.landing_for(bucket), run.storage)
        summary.skipped += [str(k) for k in skipped]
        chosen, changed_rows = plan_files(
            files,
            state,
            bucket.name,
            config.ingest.max_files_per_run,
            config.ingest.max_file_bytes,
            summary,
            run.storage,
        )
        if changed_rows:
            _log_rows(spark, names.ingest_log, changed_rows, state.last_version, "changed")
        if state.open_plan:  # a run that did not finish: finish it first
            run.resume()
        elif chosen:
            run.plan(chosen)
        return summary

    # --- a new run ---------------------------------------------------------------------

    def plan(self, chosen: list[CaptureFile]) -> None:
        """Bind ``chosen`` to their bytes (scan), log the plan, write it."""
        scans = self.scan(chosen)
        settled = settle(chosen, _problems(scans))
        self.summary.skipped += [
            f"{f.path}: {p.message} (while planning); left for a later run"
            for f, p in settled.left_out
        ]
        self.summary.waiting += settled.waiting
        if not settled.kept:
            return
        version = self.state.last_version + 1
        run_id = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:8]}"
        carries, ends = stream_states(self.state, settled.kept, scans)
        digests = {f.path: scans[f.path].digest for f in settled.kept}
        _log_rows(
            self.spark,
            self.names.ingest_log,
            [
                f.log_row(run_id, digest=digests[f.path], end_state=ends[f.path])
                for f in settled.kept
            ],
            version,
            "planned",
        )
        self.hook("planned")
        self.write(version, run_id, settled.kept, carries, ends, digests, [])

    # --- a run that did not finish -----------------------------------------------------

    def resume(self) -> None:
        """Finish the open plan: close it from what bronze holds if its events committed,
        else write the planned files that are still as planned and log the others."""
        plan = self.state.open_plan
        version, run_id = plan[0]["run_version"], plan[0]["ingest_run_id"]
        self.summary.resumed = True
        self.summary.run_version, self.summary.run_id = version, run_id
        rows = {r["file"]: r for r in plan}
        planned = sorted(
            (
                CaptureFile(
                    r["file"],
                    r["size"],
                    r["modified_ms"],
                    session_id=r["session_id"],
                    file_sequence=r["file_sequence"],
                )
                for r in plan
            ),
            key=lambda f: (f.session_id, f.file_sequence),
        )
        digests = {p: r["digest"] for p, r in rows.items() if r["digest"]}
        if _at_least(
            delta_io.committed_version(self.spark, self.names.events, TXN_APP_ID), version
        ):
            self.close_committed(version, run_id, planned, rows, digests)
            return
        headers, problems = self.headers(planned)
        scans = self.scan(list(headers.values()), digests)
        problems |= _problems(scans)
        settled = settle(planned, problems)
        self.summary.left_out += [f"{f.path}: {p.message}" for f, p in settled.left_out]
        in_plan = tuple(f"{f.path} (" for f in planned)  # said once, as the plan's
        self.summary.waiting = [w for w in self.summary.waiting if not w.startswith(in_plan)]
        self.summary.waiting += settled.waiting
        closing = [
            f.log_row(run_id, status=p.status, message=p.message, digest=digests.get(f.path))
            for f, p in settled.left_out
        ]
        kept = [headers[f.path] for f in settled.kept]
        if not kept:
            _log_rows(self.spark, self.names.ingest_log, closing, version, "changed")
            return
        carries, ends = stream_states(self.state, kept, scans)
        self.write(version, run_id, kept, carries, ends, digests, closing)

    def close_committed(
        self,
        version: int,
        run_id: str,
        planned: list[CaptureFile],
        rows: dict[str, dict[str, Any]],
        digests: dict[str, str],
    ) -> None:
        """The plan's events committed before the run was killed: log its files ``ingested``
        with what bronze holds of the run (its frames and quarantine records), never with
        counts of bytes read again. Only the quarantine records (when their write had not
        committed) are decoded again, from the planned bytes of files that still have them;
        a file that differs from the plan is reported (``summary.changed``, the row's
        ``message``)."""
        from pyspark.sql import functions as F

        def per_file(table: str) -> dict[str, int]:
            # a scan of the table, paid only by a run killed between its writes
            found = self.spark.table(table).where(F.col("ingest_run_id") == run_id)
            return {r["file"]: r["count"] for r in found.groupBy("file").count().collect()}

        frames = per_file(self.names.events)
        # the files are read again all the same, to report any that differ from the plan
        headers, problems = self.headers(planned)
        scans = self.scan(list(headers.values()), digests)
        problems |= _problems(scans)
        intact = [  # the planned bytes are there (the file may have grown past them)
            headers[f.path]
            for f in planned
            if f.path not in problems or (f.path in scans and scans[f.path].grew)
        ]
        ends: dict[str, str | None] = {p: r["end_state"] for p, r in rows.items()}
        for path, end in stream_states(self.state, intact, scans)[1].items():
            ends[path] = ends[path] or end  # for a plan logged before end states were
        errors: dict[str, int | None] = {}
        quarantined = _at_least(
            delta_io.committed_version(self.spark, self.names.quarantine, TXN_APP_ID), version
        )
        if quarantined:
            errors.update({f.path: 0 for f in planned} | per_file(self.names.quarantine))
        else:
            counts = self.quarantine(intact, version, run_id, digests)
            errors.update({path: n for path, (_, n) in counts.items()})
        messages: dict[str, str] = {}
        for f in planned:
            if f.path in problems:
                message = f"{problems[f.path].message} after its events were written"
                if f.path not in errors:
                    message += "; its malformed frames, if any, are not quarantined"
                if ends[f.path] is None:
                    message += "; the stream state it ends in is unknown"
                messages[f.path] = message
                self.summary.changed.append(f"{f.path} ({message})")
        self.close(
            version,
            [
                f.log_row(
                    run_id,
                    frames=frames.get(f.path, 0),
                    errors=errors.get(f.path),
                    end_state=ends[f.path],
                    digest=digests.get(f.path),
                    message=messages.get(f.path),
                )
                for f in planned
            ],
        )

    def headers(
        self, planned: list[CaptureFile]
    ) -> tuple[dict[str, CaptureFile], dict[str, Problem]]:
        """The planned files' headers, and the problems of those whose header is not there
        or not the one planned (a plan logged before digests were is checked so)."""
        headers, problems = {}, {}
        for f in planned:
            found = header_or_problem(f, self.storage)
            if isinstance(found, Problem):
                reason = found.message
                problems[f.path] = (
                    found if found.status == "missing" else Problem("changed", f"now {reason}")
                )
            elif (found.session_id, found.file_sequence) != (f.session_id, f.file_sequence):
                problems[f.path] = Problem(
                    "changed",
                    f"now session {found.session_id} sequence {found.file_sequence}, planned "
                    f"as session {f.session_id} sequence {f.file_sequence}",
                )
            else:
                headers[f.path] = found
        return headers, problems

    # --- the steps ---------------------------------------------------------------------

    def scan(
        self,
        files: list[CaptureFile],
        digests: Mapping[str, str] | None = None,
        *,
        growth: bool = True,
    ) -> dict[str, FileScan]:
        """What each file does to its session's streams, its digest, and its problem (a scan
        task per file): vanished, shrank, grew (with ``growth``), or bytes other than
        ``digests`` (by path) say."""
        from pipelines import schemas

        if not files:
            return {}
        scan_schema = schemas.arrow_schema(schemas.SCAN)
        chunk, storage = self.config.ingest.chunk_bytes, self.storage
        outcomes: Any = self.spark.sparkContext.accumulator({}, ByFile())  # type: ignore[arg-type]
        rows = (
            _files(self.spark, [_file_row(f) for f in files], self.config.ingest.chunk_bytes)
            .mapInArrow(
                lambda b: scan_files(
                    b,
                    scan_schema,
                    chunk_bytes=chunk,
                    storage=storage,
                    planned_digests=digests,
                    growth=growth,
                    done=lambda path, scan: outcomes.add(
                        {path: (scan.digest, scan.problem, scan.missing, scan.grew)}
                    ),
                ),
                schemas.SCAN,
            )
            .collect()
        )
        scans: dict[str, FileScan] = {}
        for f in files:
            digest, problem, missing, grew = outcomes.value[f.path]
            scans[f.path] = FileScan(digest=digest, problem=problem, missing=missing, grew=grew)
        for r in rows:
            scan = scans[r["file"]]
            if r["has_snapshot"]:
                scan.snapshots[r["vb_key"]] = (
                    r["snapshot_start"],
                    r["snapshot_end"],
                    r["snapshot_flags"],
                    r["snapshot_oso"],
                )
            if r["vb_uuid"] is not None:
                scan.uuids[r["vb_key"]] = r["vb_uuid"]
        return scans

    def write(
        self,
        version: int,
        run_id: str,
        files: list[CaptureFile],
        carries: dict[str, str],
        ends: dict[str, str],
        digests: dict[str, str],
        closing: list[dict[str, Any]],
    ) -> None:
        """Append the events and quarantine records of ``files`` (exactly their planned
        bytes) as run ``version``, then log them ``ingested`` with ``closing`` (the rows of
        the plan's files left out), in one commit."""
        from pyspark.sql import functions as F

        from pipelines import schemas
        from pipelines.bronze import transforms

        spark, names, summary = self.spark, self.names, self.summary
        summary.run_version, summary.run_id, summary.files = version, run_id, len(files)
        log.info("run %s: ingesting %d files of bucket %s", version, len(files), summary.bucket)
        chunk, raw_limit = self.config.ingest.chunk_bytes, self.config.ingest.quarantine_raw_bytes
        storage = self.storage
        file_rows = [_file_row(f, carries[f.path]) for f in files]
        counts: Any = spark.sparkContext.accumulator({}, ByFile())  # type: ignore[arg-type]
        events_schema = schemas.arrow_schema(schemas.DECODED_EVENTS)

        def decoded(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            return decode_files(
                batches,
                events_schema,
                chunk_bytes=chunk,
                raw_limit=raw_limit,
                errors=False,
                done=lambda path, frames, errors: counts.add({path: (frames, errors)}),
                storage=storage,
                planned_digests=digests,
            )

        if self.config.ingest.writer == "arrow":
            self.write_events(version, run_id, file_rows, decoded)
        else:
            events = _files(spark, file_rows, chunk).mapInArrow(decoded, schemas.DECODED_EVENTS)
            _relay_landing_changes(
                lambda: delta_io.append_once(
                    transforms.events(events, run_id, F.current_timestamp()),
                    names.events,
                    app_id=TXN_APP_ID,
                    version=version,
                )
            )
        self.hook("events")
        found: dict[str, tuple[int, int]] = dict(counts.value)
        # Files with malformed frames, or all when the events were written by an earlier
        # attempt of this run (Delta skipped the write: nothing was decoded or counted).
        again = [f for f in files if f.path not in found or found[f.path][1]]
        found |= self.quarantine(again, version, run_id, digests)
        self.hook("quarantine")
        self.close(
            version,
            [
                f.log_row(
                    run_id,
                    frames=found[f.path][0],
                    errors=found[f.path][1],
                    end_state=ends[f.path],
                    digest=digests.get(f.path),
                )
                for f in files
            ]
            + closing,
        )

    def write_events(
        self,
        version: int,
        run_id: str,
        file_rows: list[dict[str, Any]],
        decoded: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    ) -> None:
        """The ``arrow`` writer: each decode task writes its events' Parquet file into the
        events table's folder (:mod:`pipelines.bronze.writer`) and the driver commits all
        of them as run ``version``, unless an earlier attempt of the run committed (then
        nothing is decoded, as when Spark's idempotent append skips)."""
        from pipelines import schemas

        spark, table = self.spark, self.names.events
        if _at_least(delta_io.committed_version(spark, table, TXN_APP_ID), version):
            return
        location, properties = delta_io.location_and_properties(spark, table)
        stats = properties.get(STATS_COLUMNS_PROPERTY, EVENTS_STATS[STATS_COLUMNS_PROPERTY])
        target = writer.Target(
            location=location,
            schema=schemas.arrow_schema(schemas.EVENTS),
            stats_columns=tuple(c.strip() for c in stats.split(",") if c.strip()),
            storage=self.storage,
            constants={"ingest_run_id": run_id, "ingested_at": dt.datetime.now(dt.UTC)},
        )
        written_schema = schemas.arrow_schema(schemas.WRITTEN)

        def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            rows = list(writer.write_files(decoded(batches), target))
            yield pa.RecordBatch.from_pylist(rows, schema=written_schema)

        chunk = self.config.ingest.chunk_bytes
        written = _relay_landing_changes(
            lambda: _files(spark, file_rows, chunk).mapInArrow(task, schemas.WRITTEN).collect()
        )
        self.hook("written")
        delta_io.commit_files(
            spark, table, [r.asDict() for r in written], app_id=TXN_APP_ID, version=version
        )

    def quarantine(
        self, files: list[CaptureFile], version: int, run_id: str, digests: dict[str, str]
    ) -> dict[str, tuple[int, int]]:
        """Decode ``files`` again for their malformed frames only; append those to the
        quarantine table as run ``version`` and return every file's ``(frames, errors)``."""
        from pyspark import StorageLevel
        from pyspark.sql import functions as F

        from pipelines import schemas
        from pipelines.bronze import transforms

        if not files:
            return {}
        spark, storage = self.spark, self.storage
        chunk, raw_limit = self.config.ingest.chunk_bytes, self.config.ingest.quarantine_raw_bytes
        counts: Any = spark.sparkContext.accumulator({}, ByFile())  # type: ignore[arg-type]
        out_schema = schemas.arrow_schema(schemas.DECODE_OUTPUT)
        errors = (
            _files(spark, [_file_row(f) for f in files], chunk)
            .mapInArrow(
                lambda batches: decode_files(
                    batches,
                    out_schema,
                    chunk_bytes=chunk,
                    raw_limit=raw_limit,
                    frames=False,
                    done=lambda path, frames, errors: counts.add({path: (frames, errors)}),
                    storage=storage,
                    planned_digests=digests,
                ),
                schemas.DECODE_OUTPUT,
            )
            .persist(StorageLevel.MEMORY_AND_DISK)  # only malformed frames: small
        )
        try:
            # every file decoded once, so every file counted
            if _relay_landing_changes(errors.count):
                delta_io.append_once(
                    transforms.quarantine(errors, run_id, F.current_timestamp()),
                    self.names.quarantine,
                    app_id=TXN_APP_ID,
                    version=version,
                )
        finally:
            errors.unpersist()
        return dict(counts.value)

    def close(self, version: int, rows: list[dict[str, Any]]) -> None:
        """Log the plan's closing rows, in one commit, and count what was ingested."""
        _log_rows(self.spark, self.names.ingest_log, rows, version, "ingested")
        done = [r for r in rows if r.get("status", "ingested") == "ingested"]
        self.summary.files = len(done)
        self.summary.frames = sum(r["frames"] or 0 for r in done)
        self.summary.errors = sum(r["errors"] or 0 for r in done)


def _at_least(committed: int | None, version: int) -> bool:
    return committed is not None and committed >= version


def _problems(scans: Mapping[str, FileScan]) -> dict[str, Problem]:
    return {
        path: Problem("missing" if scan.missing else "changed", scan.problem)
        for path, scan in scans.items()
        if scan.problem is not None
    }


_T = TypeVar("_T")


def _relay_landing_changes(write: Callable[[], _T]) -> _T:
    """Run a Spark action whose decode tasks may fail with :class:`LandingChangedError` (a
    planned file changed under them): the driver raises it again, typed."""
    try:
        return write()
    except Exception as exc:
        relayed = re.search(rf"{LandingChangedError.__name__}: ([^\n]+)", str(exc))
        if relayed is None:
            raise
        raise LandingChangedError(relayed.group(1)) from exc


def _file_row(f: CaptureFile, carry: str | None = None) -> dict[str, Any]:
    """A file's row for the scan and decode tasks (``schemas.FILES``)."""
    return {
        "path": f.path,
        "bucket": f.bucket,
        "session_started_at": f.started_at,
        "session_id": f.session_id,
        "file_sequence": f.file_sequence,
        "collections": f.collections,
        "header_length": f.header_length,
        "size": f.size,
        "carry": carry,
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


def _files(spark: SparkSession, file_rows: list[dict[str, Any]], target_bytes: int) -> DataFrame:
    """The run's files, grouped into decode tasks (:func:`task_groups`), one partition each."""
    from pipelines import schemas

    groups = task_groups(
        [r["size"] for r in file_rows],
        target_bytes=target_bytes,
        parallelism=spark.sparkContext.defaultParallelism,
    )
    fields = schemas.FILES.fieldNames()
    tasks = [[tuple(file_rows[i][f] for f in fields) for i in g] for g in groups]
    # one element per slice: each group is exactly one partition, with no shuffle
    rdd = spark.sparkContext.parallelize(tasks, max(len(tasks), 1)).flatMap(lambda g: g)
    return spark.createDataFrame(rdd, schema=schemas.FILES)


# --- entry point -------------------------------------------------------------------------


def run(
    config: AppConfig,
    bucket: str | None = None,
    *,
    spark: SparkSession | None = None,
    config_file: object = None,
) -> list[IngestSummary]:
    """Ingest every configured bucket (or one); builds the Spark session if none is given.
    ``config_file``: where ``config`` was read from, named by configuration errors."""
    from pipelines.spark_session import ingest_jvm_conf, session_for

    buckets = config.bucket(bucket)  # a wrong name fails before Spark starts
    check_landing(config, buckets, config_file)  # so does a landing that is not there
    session = spark or session_for(config, "dcp-cdc-bronze", jvm_conf=ingest_jvm_conf(config))
    return [ingest_bucket(session, config, b) for b in buckets]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``dcp-cdc ingest`` has no flags besides ``--config`` and ``--bucket``."""


def command(args: argparse.Namespace, out: TextIO) -> int:
    """``dcp-cdc ingest``: one summary per bucket."""
    for summary in run(load_config(args.config), args.bucket, config_file=args.config):
        out.write(summary.render() + "\n")
    return 0


# ``python -m pipelines.bronze.job`` and ``spark-submit pipelines/bronze/job.py``: the ``ingest`` verb of the command line
# (imported here only, so that the job module does not import the command line).
if __name__ == "__main__":
    from pipelines.cli import job_main

    raise SystemExit(job_main("ingest"))
