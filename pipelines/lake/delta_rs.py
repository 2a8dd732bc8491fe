"""Delta tables read in the driver's Python through delta-rs (the ``deltalake`` package):
what a small read costs without a Spark job (``dcp-cdc status``, a small bucket's quality
check). delta-spark stays the only writer; these reads take a table at a committed version.

delta-rs's SQL reader (``QueryBuilder``) honours deletion vectors and reads only the columns
asked for (``DeltaTable.to_pyarrow_table`` refuses deletion vectors). A table on S3 is read
with the ``spark.hadoop.fs.s3a.*`` settings (:func:`s3_storage_options`), else the usual AWS
environment. A table that cannot be read raises :class:`~pipelines.errors.TableReadError`
naming it, its location and delta-rs's reason.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from dcp_cdc.agent.s3_store import S3Options
from pipelines.errors import TableReadError
from pipelines.lake.object_storage import on_s3

if TYPE_CHECKING:  # status reads through here without importing Spark
    from pyspark.sql import SparkSession

S3_TIMEOUTS = {
    "connect_timeout": "5s",
    "timeout": "30s",
    "max_retries": "2",
    "retry_timeout": "30s",
}
"""How long a read from S3 may wait: a store that does not answer is an error within
seconds, not a command that hangs."""

DRIVER_READ_BELOW_BYTES = 64 * 2**20
"""A support table (the stream state, the registry, the ingest log) of fewer bytes than this is
read here, in the driver (:func:`small_rows`); a larger one by Spark. Read by Spark, a table
costs the jobs that rebuild its state and scan it: 10-14 s on a task's executors before they
are warm (the DAG's first read of each task), 0.1-0.5 s once they are."""

_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def s3_storage_options(conf: Mapping[str, str], location: str) -> dict[str, str]:
    """delta-rs's options for a table or warehouse at ``location`` from Spark settings
    ``conf`` (``spark.hadoop.fs.s3a.*``: a config's ``[spark.conf]`` or a running session's);
    none for a local one."""
    if not on_s3(location):
        return {}
    s3 = S3Options.from_spark_conf(conf)
    found = {
        "AWS_ENDPOINT_URL": s3.endpoint_url,
        "AWS_REGION": s3.region,
        "AWS_ACCESS_KEY_ID": s3.access_key,
        "AWS_SECRET_ACCESS_KEY": s3.secret_key,
        "AWS_SESSION_TOKEN": s3.session_token,
    }
    options = {key: value for key, value in found.items() if value}
    if s3.endpoint_url and s3.endpoint_url.startswith("http://"):
        options["AWS_ALLOW_HTTP"] = "true"
    if s3.path_style is not None:
        options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = str(not s3.path_style).lower()
    return options | S3_TIMEOUTS


def reason(exc: BaseException) -> str:
    """delta-rs's error on one line: its chain of causes (one a line, coloured, each below an
    arrow) joined with colons."""
    lines = (
        line.strip().lstrip("\u21b3").strip() for line in _COLOUR.sub("", str(exc)).splitlines()
    )
    return f"{type(exc).__name__}: {': '.join(line for line in lines if line) or 'no message'}"


def plain_types(table: pa.Table) -> pa.Table:
    """``table`` with view types (``string_view``, ``binary_view``, as delta-rs's SQL reader
    returns) cast to the plain ones, which every compute kernel takes."""
    plain = {pa.string_view(): pa.string(), pa.binary_view(): pa.binary()}
    schema = pa.schema(f.with_type(plain.get(f.type, f.type)) for f in table.schema)
    return table.cast(schema) if schema != table.schema else table


def read_columns(
    location: str,
    columns: Sequence[str],
    *,
    table: str,
    version: int | None = None,
    options: Mapping[str, str] | None = None,
) -> pa.Table:
    """``columns`` of the Delta table at ``location`` (named ``table`` in errors), at
    ``version`` (None: its latest)."""
    batches = column_batches(location, columns, table=table, version=version, options=options)
    try:
        return plain_types(batches.read_all())
    except Exception as exc:  # delta-rs: DeltaError, DeltaProtocolError, OSError, ...
        raise TableReadError(table, location, reason(exc)) from None


def column_batches(
    location: str,
    columns: Sequence[str],
    *,
    table: str,
    version: int | None = None,
    options: Mapping[str, str] | None = None,
    where: str | None = None,
) -> pa.RecordBatchReader:
    """:func:`read_columns` as a stream of record batches (view types possible: see
    :func:`plain_types`), read as they are consumed; ``where``: a SQL condition the rows
    meet (the files whose statistics rule it out are not read)."""
    from deltalake import DeltaTable, QueryBuilder

    path = location
    if location.startswith("file:"):
        path = location.removeprefix("file://").removeprefix("file:")
    names = ", ".join(f'"{c}"' for c in columns)
    try:
        delta = DeltaTable(path, version=version, storage_options=dict(options or {}) or None)
        condition = "" if where is None else f" WHERE {where}"
        found = QueryBuilder().register("t", delta).execute(f"SELECT {names} FROM t{condition}")
        return pa.RecordBatchReader.from_stream(found)
    except Exception as exc:  # delta-rs: DeltaError, DeltaProtocolError, OSError, ...
        raise TableReadError(table, location, reason(exc)) from None


def table_batches(
    spark: SparkSession,
    table: str,
    columns: Sequence[str],
    version: int | None = None,
    where: str | None = None,
) -> pa.RecordBatchReader:
    """:func:`read_table` as a stream of record batches (:func:`column_batches`)."""
    from pipelines.lake import delta_io

    location = delta_io.table_location(spark, table)
    options = storage_options(spark, location)
    return column_batches(
        location, columns, table=table, version=version, options=options, where=where
    )


def read_table(
    spark: SparkSession, table: str, columns: Sequence[str], version: int | None = None
) -> pa.Table:
    """``columns`` of the catalog's Delta table ``table`` at ``version`` (None: its latest),
    read by delta-rs from the location the table's Delta log gives (no Spark job)."""
    from pipelines.lake import delta_io

    location = delta_io.table_location(spark, table)
    options = storage_options(spark, location)
    return read_columns(location, columns, table=table, version=version, options=options)


def storage_options(spark: SparkSession, location: str) -> dict[str, str]:
    """delta-rs's options for a table at ``location`` from the session's settings
    (:func:`s3_storage_options`); none for a local one."""
    if not on_s3(location):  # the session's settings cross from the JVM: only when needed
        return {}
    return s3_storage_options(dict(spark.sparkContext.getConf().getAll()), location)


def read_rows(
    spark: SparkSession, table: str, columns: Sequence[str], at: Mapping[str, int] | None = None
) -> list[dict[str, Any]]:
    """``columns`` of ``table`` at its version in ``at`` (else its latest), as the rows a
    Spark ``collect()`` gives (:func:`spark_rows`)."""
    return spark_rows(read_table(spark, table, columns, (at or {}).get(table)))


def rows_if_small(
    spark: SparkSession, table: str, columns: Sequence[str], version: int | None = None
) -> list[dict[str, Any]] | None:
    """``columns`` of ``table`` at ``version`` (None: its latest) as the rows a Spark
    ``collect()`` gives, read here while the table is below :data:`DRIVER_READ_BELOW_BYTES`
    (none from a table of no file); None for a larger one. The size comes from the table's
    checksum, as do the location and the version: no Spark job."""
    from pipelines.lake import delta_io

    files, size = delta_io.table_size(spark, table, version)
    if files == 0:
        return []
    if size >= DRIVER_READ_BELOW_BYTES:
        return None
    return read_rows(spark, table, columns, None if version is None else {table: version})


def small_rows(
    spark: SparkSession, table: str, columns: Sequence[str], version: int | None = None
) -> list[dict[str, Any]]:
    """:func:`rows_if_small`, else Spark's read of the table (a larger one)."""
    found = rows_if_small(spark, table, columns, version)
    if found is not None:
        return found
    at = "" if version is None else f" VERSION AS OF {int(version)}"
    names = ", ".join(f"`{c}`" for c in columns)
    return [
        r.asDict(recursive=True) for r in spark.sql(f"SELECT {names} FROM {table}{at}").collect()
    ]


def spark_rows(table: pa.Table) -> list[dict[str, Any]]:
    """``table``'s rows as a Spark ``collect()`` gives them (``Row.asDict(recursive=True)``):
    a timestamp as a naive datetime of the local time zone (made once per distinct instant),
    a map as a dict."""
    columns: dict[str, list[Any]] = {}
    for field, column in zip(table.schema, table.columns, strict=True):
        if pa.types.is_timestamp(field.type):
            micros = column.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
            local = {m: _local(m) for m in pc.unique(micros).to_pylist() if m is not None}
            columns[field.name] = [None if m is None else local[m] for m in micros.to_pylist()]
        elif pa.types.is_map(field.type):
            columns[field.name] = [None if m is None else dict(m) for m in column.to_pylist()]
        else:
            columns[field.name] = column.to_pylist()
    names = list(columns)
    return [dict(zip(names, values, strict=True)) for values in zip(*columns.values(), strict=True)]


def _local(micros: int) -> dt.datetime:
    """Spark's ``TimestampType.fromInternal``: local wall time, microseconds kept."""
    return dt.datetime.fromtimestamp(micros // 1_000_000).replace(microsecond=micros % 1_000_000)


def change_batches(
    spark: SparkSession, table: str, columns: Sequence[str], start: int, end: int
) -> pa.Table:
    """The change data feed of the catalog's Delta table ``table`` from version ``start`` to
    ``end`` (both included): ``columns`` and ``_change_type``, ``_commit_version``, read by
    delta-rs (no Spark job)."""
    from deltalake import DeltaTable

    from pipelines.lake import delta_io

    location = delta_io.table_location(spark, table)
    options = storage_options(spark, location)
    path = location.removeprefix("file://").removeprefix("file:")
    wanted = [*columns, "_change_type", "_commit_version"]
    try:
        delta = DeltaTable(path, storage_options=options or None)
        found = delta.load_cdf(starting_version=start, ending_version=end, columns=wanted)
        return plain_types(pa.RecordBatchReader.from_stream(found).read_all())
    except Exception as exc:  # delta-rs: DeltaError, DeltaProtocolError, OSError, ...
        raise TableReadError(table, location, reason(exc)) from None
