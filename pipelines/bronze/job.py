"""The bronze ingest job: new capture files of the landing location into bronze Delta tables.

Run it as often as you like (``dcp-cdc ingest``, ``python -m pipelines.bronze.job``,
``spark-submit``). Exactly once per frame comes from the ingest log plus Delta's idempotent
writes:

1. **plan**: the files to ingest are chosen (in session order; a file waits until the previous
   file of its session is in) and written to the ingest log as ``planned`` under a new run
   version N, before any data is written;
2. **scan**: each file's framing is read and only its state-setting frames decoded (snapshot
   markers, OSO markers, stream-request responses), so that the state every file starts in
   (its ``carry``) and ends in is known before any event is written;
3. **write**: each file is decoded once, in one task, its events given their session-order
   state there and appended with ``txnAppId``/``txnVersion = N``, so a write that already
   committed is skipped by Delta when the run is repeated; the tasks count frames and
   malformed frames per file, and only files with malformed frames are decoded again for
   their quarantine records (appended the same way);
4. **close**: the files are logged ``ingested`` with their counts and end-of-file stream state.

A run that dies anywhere is finished by the next run, which finds the plan without its
``ingested`` rows and repeats exactly that plan.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from dcp_cdc.capture import EXTENSION, PREAMBLE_LEN, parse_header
from dcp_cdc.config import AppConfig, BucketConfig, load_config
from dcp_cdc.errors import CaptureFormatError
from pipelines import delta_io, landing
from pipelines.bronze.decode import FileScan, StreamState, decode_files, scan_files
from pipelines.tables import BucketTables

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# pyspark, and the modules that import it (pipelines.schemas, pipelines.bronze.transforms), are
# imported where used: the command line imports this module to print its help without Spark.

log = logging.getLogger("dcp_cdc.bronze")
TXN_APP_ID = "dcp-cdc-bronze"
EVENTS_CLUSTERING = ("vbucket", "by_seqno")
"""Liquid clustering keys of the events table (applied by OPTIMIZE, not at ingest)."""


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
        lines += [f"  unreadable (not a capture file): {u}" for u in self.unreadable]
        return "\n".join(lines)


# --- landing -----------------------------------------------------------------------------


def list_captures(location: str, storage: Mapping[str, str] | None = None) -> list[CaptureFile]:
    """Every ``*.dcpcap`` below ``location`` (a local path or a filesystem URI), through the
    landing filesystem (:mod:`pipelines.landing`) that the decode tasks read them with."""
    return [
        CaptureFile(f.path, f.size, f.modified_ms)
        for f in landing.list_files(location, EXTENSION, storage)
    ]


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
        clustering = EVENTS_CLUSTERING if table == names.events else ()
        delta_io.create_table(spark, table, schema, config.tables.properties, cluster_by=clustering)
    return names


@dataclass
class LogState:
    ingested: dict[str, dict[str, Any]]  # path -> the ingested row
    changed_seen: set[tuple[str, int, int]]
    open_plan: list[dict[str, Any]]  # planned rows of a run without ingested rows
    last_version: int


def read_log(spark: SparkSession, table: str) -> LogState:
    rows = [r.asDict() for r in spark.table(table).collect()]
    ingested = {r["file"]: r for r in rows if r["status"] == "ingested"}
    changed = {(r["file"], r["size"], r["modified_ms"]) for r in rows if r["status"] == "changed"}
    done_versions = {r["run_version"] for r in rows if r["status"] == "ingested"}
    planned = [
        r for r in rows if r["status"] == "planned" and r["run_version"] not in done_versions
    ]
    open_version = max((r["run_version"] for r in planned), default=None)
    open_plan = [r for r in planned if r["run_version"] == open_version]
    last = max((r["run_version"] for r in rows if r["run_version"] is not None), default=0)
    return LogState(ingested, changed, open_plan, last)


def _log_rows(
    spark: SparkSession, table: str, rows: list[dict[str, Any]], version: int, status: str
) -> None:
    from pyspark.sql import functions as F

    from pipelines import schemas

    full = [
        {
            **{f.name: None for f in schemas.INGEST_LOG.fields},
            **r,
            "status": status,
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
        try:
            header = read_header(f, storage)
        except CaptureFormatError as exc:
            summary.unreadable.append(f"{f.path}: {exc.reason}")
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


class FileCounts:
    """Accumulator of ``{file: (frames, errors)}`` from the decode tasks. A file's counts are
    set, not added: a task that runs again for the same file sets the same counts."""

    def zero(self, value: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
        return {}

    def addInPlace(  # pyspark's AccumulatorParam protocol
        self, total: dict[str, tuple[int, int]], more: dict[str, tuple[int, int]]
    ) -> dict[str, tuple[int, int]]:
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
    frames only) gives before. Malformed frames are counted there; only files that have some
    are decoded again, for their quarantine records.
    """
    from pyspark.sql import functions as F

    from pipelines import schemas
    from pipelines.bronze import transforms

    started = time.perf_counter()
    summary = IngestSummary(bucket.name)
    names = ensure_tables(spark, config, bucket.name)
    state = read_log(spark, names.ingest_log)
    storage = config.spark.conf  # what the landing filesystem is built from, here and in tasks
    files = list_captures(config.landing_for(bucket), storage)
    chosen, changed_rows = plan_files(
        files,
        state,
        bucket.name,
        config.ingest.max_files_per_run,
        config.ingest.max_file_bytes,
        summary,
        storage,
    )
    if changed_rows:
        _log_rows(spark, names.ingest_log, changed_rows, state.last_version, "changed")
    if state.open_plan:  # a run that did not finish: repeat exactly its plan
        version = state.open_plan[0]["run_version"]
        run_id = state.open_plan[0]["ingest_run_id"]
        by_path = {f.path: f for f in files}
        chosen = [
            read_header(by_path[r["file"]], storage)
            for r in state.open_plan
            if r["file"] in by_path
        ]
        summary.resumed = True
    elif not chosen:
        log.info(summary.render())
        return summary
    else:
        version = state.last_version + 1
        run_id = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{uuid.uuid4().hex[:8]}"
        _log_rows(
            spark,
            names.ingest_log,
            [f.log_row(run_id) for f in chosen],
            version,
            "planned",
        )
    hook("planned")
    summary.run_version, summary.run_id, summary.files = version, run_id, len(chosen)
    log.info("run %s: ingesting %d files of bucket %s", version, len(chosen), bucket.name)

    chunk, raw_limit = config.ingest.chunk_bytes, config.ingest.quarantine_raw_bytes
    file_rows: list[dict[str, Any]] = [
        {
            "path": f.path,
            "bucket": f.bucket,
            "session_started_at": f.started_at,
            "session_id": f.session_id,
            "file_sequence": f.file_sequence,
            "collections": f.collections,
            "header_length": f.header_length,
            "size": f.size,
            "carry": None,
        }
        for f in chosen
    ]
    carries, end_states = stream_states(state, chosen, _scan(spark, file_rows, chunk, storage))
    for row in file_rows:
        row["carry"] = carries[row["path"]]
    ingested_at = F.current_timestamp()

    counts: Any = spark.sparkContext.accumulator({}, FileCounts())  # type: ignore[arg-type]
    events_schema = schemas.arrow_schema(schemas.DECODED_EVENTS)
    events = _files(spark, file_rows).mapInArrow(
        lambda batches: decode_files(
            batches,
            events_schema,
            chunk_bytes=chunk,
            raw_limit=raw_limit,
            errors=False,
            done=lambda path, frames, errors: counts.add({path: (frames, errors)}),
            storage=storage,
        ),
        schemas.DECODED_EVENTS,
    )
    delta_io.append_once(
        transforms.events(events, run_id, ingested_at),
        names.events,
        app_id=TXN_APP_ID,
        version=version,
    )
    hook("events")
    found: dict[str, tuple[int, int]] = dict(counts.value)
    # Files with malformed frames, or all when the events were written by an earlier attempt
    # of this run (Delta skipped the write: nothing was decoded, so nothing was counted).
    again = [r for r in file_rows if r["path"] not in found or found[r["path"]][1]]
    if again:
        found |= _quarantine(
            spark,
            again,
            chunk,
            raw_limit,
            lambda frames: transforms.quarantine(frames, run_id, ingested_at),
            names.quarantine,
            version,
            storage,
        )
    hook("quarantine")
    _log_rows(
        spark,
        names.ingest_log,
        [
            f.log_row(
                run_id,
                frames=found[f.path][0],
                errors=found[f.path][1],
                end_state=end_states[f.path],
            )
            for f in chosen
        ],
        version,
        "ingested",
    )
    summary.frames = sum(found[f.path][0] for f in chosen)
    summary.errors = sum(found[f.path][1] for f in chosen)
    summary.seconds = time.perf_counter() - started
    log.info(summary.render())
    return summary


def _files(spark: SparkSession, file_rows: list[dict[str, Any]]) -> DataFrame:
    """The run's files, one partition (one decode task) each."""
    from pipelines import schemas

    return spark.createDataFrame(file_rows, schema=schemas.FILES).repartition(
        max(len(file_rows), 1)
    )


def _scan(
    spark: SparkSession,
    file_rows: list[dict[str, Any]],
    chunk: int,
    storage: Mapping[str, str] | None = None,
) -> dict[str, FileScan]:
    """What each file does to its session's streams (a scan task per file)."""
    from pipelines import schemas

    scan_schema = schemas.arrow_schema(schemas.SCAN)
    rows = (
        _files(spark, file_rows)
        .mapInArrow(
            lambda b: scan_files(b, scan_schema, chunk_bytes=chunk, storage=storage),
            schemas.SCAN,
        )
        .collect()
    )
    scans: dict[str, FileScan] = {r["path"]: FileScan() for r in file_rows}
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


def _quarantine(
    spark: SparkSession,
    file_rows: list[dict[str, Any]],
    chunk: int,
    raw_limit: int,
    to_rows: Callable[[DataFrame], DataFrame],
    table: str,
    version: int,
    storage: Mapping[str, str] | None = None,
) -> dict[str, tuple[int, int]]:
    """Decode ``file_rows`` again for their malformed frames only; append those to the
    quarantine table and return every file's counts."""
    from pyspark import StorageLevel

    from pipelines import schemas

    counts: Any = spark.sparkContext.accumulator({}, FileCounts())  # type: ignore[arg-type]
    out_schema = schemas.arrow_schema(schemas.DECODE_OUTPUT)
    errors = (
        _files(spark, file_rows)
        .mapInArrow(
            lambda batches: decode_files(
                batches,
                out_schema,
                chunk_bytes=chunk,
                raw_limit=raw_limit,
                frames=False,
                done=lambda path, frames, errors: counts.add({path: (frames, errors)}),
                storage=storage,
            ),
            schemas.DECODE_OUTPUT,
        )
        .persist(StorageLevel.MEMORY_AND_DISK)  # only malformed frames: small
    )
    try:
        if errors.count():  # every file decoded once, so every file counted
            delta_io.append_once(to_rows(errors), table, app_id=TXN_APP_ID, version=version)
    finally:
        errors.unpersist()
    return dict(counts.value)


# --- entry point -------------------------------------------------------------------------


def run(
    config: AppConfig, bucket: str | None = None, *, spark: SparkSession | None = None
) -> list[IngestSummary]:
    """Ingest every configured bucket (or one); builds the Spark session if none is given."""
    from pipelines.spark_session import session_for

    buckets = config.bucket(bucket)  # a wrong name fails before Spark starts
    session = spark or session_for(config, "dcp-cdc-bronze")
    return [ingest_bucket(session, config, b) for b in buckets]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``dcp-cdc ingest`` has no flags besides ``--config`` and ``--bucket``."""


def command(args: argparse.Namespace, out: TextIO) -> int:
    """``dcp-cdc ingest``: one summary per bucket."""
    for summary in run(load_config(args.config), args.bucket):
        out.write(summary.render() + "\n")
    return 0


# ``python -m pipelines.bronze.job`` and ``spark-submit pipelines/bronze/job.py``: the ``ingest`` verb of the command line
# (imported here only, so that the job module does not import the command line).
if __name__ == "__main__":
    from pipelines.cli import job_main

    raise SystemExit(job_main("ingest"))
