"""The small tables ``dcp-cdc status`` reads, read without a JVM: where each table is, and its
rows through delta-rs (the ``deltalake`` package), as an Arrow table.

Where: every layer's database is made by dcp-cdc (``CREATE DATABASE`` without a location),
which Spark puts at ``<warehouse>/<layer>.db``, and a managed table at its database's
location and its name: ``<warehouse>/<layer>.db/<name>``, on a local warehouse and on S3
alike (:func:`warehouse_location`). When the catalog is the warehouse's own (a local
warehouse's embedded Derby database, or the Derby network server serving it) only dcp-cdc
makes those databases, so that is where the tables are, and a table not there does not exist
yet (:func:`own_catalog`). A shared catalog (a Hive metastore, a Derby database elsewhere,
which a warehouse on S3 always has) may hold a database another client made first, at
another location: there a table not found at the warehouse's location is asked of the
catalog through Spark (:class:`WarehouseThenCatalog`, the one case that starts a JVM;
:func:`pipelines.status.read.tables_for` chooses).

How: delta-rs's SQL reader (``QueryBuilder``), which honours deletion vectors and column
mapping (``DeltaTable.to_pyarrow_table`` refuses deletion vectors), reads only the columns
asked for. A warehouse on S3 is read with ``[spark.conf]``'s ``spark.hadoop.fs.s3a.*``
settings (:class:`~dcp_cdc.agent.s3_store.S3Options`, as the agent and the landing reader
take them), else the usual AWS environment. A table that exists but cannot be read raises
:class:`~pipelines.errors.TableReadError` naming it and its location.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import pyarrow as pa

from dcp_cdc.config import AppConfig, is_uri, metastore_address
from pipelines.catalog.embedded import METASTORE_DIR_NAME
from pipelines.catalog.settings import local_default
from pipelines.errors import TableReadError
from pipelines.lake.delta_rs import plain_types, s3_storage_options
from pipelines.lake.delta_rs import reason as _reason


class TableSource(Protocol):
    """Reads a table's rows: ``columns`` of table ``table`` (``layer.name``), or None when
    there is no such table (yet)."""

    def read(self, table: str, columns: Sequence[str]) -> pa.Table | None: ...


def warehouse_root(warehouse: str) -> str:
    """The warehouse as delta-rs names it: a local folder as an absolute path (also when
    written ``file:``), a URI (``s3a://...``) as it is."""
    if is_uri(warehouse) and not warehouse.startswith("file:"):
        return warehouse.rstrip("/")
    local = warehouse.removeprefix("file://").removeprefix("file:")
    return str(Path(local).expanduser().resolve())


def warehouse_location(config: AppConfig, table: str) -> str:
    """Where Spark puts the managed table ``table`` (``layer.name``) of a layer database
    dcp-cdc made: ``<warehouse>/<layer>.db/<name>``."""
    layer, _, name = table.partition(".")
    return f"{warehouse_root(config.warehouse)}/{layer}.db/{name.lower()}"


def own_catalog(config: AppConfig) -> bool:
    """True when the catalog is the local warehouse's own: embedded Derby (or the Derby
    network server serving it, which a session finds by itself), or a ``[spark] metastore``
    Derby server whose database is ``<warehouse>/metastore_db``."""
    if local_default(config) is not None:
        return True
    metastore = config.spark.metastore
    if metastore is None or (is_uri(config.warehouse) and not config.warehouse.startswith("file:")):
        return False
    address = metastore_address(metastore)
    own = str(Path(warehouse_root(config.warehouse)) / METASTORE_DIR_NAME)
    return address.scheme == "derby" and address.database in (None, own)


def storage_options(config: AppConfig) -> dict[str, str]:
    """delta-rs's options for a warehouse on S3, from ``[spark.conf]``'s
    ``spark.hadoop.fs.s3a.*`` (what is not set comes from the AWS environment); none for a
    local warehouse."""
    return s3_storage_options(config.spark.conf, config.warehouse)


class DeltaFiles:
    """The tables at their :func:`warehouse_location`, read with delta-rs."""

    def __init__(self, config: AppConfig) -> None:
        self.config = config
        self.options = storage_options(config)

    def read(self, table: str, columns: Sequence[str]) -> pa.Table | None:
        location = warehouse_location(self.config, table)
        from deltalake import DeltaTable, QueryBuilder
        from deltalake.exceptions import TableNotFoundError

        try:
            delta = DeltaTable(location, storage_options=self.options or None)
        except TableNotFoundError as exc:
            try:
                if not _has_commits(location):
                    return None  # no table, or one whose first commit is still being written
            except OSError as listing:
                raise TableReadError(table, location, _reason(listing)) from None
            raise TableReadError(table, location, _reason(exc)) from None
        except Exception as exc:  # delta-rs: DeltaError, DeltaProtocolError, OSError, ...
            raise TableReadError(table, location, _reason(exc)) from None
        names = ", ".join(f'"{c}"' for c in columns)
        try:
            found = QueryBuilder().register("t", delta).execute(f"SELECT {names} FROM t")
            return plain_types(pa.table(found.read_all()))
        except Exception as exc:  # a column it lacks, a data file that cannot be read
            raise TableReadError(table, location, _reason(exc)) from None


def _has_commits(location: str) -> bool:
    """Whether a local table's log holds a commit or a checkpoint (on S3: assumed not, a
    table delta-rs finds no commit of is no table)."""
    if is_uri(location):
        return False
    log = Path(location) / "_delta_log"
    return log.is_dir() and any(f.suffix in (".json", ".parquet") for f in log.iterdir())


class WarehouseThenCatalog:
    """For a shared catalog: a table at its warehouse location, else the catalog's answer
    (``catalog()``: made on first need, the Spark session it costs started only then)."""

    def __init__(self, files: TableSource, catalog: Callable[[], TableSource]) -> None:
        self.files = files
        self._make_catalog = catalog
        self._catalog: TableSource | None = None

    def read(self, table: str, columns: Sequence[str]) -> pa.Table | None:
        found = self.files.read(table, columns)
        if found is not None:
            return found
        if self._catalog is None:
            self._catalog = self._make_catalog()
        return self._catalog.read(table, columns)
