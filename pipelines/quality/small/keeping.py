"""The state a columnar check over everything keeps for the next (:mod:`.carried`), gathered
a share of the vbuckets at a time beside the metric frames (:mod:`.columnar`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession

from pipelines.bronze import store
from pipelines.lake import delta_io
from pipelines.quality.measures import CHECKSUM_MODULUS
from pipelines.quality.small import measures
from pipelines.quality.small.carried import Cut, State, Sums, apart
from pipelines.quality.small.cuts import carry_streams
from pipelines.quality.small.item_history import History
from pipelines.quality.small.item_snapshots import Streams
from pipelines.quality.small.items import Bronze
from pipelines.quality.small.live_sums import BRONZE_TTL, SILVER_TTL, bronze_ttl, silver_ttl
from pipelines.quality.small.placement import Placed
from pipelines.tables import BucketTables

Row = dict[str, Any]


class Keeping:
    """The parts of the state the shares give, then the state (:meth:`state`)."""

    def __init__(self, now: int) -> None:
        self.now = now
        self.pairs: dict[tuple[str, int], Cut] = {}
        self.tails: list[pa.Table] = []
        self.parts: dict[tuple[Any, ...], Row] = {}
        self.duplicates: list[Row] = []
        self.data_max: dict[tuple[int, int | None], int] = {}
        self.branches: dict[Any, Any] = {}
        self.cuts: dict[Any, Any] = {}
        self.dead: set[tuple[Any, Any, Any]] = set()
        self.bronze_ttl: list[pa.Table] = [BRONZE_TTL.empty_table()]
        self.silver_ttl: list[pa.Table] = [SILVER_TTL.empty_table()]
        self.rolled: list[Row] = []

    def streams(
        self,
        events: pa.Table,
        bronze: Bronze,
        placed: Placed,
        snaps: Sequence[Row],
        groups: Streams,
        duplicates: Sequence[Row],
        past: History,
    ) -> None:
        """A share's cuts, tails, settled parts and history."""
        assert past.counted is not None
        carried = carry_streams(events, bronze, placed, snaps, groups, duplicates, past.counted)
        self.pairs.update(carried.pairs)
        self.tails.append(carried.tail)
        self.parts.update(carried.streams)
        self.duplicates += carried.duplicates
        self.data_max.update(carried.data_max)
        self.branches.update(past.branches)
        self.cuts.update(past.cuts)
        self.dead |= past.dead_changes
        self.bronze_ttl.append(bronze_ttl(past.live))

    def silver(self, rows: pa.Table, maybe_rolled: Sequence[Row], past: History) -> None:
        """A share's silver rows the state follows: the TTL list, and the rows of those that
        may be rolled back (:func:`.columnar._maybe_rolled`) that are."""
        self.silver_ttl.append(silver_ttl(rows, self.now))
        for r in maybe_rolled:
            out = measures.rolled_rows([r], past.branches, past.dead_changes)
            if out:
                self.rolled.append({"cid": r["_collection_id"], "key": r["key"], "row": out[0]})

    def state(
        self,
        spark: SparkSession,
        bucket: str,
        at: Mapping[str, int],
        control: pa.Table,
        files: Mapping[str, int],
        sums: Mapping[int, Any],
        metrics: Mapping[str, Any],
    ) -> State | None:
        """The state, or None when its history holds a cut of no vbucket (which the shares
        do not split)."""
        if any(v is None for _, v in self.cuts):
            return None
        names = BucketTables(bucket)
        txns = {
            kind: delta_io.committed_version_at(
                spark, getattr(names, kind), store.TXN_APP_ID, at.get(getattr(names, kind))
            )
            if getattr(names, kind) in at
            else None
            for kind in ("events", "quarantine")
        }
        tail = pa.concat_tables(self.tails) if self.tails else None
        if tail is None:
            return None
        return State(
            at=dict(at),
            txns=txns,
            now=self.now,
            apart=apart(metrics["silver_reconciliation"].rows),
            pairs=self.pairs,
            tail=tail,
            control=control,
            streams=self.parts,
            duplicates=self.duplicates,
            data_max=self.data_max,
            files=dict(files),
            branches=self.branches,
            cuts=self.cuts,
            dead_changes=self.dead,
            sums={
                cid: Sums(
                    got.bronze_live,
                    got.bronze_checksum % CHECKSUM_MODULUS,
                    got.silver_live,
                    got.silver_checksum % CHECKSUM_MODULUS,
                    dict(got.tables),
                )
                for cid, got in sums.items()
            },
            rolled=self.rolled,
            dropped=[r for got in sums.values() for r in got.dropped],
            bronze_ttl=pa.concat_tables(self.bronze_ttl),
            silver_ttl=pa.concat_tables(self.silver_ttl),
        )
