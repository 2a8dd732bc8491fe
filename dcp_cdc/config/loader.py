"""The whole configuration (:class:`AppConfig`, the root every section hangs from) and its one
loader.

A file in ``conf/`` is TOML. Relative local paths in it (``landing``, ``warehouse``, a
bucket's ``landing``) are relative to the file's own folder, so a job finds the same data
whatever directory it starts in (an Airflow worker's is anyone's guess). A wrong or missing setting fails with
:class:`ConfigError` naming the file and the field, before any Spark session starts.

The sections are the package's other modules (:mod:`dcp_cdc.config` lists them); ``python -m
dcp_cdc.config --check FILE`` validates a file and prints it with every default.
"""

from __future__ import annotations

import os
import re
import sys
import tomllib
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from dcp_cdc.config.base import ConfigModel
from dcp_cdc.config.buckets import BucketConfig
from dcp_cdc.config.capture import (
    CAPTURE_DIR,
    WILDCARD_HOSTS,
    CaptureDirs,
    default_staging,
    is_object_store,
)
from dcp_cdc.config.jobs import (
    IngestConfig,
    MaintenanceConfig,
    QualityConfig,
    SilverConfig,
    TableConfig,
)
from dcp_cdc.config.running import AirflowConfig, FollowConfig, PushgatewayConfig
from dcp_cdc.config.spark import SparkConfig, ThriftConfig, metastore_address
from dcp_cdc.config.storage import StorageConfig, unsafe_log_store
from dcp_cdc.errors import ConfigError

_URI = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


def is_uri(location: str) -> bool:
    """True for ``scheme://...`` locations; plain paths are local."""
    return bool(_URI.match(location))


class AppConfig(ConfigModel):
    """The whole configuration of a dcp-cdc deployment."""

    landing: str
    """Where capture files land: a local path or any Hadoop URI (``s3a://...``)."""
    warehouse: str
    """The Spark warehouse: Delta tables and (when local) the Derby metastore."""
    buckets: Annotated[list[BucketConfig], Field(min_length=1)]
    """The buckets whose captures land there (at least one)."""
    ingest: IngestConfig = IngestConfig()
    tables: TableConfig = TableConfig()
    silver: SilverConfig = SilverConfig()
    quality: QualityConfig = QualityConfig()
    spark: SparkConfig = SparkConfig()
    airflow: AirflowConfig = AirflowConfig()
    maintenance: MaintenanceConfig = MaintenanceConfig()
    follow: FollowConfig = FollowConfig()
    pushgateway: PushgatewayConfig = PushgatewayConfig()
    thrift: ThriftConfig = ThriftConfig()
    storage: StorageConfig = StorageConfig()
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] | None = None
    """Log level. Unset: INFO for the jobs run by ``spark-submit`` or ``python -m`` and for
    ``dcp-cdc capture``, WARNING for the other verbs (which print their summaries on stdout).
    ``$DCP_CDC_LOG_LEVEL`` overrides it."""
    log_format: Literal["text", "json"] = "text"
    """How log lines are written on stderr: ``text`` (time, level, logger, message), or
    ``json``, one JSON object per line with ``bucket``, ``vbucket`` and ``run_id`` where they
    apply (docs/commands.md, "Logs"). Secrets are masked in both. ``$DCP_CDC_LOG_FORMAT``
    overrides it."""

    @field_validator("landing", "warehouse")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value

    @model_validator(mode="after")
    def _catalog_reachable(self) -> AppConfig:
        if (
            is_uri(self.warehouse)
            and not self.warehouse.startswith("file:")
            and not (self.spark.metastore or "spark.hadoop.hive.metastore.uris" in self.spark.conf)
        ):
            raise ValueError(
                f"warehouse {self.warehouse!r} is not a local path: set spark.metastore to a "
                "shared Hive metastore (thrift://host:9083) or to the Derby server `dcp-cdc "
                "metastore start` runs, with the local path of its database "
                "(derby://127.0.0.1:PORT/ABSOLUTE/PATH); the embedded Derby catalog only "
                "lives in a local warehouse"
            )
        metastore = self.spark.metastore
        if (
            metastore is not None
            and is_uri(self.warehouse)
            and not self.warehouse.startswith("file:")
            and metastore_address(metastore).scheme == "derby"
            and metastore_address(metastore).database is None
        ):
            raise ValueError(
                f"spark.metastore {metastore!r} names no database and warehouse "
                f"{self.warehouse!r} is not a local path to keep one in: add it to the address "
                "(derby://HOST:PORT/ABSOLUTE/PATH on the server's machine)"
            )
        return self

    @model_validator(mode="after")
    def _several_writers_on_s3(self) -> AppConfig:
        on_s3 = is_uri(self.warehouse) and self.warehouse.split(":", 1)[0] in ("s3a", "s3")
        problem = unsafe_log_store(on_s3, self.storage, self.spark.conf)
        if problem:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _capture_lands_locally(self) -> AppConfig:
        for index, bucket in enumerate(self.buckets):
            landing = self.landing_for(bucket)
            capture = bucket.capture
            if capture is None:
                continue
            local = not is_uri(landing) or landing.startswith("file:")
            if not local and not is_object_store(landing):
                raise ValueError(
                    f"buckets[{index}].capture: landing {landing!r} is neither a local path "
                    "nor s3:// (s3a://); the capture agent makes its files durable with fsync "
                    "and an atomic rename, or with an object store's atomic PUT"
                )
            if local and capture.staging_dir is not None:
                raise ValueError(
                    f"buckets[{index}].capture.staging_dir: only for an s3:// landing; a local "
                    "landing stages in its own .dcp-cdc-capture folder (the atomic rename needs "
                    "the same file system)"
                )
            state = capture.state_dir
            if state is not None and is_uri(state) and not is_object_store(state):
                raise ValueError(
                    f"buckets[{index}].capture.state_dir: {state!r} is neither a local path "
                    "nor s3:// (s3a://)"
                )
        return self

    @model_validator(mode="after")
    def _metrics_ports_apart(self) -> AppConfig:
        """Agents of several buckets, and follow mode itself, run on one host in follow mode:
        their metrics ports must not meet."""
        taken: dict[int, tuple[str, str]] = {}
        if self.follow.metrics_port is not None:
            taken[self.follow.metrics_port] = ("follow", self.follow.metrics_host)
        for index, bucket in enumerate(self.buckets):
            capture = bucket.capture
            if capture is None or capture.metrics_port is None:
                continue
            port, host = capture.metrics_port, capture.metrics_host
            if port in taken:
                other, other_host = taken[port]
                if host == other_host or WILDCARD_HOSTS.intersection((host, other_host)):
                    raise ValueError(
                        f"buckets[{index}].capture.metrics_port: {port} on {host} is "
                        f"{other}'s too; give each agent, and follow mode, its own port"
                    )
            taken.setdefault(port, (f"buckets[{index}]", host))
        return self

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

    def capture_dirs(self, bucket: BucketConfig) -> CaptureDirs:
        """The folders of ``bucket``'s capture agent: staging is ``<landing>/.dcp-cdc-capture``,
        the state folder ``capture.state_dir`` or the same. With an ``s3://`` landing, staging
        is ``capture.staging_dir`` (default: below the temporary folder) and the checkpoint
        is kept in the store, below ``<landing>/.dcp-cdc-capture``, unless ``state_dir``."""
        landing = self.landing_for(bucket)
        capture = bucket.capture
        state = capture.state_dir if capture is not None else None
        chosen: Path | str | None = None
        if state:
            chosen = state if is_object_store(state) else Path(state).expanduser()
        if is_object_store(landing):
            given = capture.staging_dir if capture is not None else None
            staging = Path(given).expanduser() if given else default_staging(landing)
            beside = f"{landing.rstrip('/')}/{CAPTURE_DIR}"
            return CaptureDirs(landing, staging, chosen if chosen is not None else beside)
        folder = Path(landing.removeprefix("file://").removeprefix("file:"))
        staging = folder / CAPTURE_DIR
        return CaptureDirs(folder, staging, chosen if chosen is not None else staging)


def _anchored(location: object, folder: Path) -> object:
    """A relative local path as seen from ``folder``; URIs, absolute paths and anything that
    is not a string (validation reports those) as they are."""
    if not isinstance(location, str) or not location.strip() or is_uri(location):
        return location
    path = Path(location).expanduser()
    return location if path.is_absolute() else os.path.normpath(folder / path)


CONFIG_ENV = "DCP_CDC_CONFIG"
LOCAL_CONFIG = Path("conf", "local.toml")
DEFAULT_WORKDIR = "work"
"""Where the built-in configuration keeps its data, relative to the working directory."""
DEMO_BUCKET = "travel-sample"

CONFIG_RULE = (
    "--config FILE, else $DCP_CDC_CONFIG, else ./conf/local.toml of the working directory, "
    "else the same settings built in (data under ./work/)"
)
"""How every verb of the command line finds its configuration, as its help says it."""


def find_config(*candidates: Path) -> Path | None:
    """The configuration file to use when none is named: ``$DCP_CDC_CONFIG``, else the first
    of ``candidates`` that is a file, else ``conf/local.toml`` of the working directory; None
    when there is none. The one rule of the command line and the DAGs."""
    chosen = os.environ.get(CONFIG_ENV)
    if chosen:
        return Path(chosen).expanduser().resolve()
    for candidate in (*candidates, Path.cwd() / LOCAL_CONFIG):
        if candidate.is_file():
            return candidate.resolve()
    return None


def builtin_settings() -> dict[str, object]:
    """The settings of ``conf/local.toml``, built in for an installed package that runs
    outside a checkout; its data under ``./work/``. A unit test keeps the two equal."""
    work = Path(DEFAULT_WORKDIR).resolve()
    return {
        "landing": str(work / "landing"),
        "warehouse": str(work / "warehouse"),
        "buckets": [{"name": DEMO_BUCKET}],
        # the demo's sample carries one malformed frame on purpose (conf/local.toml says why)
        "quality": {"quarantine_threshold": 1},
    }


def load_config(path: str | Path | None, **overrides: object) -> AppConfig:
    """Read and validate ``path``; ``overrides`` replace top-level keys (e.g. for tests) and
    are taken as given (relative paths in them stay relative to the working directory).

    ``path=None`` is the configuration of a command given no ``--config``
    (:data:`CONFIG_RULE`): the file :func:`find_config` finds, else :func:`builtin_settings`."""
    if path is None:
        found = find_config()
        if found is None:
            return _validated(builtin_settings() | overrides, "the built-in configuration")
        path = found
    file = Path(path)
    try:
        raw = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{file}: configuration file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from None
    folder = file.resolve().parent
    for key in ("landing", "warehouse"):
        if key in raw:
            raw[key] = _anchored(raw[key], folder)
    spark = raw.get("spark")
    if isinstance(spark, dict):
        for key in ("py_files", "jars_dir"):
            if key in spark and spark[key] != "auto":
                spark[key] = _anchored(spark[key], folder)
    for bucket in raw.get("buckets", []) if isinstance(raw.get("buckets"), list) else []:
        if isinstance(bucket, dict) and "landing" in bucket:
            bucket["landing"] = _anchored(bucket["landing"], folder)
        capture = bucket.get("capture") if isinstance(bucket, dict) else None
        if isinstance(capture, dict):
            for key in (
                "password_file",
                "tls_ca_file",
                "tls_cert_file",
                "tls_key_file",
                "state_dir",
                "staging_dir",
            ):
                if key in capture:
                    capture[key] = _anchored(capture[key], folder)
    thrift = raw.get("thrift")
    if isinstance(thrift, dict) and "kerberos_keytab" in thrift:
        thrift["kerberos_keytab"] = _anchored(thrift["kerberos_keytab"], folder)
    raw.update(overrides)
    return _validated(raw, str(file))


def _validated(raw: dict[str, object], source: str) -> AppConfig:
    try:
        return AppConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{source}: invalid configuration: {_problems(exc)}") from None


def _problems(exc: ValidationError, *section: str) -> str:
    """Each error of ``exc`` as ``field.path: message`` (inside ``section``), joined by ``; ``."""
    return "; ".join(
        f"{_location((*section, *err['loc'])) or '(top level)'}: {err['msg']}"
        for err in exc.errors()
    )


def _location(path: tuple[object, ...]) -> str:
    """``buckets[0].capture.username``: a field's place, list items by index."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text


def thrift_settings(config: AppConfig, **overrides: object) -> ThriftConfig:
    """``config``'s ``[thrift]`` with the command line's overrides (``host``, ``port``,
    ``allow_unauthenticated``; None: keep the file's), validated again as a whole: a
    non-loopback ``--host`` without authentication fails here, before Spark starts."""
    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return ThriftConfig.model_validate(config.thrift.model_dump() | given)
    except ValidationError as exc:
        raise ConfigError(f"invalid Thrift server settings: {_problems(exc, 'thrift')}") from None


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m dcp_cdc.config",
        description="Check a configuration file (its reference: python -m dcp_cdc.config.reference).",
    )
    parser.add_argument(
        "--check", metavar="FILE", required=True, help="validate FILE and print it with defaults"
    )
    args = parser.parse_args(argv)
    try:
        print(load_config(args.check).model_dump_json(indent=2))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
