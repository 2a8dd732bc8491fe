"""Configuration: pydantic models (frozen, ``extra="forbid"``) and the one loader.

A file in ``conf/`` is TOML. Relative paths in it are relative to the working directory the
job starts in (``make run`` starts in the repository). A wrong or missing setting fails with
:class:`ConfigError` naming the file and the field, before any Spark session starts.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from dcp_cdc.errors import ConfigError

_URI = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


def is_uri(location: str) -> bool:
    """True for ``scheme://...`` locations; plain paths are local."""
    return bool(_URI.match(location))


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BucketConfig(_Model):
    """One Couchbase bucket whose captures land in the landing location."""

    name: Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.%-]+$")]
    landing: str | None = None
    """Where this bucket's captures land; default: the global landing location."""


class IngestConfig(_Model):
    chunk_bytes: Annotated[int, Field(ge=1 << 16, le=1 << 30)] = 64 << 20
    """Bytes of a capture file decoded at once inside a task (bounds executor memory)."""
    max_file_bytes: Annotated[int, Field(ge=1 << 10)] = 64 << 30
    """Capture files larger than this are reported and left alone."""
    quarantine_raw_bytes: Annotated[int, Field(ge=0, le=1 << 20)] = 4096
    """Raw bytes kept per quarantined record."""
    max_files_per_run: Annotated[int, Field(ge=0)] = 0
    """0 = every new file."""


class TableConfig(_Model):
    properties: dict[str, str] = Field(
        default_factory=lambda: {
            "delta.enableDeletionVectors": "true",
            "delta.autoOptimize.optimizeWrite": "true",
        }
    )
    """Delta table properties set when a table is created."""


class SilverConfig(_Model):
    retire: Literal["archive", "drop"] = "archive"
    """What happens to a collection's table once its drop reached every vbucket: ``archive``
    renames it ``<table>__dropped_<cid>_<yyyymmdd>``, ``drop`` removes it."""


Severity = Literal["error", "warn"]
_EXPECTATION_KEY = re.compile(r"^[a-z][a-z_]*(\.[a-z][a-z_]*)?$")


class QualityConfig(_Model):
    """The data-quality suites (``dcp-cdc check``, ``pipelines/quality``)."""

    quarantine_threshold: Annotated[int, Field(ge=0)] = 0
    """Malformed frames (quarantine records other than a session's cut tail) a bucket may
    hold before ``bronze_integrity.quarantine_within_threshold`` fails."""
    severity: dict[str, Severity] = Field(default_factory=dict)
    """Severity overrides: ``"suite.expectation"`` or a whole ``"suite"`` → ``error`` (fails
    the run) or ``warn`` (reported only). Names are checked against the suites at run time."""
    max_examples: Annotated[int, Field(ge=1, le=1000)] = 20
    """Failing rows kept per expectation in the results table and the report."""
    results_retention_days: Annotated[int, Field(ge=1)] = 90
    """How long rows of ``quality.<bucket>_results`` are kept (pruned by the maintenance DAG)."""

    @field_validator("severity")
    @classmethod
    def _expectation_keys(cls, value: dict[str, str]) -> dict[str, str]:
        bad = [k for k in value if not _EXPECTATION_KEY.match(k)]
        if bad:
            raise ValueError(f"keys must look like 'suite' or 'suite.expectation', got {bad}")
        return value


class SparkConfig(_Model):
    master: str = "local[2]"
    shuffle_partitions: Annotated[int, Field(ge=1)] = 4
    conf: dict[str, str] = Field(default_factory=dict)


class AppConfig(_Model):
    """The whole configuration of a dcp-cdc deployment."""

    landing: str
    warehouse: str
    buckets: Annotated[list[BucketConfig], Field(min_length=1)]
    ingest: IngestConfig = IngestConfig()
    tables: TableConfig = TableConfig()
    silver: SilverConfig = SilverConfig()
    quality: QualityConfig = QualityConfig()
    spark: SparkConfig = SparkConfig()
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @field_validator("landing", "warehouse")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value

    def bucket(self, name: str | None) -> list[BucketConfig]:
        """The buckets a command works on: all of them, or the one named."""
        if name is None:
            return list(self.buckets)
        for b in self.buckets:
            if b.name == name:
                return [b]
        known = ", ".join(b.name for b in self.buckets)
        raise ConfigError(f"bucket {name!r} is not configured (configured: {known})")

    def landing_for(self, bucket: BucketConfig) -> str:
        return bucket.landing or self.landing


def load_config(path: str | Path, **overrides: object) -> AppConfig:
    """Read and validate ``path``; ``overrides`` replace top-level keys (e.g. for tests)."""
    file = Path(path)
    try:
        raw = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{file}: configuration file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    raw.update(overrides)
    try:
        return AppConfig.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}"
            for err in exc.errors()
        )
        raise ConfigError(f"{file}: invalid configuration: {problems}") from None
