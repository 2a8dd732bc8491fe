"""A bucket's settings (``[[buckets]]``): its landing, its capture section, the typed views
of its collections (``[[buckets.projections]]``) and which keep a history table."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from dcp_cdc.config.base import ConfigModel
from dcp_cdc.config.capture import COLLECTION_PATTERN, CaptureConfig

PROJECTION_TYPES = re.compile(
    r"string|boolean|int|bigint|float|double|date|timestamp|decimal\((\d{1,2}),\s*(\d{1,2})\)"
)
"""The Spark SQL types a projected column may have."""


class ProjectionColumn(ConfigModel):
    """One typed column of a projection: a document path and the type to read it as."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
    """The column's name in the view (a plain SQL identifier)."""
    path: Annotated[str, Field(pattern=r"^\$(\.[A-Za-z_][A-Za-z0-9_]*|\[[0-9]{1,9}\])+$")]
    """Where in the document: ``$.a.b``, ``$.items[0].sku`` (object keys of letters, digits and
    ``_``)."""
    type: str = "string"
    """Its Spark SQL type: ``string``, ``boolean``, ``int``, ``bigint``, ``float``,
    ``double``, ``date``, ``timestamp`` or ``decimal(p, s)``. A value that is missing or does
    not convert reads as null; a string converts to a date or timestamp it spells (ISO 8601),
    and a number with more decimals than ``s`` is rounded."""

    @field_validator("type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        kind = value.strip().lower()
        found = PROJECTION_TYPES.fullmatch(kind)
        if found is None:
            raise ValueError(
                f"{value!r} is not a projection type: string, boolean, int, bigint, float, "
                "double, date, timestamp or decimal(p, s)"
            )
        if found.group(1) is not None:
            precision, scale = int(found.group(1)), int(found.group(2))
            if not (1 <= precision <= 38 and scale <= precision):
                raise ValueError(f"{value!r}: decimal(p, s) needs 1 <= p <= 38 and s <= p")
        return kind.replace(" ", "")


PROJECTION_RESERVED = frozenset({"key", "_modified_at", "_seqno", "_vbucket"})
"""Columns every projection view has besides the declared ones."""


class ProjectionConfig(ConfigModel):
    """A typed view of one collection's live documents (``[[buckets.projections]]``):
    ``silver.<bucket>__<scope>__<collection>__typed`` with ``key``, one column per entry of
    ``columns`` and ``_modified_at``, ``_seqno``, ``_vbucket``, for tools that want ordinary
    columns. Each document is parsed once per row (as a VARIANT) whatever the number of
    columns."""

    collection: Annotated[str, Field(pattern=COLLECTION_PATTERN)]
    """``scope.collection`` as Couchbase names them (``inventory.airline``)."""
    columns: Annotated[list[ProjectionColumn], Field(min_length=1)]
    """The typed columns, in view order: ``{ name = "city", path = "$.address.city" }``."""

    @model_validator(mode="after")
    def _distinct_names(self) -> ProjectionConfig:
        seen: set[str] = set()
        for column in self.columns:
            folded = column.name.lower()  # Spark resolves names without case
            if folded in PROJECTION_RESERVED:
                raise ValueError(
                    f"column {column.name!r} of {self.collection}: the view has it already "
                    f"({', '.join(sorted(PROJECTION_RESERVED))})"
                )
            if folded in seen:
                raise ValueError(f"column {column.name!r} of {self.collection} is declared twice")
            seen.add(folded)
        return self

    @property
    def scope_and_name(self) -> tuple[str, str]:
        scope, _, name = self.collection.partition(".")
        return scope, name


class BucketConfig(ConfigModel):
    """One Couchbase bucket whose captures land in the landing location."""

    name: Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.%-]+$")]
    """The bucket's name; the capture headers' ``bucket`` must match it."""
    landing: str | None = None
    """Where this bucket's captures land; default: the global landing location."""
    capture: CaptureConfig | None = None
    """The capture agent that records this bucket from a Couchbase cluster: the
    ``[buckets.capture]`` table below. Default: none (captures arrive some other way)."""
    projections: list[ProjectionConfig] = Field(default_factory=list)
    """Typed views of collections (``[[buckets.projections]]`` below); default none."""
    history: bool | list[Annotated[str, Field(pattern=COLLECTION_PATTERN)]] = False
    """History tables (SCD type 2: every version of every document,
    ``silver.<bucket>__<scope>__<collection>__history``): ``true`` for every collection, or
    the ``scope.collection`` names that keep one (``["inventory.airline"]``). Each costs its
    apply a MERGE per run (the versions of the keys the run changed). Default: none."""

    def keeps_history(self, scope: str, name: str) -> bool:
        """Whether the collection ``scope.name`` has a history table."""
        if isinstance(self.history, bool):
            return self.history
        return f"{scope}.{name}" in self.history

    @model_validator(mode="after")
    def _one_projection_per_collection(self) -> BucketConfig:
        named = [p.collection for p in self.projections]
        twice = sorted({c for c in named if named.count(c) > 1})
        if twice:
            raise ValueError(f"more than one projection of {', '.join(twice)}")
        return self
