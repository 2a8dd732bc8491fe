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

This module orders the steps (:func:`ingest_bucket`, a new run or the finishing of the last
one in :class:`_Run`, which is the job's own sequence of steps, not a concern apart); the
decisions are :mod:`pipelines.bronze.plan`'s, the tables and the ingest log
:mod:`pipelines.bronze.store`'s, the landing's capture files :mod:`pipelines.bronze.landing`'s, the
decode and scan tasks :mod:`pipelines.bronze.decode`'s, the ``arrow`` writer
:mod:`pipelines.bronze.writer`'s. The command line's verb: :mod:`pipelines.app.commands.ingest`.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from dcp_cdc.config import AppConfig, BucketConfig
from dcp_cdc.logs import log_context
from pipelines import schemas
from pipelines.bronze import store, tasks, transforms, writer
from pipelines.bronze.decode import FileScan, scan_files
from pipelines.bronze.landing import (
    CaptureFile,
    Problem,
    check_landing,
    header_or_problem,
    list_captures,
)
from pipelines.bronze.memory import IngestMemory
from pipelines.bronze.plan import (
    IngestSummary,
    LogState,
    plan_files,
    problems_of,
    settle,
    stream_states,
)
from pipelines.errors import LandingChangedError
from pipelines.lake import delta_io, file_commits
from pipelines.lake.spark_session import ingest_jvm_conf, session_for
from pipelines.observe.batch_metrics import RunMetrics, pushed
from pipelines.tables import BucketTables

log = logging.getLogger("dcp_cdc.bronze")


Hook = Callable[[str], None]


def _no_hook(point: str) -> None:
    return None


def ingest_bucket(
    spark: SparkSession,
    config: AppConfig,
    bucket: BucketConfig,
    *,
    hook: Hook = _no_hook,
    memory: IngestMemory | None = None,
) -> IngestSummary:
    """One run for one bucket. ``hook(point)`` is called between the steps (tests use it).
    ``memory``: the ingest log as the previous run of this process left it (follow mode),
    used while the log is at the version it wrote, and updated; forgotten if the run fails.
    A run with nothing new to ingest then runs no Spark job.

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
        try:
            summary = _Run.start(spark, config, bucket, hook, first, memory)
        except LandingChangedError as exc:
            log.warning("%s: resuming the run without it", exc)
            if memory is not None:
                memory.forget()
            summary = _Run.start(spark, config, bucket, hook, IngestSummary(bucket.name), memory)
            # what the first attempt found before it failed, and the landing no longer shows
            summary.skipped = list(dict.fromkeys(first.skipped + summary.skipped))
            summary.waiting = list(dict.fromkeys(first.waiting + summary.waiting))
    except BaseException:
        if memory is not None:
            memory.forget()
        raise
    summary.seconds = time.perf_counter() - started
    log.info(summary.render(), extra={"run_id": summary.run_id or None})
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
    memory: IngestMemory | None = None

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
        memory: IngestMemory | None = None,
    ) -> IngestSummary:
        """List, plan and write, or finish the run that did not finish; ``summary`` is
        filled as it goes."""
        check_landing(config, [bucket])
        names = store.ensure_tables(spark, config, bucket.name)
        if memory is None:
            state = store.read_log(spark, names.ingest_log)
        else:
            state = memory.state(spark, names.ingest_log)
        run = cls(spark, config, names, state, summary, hook, memory)
        files, skipped = list_captures(config.landing_for(bucket), run.storage)
        summary.skipped += [str(k) for k in skipped]
        chosen, changed_rows = plan_files(
            files,
            state,
            bucket.name,
            config.ingest.max_files_per_run,
            config.ingest.max_file_bytes,
            summary,
            lambda f: header_or_problem(f, run.storage),
        )
        if changed_rows:
            run.log(changed_rows, state.last_version, "changed")
        if state.open_plan:  # a run that did not finish: finish it first
            run.resume()
        elif chosen:
            run.plan(chosen)
        return summary

    # --- a new run ---------------------------------------------------------------------

    def plan(self, chosen: list[CaptureFile]) -> None:
        """Bind ``chosen`` to their bytes (scan), log the plan, write it."""
        scans = self.scan(chosen)
        settled = settle(chosen, problems_of(scans))
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
        self.log(
            [
                f.log_row(run_id, digest=digests[f.path], end_state=ends[f.path])
                for f in settled.kept
            ],
            version,
            "planned",
        )
        self.hook("planned")
        with log_context(run_id=run_id):
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
            delta_io.committed_version(self.spark, self.names.events, store.TXN_APP_ID), version
        ):
            self.close_committed(version, run_id, planned, rows, digests)
            return
        headers, problems = self.headers(planned)
        scans = self.scan(list(headers.values()), digests)
        problems |= problems_of(scans)
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
            self.log(closing, version, "changed")
            return
        carries, ends = stream_states(self.state, kept, scans)
        with log_context(run_id=run_id):
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

        def per_file(table: str) -> dict[str, int]:
            # a scan of the table, paid only by a run killed between its writes
            found = self.spark.table(table).where(F.col("ingest_run_id") == run_id)
            return {r["file"]: r["count"] for r in found.groupBy("file").count().collect()}

        frames = per_file(self.names.events)
        # the files are read again all the same, to report any that differ from the plan
        headers, problems = self.headers(planned)
        scans = self.scan(list(headers.values()), digests)
        problems |= problems_of(scans)
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
            delta_io.committed_version(self.spark, self.names.quarantine, store.TXN_APP_ID), version
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

    def on_driver(self, files: list[CaptureFile]) -> bool:
        """Whether ``files`` are few bytes enough for the driver to scan, decode and write
        them itself (``[ingest] on_driver_below_bytes``), with no Spark job."""
        return sum(f.size for f in files) < self.config.ingest.on_driver_below_bytes

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
        if not files:
            return {}
        scan_schema = schemas.arrow_schema(schemas.SCAN)
        chunk, storage = self.config.ingest.chunk_bytes, self.storage
        outcomes = tasks.by_file(self.spark)
        worker = not self.on_driver(files)

        def task(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            return scan_files(
                batches,
                scan_schema,
                chunk_bytes=chunk,
                storage=storage,
                planned_digests=digests,
                growth=growth,
                done=lambda path, scan: outcomes.add(
                    {path: (scan.digest, scan.problem, scan.missing, scan.grew)}
                ),
                worker=worker,
            )

        file_rows = [tasks.file_row(f) for f in files]
        if worker:
            rows = [
                r.asDict()
                for r in tasks.files_frame(self.spark, file_rows, chunk)
                .mapInArrow(task, schemas.SCAN)
                .collect()
            ]
        else:
            rows = tasks.in_driver(file_rows, task)
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
        spark, names, summary = self.spark, self.names, self.summary
        summary.run_version, summary.run_id, summary.files = version, run_id, len(files)
        log.info("run %s: ingesting %d files of bucket %s", version, len(files), summary.bucket)
        chunk = self.config.ingest.chunk_bytes
        file_rows = [tasks.file_row(f, carries[f.path]) for f in files]
        counts = tasks.by_file(spark)
        worker = not self.on_driver(files)
        decoded = tasks.decoder(
            self.config, schemas.DECODED_EVENTS, digests, counts, errors=False, worker=worker
        )

        if self.config.ingest.writer == "arrow":
            self.write_events(version, run_id, file_rows, decoded, on_driver=not worker)
        else:
            events = tasks.files_frame(spark, file_rows, chunk).mapInArrow(
                decoded, schemas.DECODED_EVENTS
            )
            tasks.relay_landing_changes(
                lambda: delta_io.append_once(
                    transforms.events(events, run_id, F.current_timestamp()),
                    names.events,
                    app_id=store.TXN_APP_ID,
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
        decoded: tasks.Decoder,
        *,
        on_driver: bool = False,
    ) -> None:
        """The ``arrow`` writer: each decode task (the driver itself, ``on_driver``) writes its
        events' Parquet file into the events table's folder (:mod:`pipelines.bronze.writer`)
        and the driver commits all of them as run ``version``, unless an earlier attempt of
        the run committed (then nothing is decoded, as when Spark's idempotent append
        skips)."""
        spark, table = self.spark, self.names.events
        if _at_least(delta_io.committed_version(spark, table, store.TXN_APP_ID), version):
            return
        location, properties = delta_io.location_and_properties(spark, table)
        stats = properties.get(
            store.STATS_COLUMNS_PROPERTY, store.EVENTS_STATS[store.STATS_COLUMNS_PROPERTY]
        )
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
        if on_driver:
            written = tasks.in_driver(file_rows, task)
        else:
            written = tasks.relay_landing_changes(
                lambda: [
                    r.asDict()
                    for r in tasks.files_frame(spark, file_rows, chunk)
                    .mapInArrow(task, schemas.WRITTEN)
                    .collect()
                ]
            )
        self.hook("written")
        committed = file_commits.commit_files(
            spark, table, written, app_id=store.TXN_APP_ID, version=version
        )
        if committed and self.memory is not None:
            paths = [f"{location.rstrip('/')}/{r['path']}" for r in written]
            self.memory.committed_files(spark, table, run_id, paths)

    def quarantine(
        self, files: list[CaptureFile], version: int, run_id: str, digests: dict[str, str]
    ) -> dict[str, tuple[int, int]]:
        """Decode ``files`` again for their malformed frames only; append those to the
        quarantine table as run ``version`` and return every file's ``(frames, errors)``."""
        if not files:
            return {}
        spark, chunk = self.spark, self.config.ingest.chunk_bytes
        counts = tasks.by_file(spark)
        errors = (
            tasks.files_frame(spark, [tasks.file_row(f) for f in files], chunk)
            .mapInArrow(
                tasks.decoder(self.config, schemas.DECODE_OUTPUT, digests, counts, frames=False),
                schemas.DECODE_OUTPUT,
            )
            .persist(StorageLevel.MEMORY_AND_DISK)  # only malformed frames: small
        )
        try:
            # every file decoded once, so every file counted
            if tasks.relay_landing_changes(errors.count):
                delta_io.append_once(
                    transforms.quarantine(errors, run_id, F.current_timestamp()),
                    self.names.quarantine,
                    app_id=store.TXN_APP_ID,
                    version=version,
                )
        finally:
            errors.unpersist()
        return dict(counts.value)

    def log(self, rows: list[dict[str, Any]], version: int, status: str) -> None:
        """:func:`store.log_rows` to the ingest log, told to the memory when there is one."""
        logged = store.log_rows(self.spark, self.names.ingest_log, rows, version, status)
        if self.memory is not None:
            self.memory.logged(self.spark, self.names.ingest_log, logged)

    def close(self, version: int, rows: list[dict[str, Any]]) -> None:
        """Log the plan's closing rows, in one commit, and count what was ingested."""
        self.log(rows, version, "ingested")
        done = [r for r in rows if r.get("status", "ingested") == "ingested"]
        self.summary.files = len(done)
        self.summary.frames = sum(r["frames"] or 0 for r in done)
        self.summary.errors = sum(r["errors"] or 0 for r in done)


def _at_least(committed: int | None, version: int) -> bool:
    return committed is not None and committed >= version


# --- entry point -------------------------------------------------------------------------


def run(
    config: AppConfig,
    bucket: str | None = None,
    *,
    spark: SparkSession | None = None,
    config_file: object = None,
    memories: Mapping[str, IngestMemory] | None = None,
) -> list[IngestSummary]:
    """Ingest every configured bucket (or one); builds the Spark session if none is given.
    ``config_file``: where ``config`` was read from, named by configuration errors.
    ``memories``: bucket -> the :class:`IngestMemory` each run keeps what it wrote in (an
    apply in the same process then finds the run and its files without reading them). Each
    bucket's run pushes its metrics when ``[pushgateway] url`` is set."""
    buckets = config.bucket(bucket)  # a wrong name fails before Spark starts
    check_landing(config, buckets, config_file)  # so does a landing that is not there
    session = spark or session_for(config, "dcp-cdc-bronze", jvm_conf=ingest_jvm_conf(config))
    summaries = []
    for b in buckets:
        with log_context(bucket=b.name), pushed(config.pushgateway, "ingest", b.name) as report:
            summary = ingest_bucket(session, config, b, memory=(memories or {}).get(b.name))
            report(
                RunMetrics(
                    steps={"ingest": summary.seconds}, frames=summary.frames, files=summary.files
                )
            )
            summaries.append(summary)
    return summaries


# ``python -m pipelines.bronze.job`` and ``spark-submit pipelines/bronze/job.py``: the ``ingest`` verb of the command line
# (imported here only, so that the job module does not import the command line).
if __name__ == "__main__":
    from pipelines.app.cli import job_main

    raise SystemExit(job_main("ingest"))
