"""What follow mode remembers of a bucket's ingest log between micro-batches
(:class:`IngestMemory`), so that a micro-batch with nothing new runs no Spark job.

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


@dataclass
class IngestMemory:
    """One bucket's ingest log, as the follow process that ingests it last read or wrote it."""

    version: int | None = None
    """The log's Delta version :attr:`rows` are of; None: nothing kept."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    _state: LogState | None = None

    def forget(self) -> None:
        self.version, self.rows, self._state = None, [], None

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
