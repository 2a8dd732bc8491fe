"""What follow mode remembers of a bucket's ingest log between micro-batches
(:class:`IngestMemory`), so that a micro-batch with nothing new runs no Spark job.

It also keeps the data files each of its runs committed to the events table
(:meth:`IngestMemory.run_files`), while no other writer committed to that table since: the
apply reads a run's frames from those files (a Parquet read of the files just written), not
through a scan of the Delta table (jobs that filter its files).

A batch run (``dcp-cdc ingest``, the Airflow task) reads the ingest log each run: a Spark job.
The follow process ingests the same bucket every few seconds and wrote the log's latest commits
itself: it keeps the log's rows as of the Delta version its own commit made, and uses them while
the log is still at that version (a look at the log's Delta log, no Spark job). Another writer's
commit (a hand-run ``dcp-cdc ingest``, ``dcp-cdc landing skip``) moves the version, and the next
micro-batch reads the log again. A micro-batch that fails forgets it
(:meth:`IngestMemory.forget`): the next one reads the log as a batch run does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import SparkSession

from pipelines.bronze import store
from pipelines.bronze.plan import LogState
from pipelines.lake.delta_io import table_version

KEPT_RUNS = 256
"""Runs whose files :class:`IngestMemory` keeps at most: an apply reads older runs only while
a vbucket's open snapshot holds its read back that long, and then reads the table."""


@dataclass
class IngestMemory:
    """One bucket's ingest log, as the follow process that ingests it last read or wrote it."""

    version: int | None = None
    """The log's Delta version :attr:`rows` are of; None: nothing kept."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    _state: LogState | None = None
    events_version: int | None = None
    """The events table's Delta version after this process's last commit of a run's files;
    None: no files kept."""
    files: dict[str, list[str]] = field(default_factory=dict)
    """ingest run id -> the data files (full paths) its commit added to the events table, for
    this process's runs committed one after the other with no other commit between (the
    newest :data:`KEPT_RUNS`)."""

    def forget(self) -> None:
        self.version, self.rows, self._state = None, [], None
        self.events_version, self.files = None, {}

    def committed_files(
        self, spark: SparkSession, table: str, run_id: str, paths: list[str]
    ) -> None:
        """Run ``run_id``'s one commit added ``paths`` to the events table ``table``: kept
        with the files kept when that commit is the only one since them, else they are
        forgotten (another writer's commit came between: an OPTIMIZE may have moved them)."""
        now = table_version(spark, table)
        if self.events_version is None or now != self.events_version + 1:
            self.files = {}
        self.files[run_id] = list(paths)
        for old in list(self.files)[:-KEPT_RUNS]:
            del self.files[old]
        self.events_version = now

    def run_files(self, spark: SparkSession, table: str, run_ids: list[str]) -> list[str] | None:
        """The data files of the events table that hold the frames of ``run_ids``, when every
        one of them is kept and the table is still at the version of the last (no commit
        since); None otherwise (read the table)."""
        if self.events_version is None or any(r not in self.files for r in run_ids):
            return None
        if table_version(spark, table) != self.events_version:
            self.events_version, self.files = None, {}
            return None
        return [path for r in run_ids for path in self.files[r]]

    def state(self, spark: SparkSession, table: str) -> LogState:
        """The log's state now: from the rows kept when the log is at their version, else
        read (a Spark job) at the version it is at, and kept."""
        version = table_version(spark, table)
        if self.version != version:
            self.forget()
            self.rows = store.read_log_rows(spark, table, version)
            self.version = version
        if self._state is None:
            self._state = LogState.of(self.rows)
        return self._state

    def logged(self, spark: SparkSession, table: str, rows: list[dict[str, Any]]) -> None:
        """``rows`` were appended to the log by this process's one commit
        (:func:`pipelines.bronze.store.log_rows`): kept with it when that commit is the only
        one since the version kept, else everything is forgotten (another writer's commit
        came between: what the log holds is read again)."""
        now = table_version(spark, table)
        if self.version is None or now != self.version + 1:
            self.forget()
            return
        self.rows = [*self.rows, *rows]
        self.version, self._state = now, None
