"""What follow mode remembers of a bucket's silver between micro-batches (:class:`ApplyMemory`),
so that a micro-batch reads again only what another writer changed.

A batch run (``dcp-cdc apply``, the Airflow task) reads the stream state and the registry
from their tables and checks every collection table in the catalog, each run. The follow
process applies the same bucket every few seconds and wrote those tables itself the batch
before: it keeps what it wrote, with the Delta version its commit made, and uses it while the
table is still at that version (a look at the table's log, no Spark job). Another writer's
commit (a hand-run ``dcp-cdc apply``, a backfill, a second follow process by mistake) moves
the version, and the next micro-batch reads the table again. A micro-batch that fails forgets
everything (:meth:`ApplyMemory.forget`): the next one starts as a batch run does.

An apply reads and saves those tables through :class:`Recall`, with the memory or without
(a batch run), the same calls either way.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import SparkSession

from dcp_cdc.config import AppConfig
from pipelines import schemas
from pipelines.bronze import store
from pipelines.bronze.memory import IngestMemory
from pipelines.lake import delta_rs
from pipelines.lake.delta_io import table_version
from pipelines.silver import state
from pipelines.silver.registry import Registry, collection_properties, update_registry
from pipelines.tables import BucketTables

States = dict[int, dict[str, Any]]
"""vbucket -> ``{"state": ..., "position_run_id": ...}``, as ``state.read_states`` gives."""


@dataclass
class Kept:
    """A table's rows as this process last wrote or read them, at the table's version then."""

    version: int
    rows: Any


@dataclass
class ApplyMemory:
    """One bucket's silver, as the follow process that applies it last left it."""

    support_ready: bool = False
    """The bucket's support tables exist and bronze's events table does (made or seen)."""
    states: Kept | None = None
    registry: Kept | None = None
    ensured: set[str] = field(default_factory=set)
    """Collection tables (their views' names) made or checked since the registry was read."""
    ingest: IngestMemory | None = None
    """The bucket's ingest log as the same process's ingest keeps it: the runs to walk are
    found in its rows (no Spark job) while the log is at their version."""

    def forget(self) -> None:
        self.support_ready = False
        self.states = self.registry = None
        self.ensured.clear()

    @staticmethod
    def kept(spark: SparkSession, table: str, kept: Kept | None) -> tuple[int, Any | None]:
        """``table``'s version now, and a deep copy of ``kept``'s rows if they are of that
        version (else None: read the table, and keep what is read as of that version at
        most, so that a commit in between makes the next look read again)."""
        version = table_version(spark, table)
        if kept is None or kept.version != version:
            return version, None
        return version, copy.deepcopy(kept.rows)

    @staticmethod
    def after_write(spark: SparkSession, table: str, before: int, rows: Any) -> Kept | None:
        """``rows`` as the table holds them after this process's one commit to it, which
        began at version ``before``; None when the table moved on by more than that commit
        (another writer's too: what it holds is unknown)."""
        now = table_version(spark, table)
        return Kept(now, copy.deepcopy(rows)) if now == before + 1 else None


def states_as_read(saved: dict[int, dict[str, Any]]) -> States:
    """What ``state.read_states`` would read back after ``state.save_states`` wrote these
    states (vbucket -> state with its ``run_id``): each state through JSON, as its column
    stores it (integer keys become strings, tuples lists)."""
    return {
        vb: {"state": json.loads(json.dumps(s)), "position_run_id": s.get("run_id")}
        for vb, s in saved.items()
    }


class Recall:
    """An apply's reads and saves of the bucket's stream state and registry, and whether its
    support tables are ready: through ``memory`` (follow mode) where it keeps them at the
    tables' versions, else from the tables (a batch run, ``memory`` None: every read goes to
    the table, nothing is kept)."""

    def __init__(self, spark: SparkSession, names: BucketTables, memory: ApplyMemory | None):
        self.spark = spark
        self.names = names
        self.memory = memory

    @property
    def support_ready(self) -> bool:
        """Whether the memory says the support tables and bronze's events table exist."""
        return self.memory is not None and self.memory.support_ready

    def log_rows(self) -> list[dict[str, Any]] | None:
        """The ingest log's rows now: from the ingest's memory (read again only when another
        writer moved the log); without one (a batch run), read in the driver while the log is
        small (:func:`pipelines.lake.delta_rs.rows_if_small`); None for a larger one (the
        apply reads what it needs of it with Spark)."""
        if self.memory is None or self.memory.ingest is None:
            columns = schemas.INGEST_LOG.fieldNames()
            return delta_rs.rows_if_small(self.spark, self.names.ingest_log, columns)
        self.memory.ingest.state(self.spark, self.names.ingest_log)
        return self.memory.ingest.rows

    def run_files(self, versions: Mapping[str, int]) -> list[str] | None:
        """The events table's data files holding the frames of the ingest runs ``versions``
        (run id -> run version): as the ingest's memory keeps them
        (:meth:`IngestMemory.run_files`), else, without one (a batch run), as the table's
        latest commits added them (:func:`pipelines.bronze.store.run_files`). None when
        neither has them all (the apply reads the table)."""
        if self.memory is None or self.memory.ingest is None:
            return store.run_files(self.spark, self.names.events, versions)
        return self.memory.ingest.run_files(self.spark, self.names.events, sorted(versions))

    def mark_support_ready(self) -> None:
        if self.memory is not None:
            self.memory.support_ready = True

    def read_states(self) -> States:
        """The stream state (``state.read_states``), kept while the table is at its version."""
        spark, memory, table = self.spark, self.memory, self.names.stream_state
        states = None
        if memory is not None:
            version, states = memory.kept(spark, table, memory.states)
        if states is None:
            states = state.read_states(spark, table)
            if memory is not None:
                memory.states = Kept(version, copy.deepcopy(states))
        return states

    def save_states(
        self, states: States, new_states: dict[int, dict[str, Any]], mark: str | None
    ) -> None:
        """``state.save_states``, and what it wrote kept as of the version its commit made."""
        spark, memory, table = self.spark, self.memory, self.names.stream_state
        before = table_version(spark, table) if memory is not None else 0
        saved = state.save_states(spark, table, states, new_states, mark)
        if memory is not None:
            memory.states = memory.after_write(spark, table, before, states_as_read(saved))

    def update_registry(
        self,
        config: AppConfig,
        controls: list[dict[str, Any]],
        change_cids: set[int],
    ) -> Registry:
        """:func:`update_registry`, from the registry ``memory`` keeps while the table is at its
        version (its collection tables not checked again), and kept for the next run."""
        spark, memory = self.spark, self.memory
        table = self.names.registry
        before, kept = 0, None
        if memory is not None:
            before, kept = memory.kept(spark, table, memory.registry)
            if kept is None:
                memory.ensured.clear()  # read again: so are the tables checked
        registry, saved = update_registry(
            spark,
            self.names.bucket,
            controls,
            collection_properties(config),
            change_cids,
            document_variant=config.silver.document_variant,
            stored=kept,
            live=config.silver.live_layer,
            ensured=memory.ensured if memory is not None else None,
        )
        if memory is not None:
            memory.registry = (
                memory.after_write(spark, table, before, registry)
                if saved
                else Kept(before, copy.deepcopy(registry))
            )
        return registry

    def tables_moved(self) -> None:
        """Collection tables were renamed or dropped: the registry and the tables are read and
        checked again."""
        if self.memory is not None:
            self.memory.registry = None
            self.memory.ensured.clear()
