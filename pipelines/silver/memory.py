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
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import SparkSession

from pipelines.lake.delta_io import table_version

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
