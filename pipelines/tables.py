"""Every table and view name of dcp-cdc, and where a bucket's quality reports go.

One database per layer (:data:`LAYERS`); a bucket's names start with its SQL identifier
(:func:`dcp_cdc.naming.identifier`). Jobs, maintenance, the catalog overview and the command
line ask here; nothing else builds a table name.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dcp_cdc.config import AppConfig, is_uri
from dcp_cdc.naming import identifier

LAYERS = ("bronze", "silver", "quality")
"""The databases, one per layer, in pipeline order."""

ALL_SUFFIX = "_all"


def all_rows(view: str) -> str:
    """The Delta table behind a collection's view of live documents: every row, tombstones
    and expired documents included."""
    return f"{view}{ALL_SUFFIX}"


def view_of(table: str) -> str:
    """The user-facing view of a collection's ``_all`` table."""
    return table.removesuffix(ALL_SUFFIX)


TYPED_SUFFIX = "__typed"


def typed(view: str) -> str:
    """The typed view of a collection (``[[buckets.projections]]``) whose view is ``view``."""
    return f"{view}{TYPED_SUFFIX}"


HISTORY_SUFFIX = "__history"


def history(view: str) -> str:
    """The history table (SCD type 2, ``[[buckets]] history``) of the collection whose view
    is ``view``."""
    return f"{view}{HISTORY_SUFFIX}"


def archived(view: str, collection_id: int, day: str) -> str:
    """Where a retired collection's ``_all`` table goes when ``silver.retire = "archive"``."""
    return f"{view}__dropped_{collection_id:x}_{day}"


def database(table: str) -> str:
    """The database (layer) a table name is in."""
    return table.partition(".")[0]


@dataclass(frozen=True, slots=True)
class BucketTables:
    """The names of one bucket's tables and views, across the three layers."""

    bucket: str

    @property
    def _id(self) -> str:
        return identifier(self.bucket)

    # --- bronze ---------------------------------------------------------------------------

    @property
    def events(self) -> str:
        return f"bronze.{self._id}_events"

    @property
    def quarantine(self) -> str:
        return f"bronze.{self._id}_quarantine"

    @property
    def ingest_log(self) -> str:
        return f"bronze.{self._id}_ingest_log"

    @property
    def bronze(self) -> dict[str, str]:
        """The bronze tables by kind (``events``, ``quarantine``, ``ingest_log``)."""
        return {
            "events": self.events,
            "quarantine": self.quarantine,
            "ingest_log": self.ingest_log,
        }

    # --- silver ---------------------------------------------------------------------------

    @property
    def _silver(self) -> str:
        return f"silver.{self._id}"

    def holds(self, table: str) -> bool:
        """Whether ``table`` (``layer.name``, lower case) is one of the bucket's silver
        tables or views."""
        return table.startswith(f"{self._silver}__")

    @property
    def registry(self) -> str:
        """The collection registry (``pipelines.schemas.REGISTRY``)."""
        return f"{self._silver}__collections"

    @property
    def stream_state(self) -> str:
        """Where silver stands per vbucket (``pipelines.schemas.STATE``)."""
        return f"{self._silver}__stream_state"

    @property
    def purges(self) -> str:
        """The tombstone-purge marks (``pipelines.schemas.PURGES``)."""
        return f"{self._silver}__tombstone_purges"

    @property
    def pending(self) -> str:
        """The live layer: changes applied but not yet compacted into the collection tables
        (``pipelines.schemas.PENDING``)."""
        return f"{self._silver}__pending"

    @property
    def silver_support(self) -> tuple[str, str, str]:
        """The registry, stream state and purge marks."""
        return self.registry, self.stream_state, self.purges

    def collection(self, scope: str, name: str) -> str:
        """The name users query (a view of live documents); :meth:`collection_all` holds
        tombstones too."""
        return f"{self._silver}__{identifier(scope)}__{identifier(name)}"

    def collection_all(self, scope: str, name: str) -> str:
        return all_rows(self.collection(scope, name))

    # --- quality --------------------------------------------------------------------------

    @property
    def results(self) -> str:
        """One row per expectation and run (``pipelines.schemas.QUALITY_RESULTS``)."""
        return f"quality.{self._id}_results"

    @property
    def check_state(self) -> str:
        """What the last check carries to the next (``pipelines.schemas.CHECK_STATE``)."""
        return f"quality.{self._id}_check_state"

    @property
    def check_columns(self) -> str:
        """What the last columnar check carries to the next (``schemas.CHECK_COLUMNS``)."""
        return f"quality.{self._id}_check_columns"


def report_location(config: AppConfig, bucket: str) -> str:
    """Where a bucket's quality summary and Data Docs go: ``<warehouse>/quality/<identifier>``."""
    if is_uri(config.warehouse):
        return f"{config.warehouse.rstrip('/')}/quality/{identifier(bucket)}"
    return str(Path(config.warehouse).expanduser().resolve() / "quality" / identifier(bucket))


SUMMARY_NAME = "summary.html"
"""The one-page summary of a bucket's last quality check, in its :func:`report_location`."""


def report_page(config: AppConfig, bucket: str) -> str:
    """Where the summary page of a bucket's last quality check is."""
    return f"{report_location(config, bucket)}/{SUMMARY_NAME}"


LIVE_ROWS = "NOT _deleted AND (_expiry = 0 OR _expiry > unix_timestamp())"
"""The rows of a collection's ``_all`` table its view shows: live documents, not expired."""


WITH_TABLES = ("live", "dropped")
"""The collection registry's statuses (``silver.<bucket>__collections.status``) whose tables
are in the catalog and may be written; ``retiring`` and ``retired`` ones are not."""


MADE_BY = {
    "bronze": ("ingested", "`dcp-cdc ingest`"),
    "silver": ("applied", "`dcp-cdc ingest` and `dcp-cdc apply`"),
    "quality": ("checked", "`dcp-cdc check`"),
}
"""Per layer: what a bucket has not been yet while the layer holds none of its tables, and
the commands that make them (the bucket's DAG runs the same jobs)."""


def name_owner(name: str, buckets: Sequence[str]) -> tuple[str, str] | None:
    """The bucket of ``buckets`` and the layer among whose names ``name`` (``layer.table``,
    lowercase) is, by its prefix (the bucket's identifier), else None."""
    layer, _, table = name.partition(".")
    if layer not in LAYERS:
        return None
    separator = "__" if layer == "silver" else "_"
    owners = [b for b in buckets if table.startswith(f"{identifier(b)}{separator}")]
    if not owners:
        return None
    return max(owners, key=lambda b: len(identifier(b))), layer


CLOSE = 0.85
"""How alike (:class:`difflib.SequenceMatcher`'s ratio) a name the catalog lacks and one it
holds must be to suggest it: a bucket's names share a long prefix, so a lower bar suggests
all of them."""


def missing_table(name: str, buckets: Sequence[str], existing: Sequence[str]) -> str:
    """Why the catalog, whose tables and views are ``existing``, has no ``name`` (``layer.table``,
    or a bare table name): a configured bucket's layer holds none of its tables yet (the
    command that makes them), or the name is wrong (the closest of ``existing``)."""
    owner = name_owner(name, buckets)
    if owner is not None and not any(name_owner(e, [owner[0]]) == owner for e in existing):
        bucket, layer = owner
        done, commands = MADE_BY[layer]
        return (
            f"{name} does not exist yet: bucket {bucket!r} has not been {done} yet ({layer} "
            f"holds none of its tables): run {commands} first, or let its DAG run"
        )
    if "." in name:
        close = difflib.get_close_matches(name, existing, n=3, cutoff=CLOSE)
    else:  # a bare name is looked up in Spark's current database, not in a layer's
        by_table = {e.partition(".")[2]: e for e in existing}
        close = [
            by_table[t] for t in difflib.get_close_matches(name, list(by_table), n=3, cutoff=CLOSE)
        ]
    guess = f"; did you mean {' or '.join(close)}?" if close else ""
    return (
        f"{name}: no such table or view in the catalog{guess} (`dcp-cdc tables` lists the "
        f"{len(existing)} there are)"
    )


def missing_database(name: str) -> str:
    """Why the catalog has no database ``name``: a layer no bucket has reached yet, or a name
    that is none of :data:`LAYERS`."""
    if name in LAYERS:
        done, commands = MADE_BY[name]
        return (
            f"database {name} does not exist yet: no bucket has been {done} yet: run "
            f"{commands} first, or let a bucket's DAG run"
        )
    return f"database {name} does not exist: dcp-cdc's databases are {', '.join(LAYERS)}"
