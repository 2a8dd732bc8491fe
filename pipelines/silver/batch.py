"""What an apply writes, as its walk found it: the control rows the walk's job collected and
what they say (:class:`Found`), and the batch of walked changes and versions the apply's
steps write (:class:`Batch`), over the walk's rows (:mod:`pipelines.silver.job`)."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipelines.silver import walk_staged, walk_summary
from pipelines.silver.registry import Registry
from pipelines.silver.walk import VERSION_KINDS, RowKind

MERGE_OVERLAP = 3
SMALL_BATCH_FRAMES = 200_000
"""A run of at most this many frames MERGEs up to :data:`MERGE_OVERLAP` collections at once
(their fixed costs overlap); a larger one MERGEs one at a time (memory, and its tasks keep
every core busy already)."""


@dataclass
class Found:
    """The rows the walk's job collected (:func:`_walk`), read once: the control rows and what
    they say, and what their ``state`` rows sum up of the versions (the collections changed,
    the CAS times of the changes: :mod:`pipelines.silver.walk_summary`)."""

    controls: list[dict[str, Any]]
    """The rows that are not versions of documents nor the CAS times: the ``state`` rows, the
    rollbacks and the system events (what :mod:`pipelines.silver.registry` and
    :mod:`pipelines.silver.store` read)."""
    states: dict[int, dict[str, Any]]
    """vbucket -> the state to save (its ``state`` row); empty when nothing was walked."""
    frames: int
    """Frames walked, over every vbucket."""
    ignored: int
    """Changes to collections already dropped, over every vbucket."""
    rollbacks: list[tuple[int, int]]
    """(vbucket, rollback seqno) of each rollback."""
    keys: dict[int, int]
    """collection id -> the keys of its committed changes (one ``change`` row each)."""
    version_cids: set[int]
    """The collections with versions of documents (changes, or changes a drop or flush ended)."""
    times: dict[str, Any]
    """The CAS times of the committed changes (:attr:`walk_summary.Collected.times`)."""

    @classmethod
    def of(cls, found: list[dict[str, Any]]) -> Found:
        """``found``, the rows :func:`_walk` collected, read by their kind (:class:`RowKind`)."""
        controls = [r for r in found if r["kind"] not in VERSION_KINDS]
        state_rows = [r for r in controls if r["kind"] == RowKind.STATE]
        summed = walk_summary.collected(state_rows)
        return cls(
            controls=controls,
            states={r["vbucket"]: json.loads(r["state"]) for r in state_rows},
            frames=sum(r["frames"] or 0 for r in state_rows),
            ignored=sum(r["ignored"] or 0 for r in state_rows),
            rollbacks=[
                (r["vbucket"], r["rollback_seqno"])
                for r in controls
                if r["kind"] == RowKind.ROLLBACK
            ],
            keys=summed.keys,
            version_cids=summed.version_cids,
            times=summed.times,
        )

    @property
    def change_cids(self) -> set[int]:
        """The collections with committed changes (a new set)."""
        return set(self.keys)


@dataclass
class Batch:
    """What a run writes: the walk's collected rows (``found``), the registry they updated,
    and the walked ``changes`` to apply and ``versions`` for history tables (ended changes
    too), DataFrames over the walk (made when first used), with the collections each
    touches."""

    found: Found
    registry: Registry
    walked: Callable[[], DataFrame]
    keep: list[int] | None
    """The collections of a run of one collection (None: every collection)."""
    change_cids: set[int]
    version_cids: set[int]
    table: pa.Table | None = None
    """The walked rows as the driver's walk gave them (an Arrow table), when it did and the
    batch is of every collection; None: ``changes`` alone has them."""
    staged: walk_staged.StagedWalk | None = None
    """The driver's walk in chunks (:mod:`pipelines.silver.walk_staged`), its silver rows
    ready to write, when it walked the batch and the batch is of every collection."""

    @classmethod
    def of(
        cls,
        found: Found,
        registry: Registry,
        walked: Callable[[], DataFrame],
        collection: str | None,
        table: pa.Table | None = None,
        staged: walk_staged.StagedWalk | None = None,
    ) -> Batch:
        """The batch of ``walked`` (``table``: the same rows in Arrow, when the driver walked
        them); with ``collection`` (``SCOPE.NAME``), of that collection alone."""
        change_cids, version_cids = found.change_cids, set(found.version_cids)
        keep = None
        if collection is not None:
            scope, _, coll = collection.partition(".")
            keep = [
                c["collection_id"] for c in registry if c["scope"] == scope and c["name"] == coll
            ]
            change_cids &= set(keep)
            version_cids &= set(keep)
            table = staged = None
        return cls(found, registry, walked, keep, change_cids, version_cids, table, staged)

    @functools.cached_property
    def changes(self) -> DataFrame:
        changes = self.walked().where(F.col("kind") == RowKind.CHANGE.value)
        return (
            changes if self.keep is None else changes.where(F.col("collection_id").isin(self.keep))
        )

    @functools.cached_property
    def versions(self) -> DataFrame:
        versions = self.walked().where(F.col("kind").isin(*VERSION_KINDS))
        return (
            versions
            if self.keep is None
            else versions.where(F.col("collection_id").isin(self.keep))
        )

    @property
    def overlap(self) -> int:
        """How many collections MERGE at once (:data:`SMALL_BATCH_FRAMES`)."""
        return MERGE_OVERLAP if self.found.frames <= SMALL_BATCH_FRAMES else 1
