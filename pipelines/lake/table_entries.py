"""The catalog's entries of a list of tables, asked at once, and a block that answers from
them.

A quality check reads each of its tables several times (its version, its size, its rows
through delta-rs) and asks whether each table and view exists; each of those is a catalog
lookup (``spark.catalog.tableExists``, a table's location behind its log: 15-45 ms each in a
warm session on the embedded metastore). :func:`entries` asks the catalog for many tables in
one call per database; within :func:`known`, :func:`exists`, :func:`location` and the log
reads of :mod:`pipelines.lake.delta_io` answer from them.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

from pyspark.sql import SparkSession

_KNOWN: contextvars.ContextVar[Mapping[str, str | None]] = contextvars.ContextVar(
    "known_tables", default=MappingProxyType({})
)
"""The entries :func:`known` holds for the block that runs in this thread."""


@contextlib.contextmanager
def known(held: Mapping[str, str | None]) -> Iterator[None]:
    """Within the block, in this thread (another thread, a pool's too, asks the catalog):
    :func:`exists` is true for the tables and views of ``held`` (:func:`entries`), and
    :func:`location` gives a table's location from them (which
    :func:`pipelines.lake.delta_io.table_location` and the reads of a table's log take, not a
    catalog lookup each time). Any other name is asked of the catalog."""
    token = _KNOWN.set(MappingProxyType(dict(held)))
    try:
        yield
    finally:
        _KNOWN.reset(token)


def location(table: str) -> str | None:
    """The location of ``table`` that :func:`known` holds (None: none is held)."""
    return _KNOWN.get().get(table)


def exists(spark: SparkSession, table: str) -> bool:
    """``spark.catalog.tableExists``, true without asking it for the entries :func:`known`
    holds."""
    return table in _KNOWN.get() or spark.catalog.tableExists(table)


def locations(spark: SparkSession, tables: Iterable[str]) -> dict[str, str]:
    """The locations (URIs) of those of ``tables`` (``DB.NAME``) the catalog holds as tables,
    by name; none for a missing one or a view (:func:`entries`)."""
    return {table: where for table, where in entries(spark, tables).items() if where is not None}


def entries(spark: SparkSession, tables: Iterable[str]) -> dict[str, str | None]:
    """Those of ``tables`` (``DB.NAME``, tables or views) the catalog holds, by name, with
    a table's location (a URI; None for a view); none for a missing one. One catalog call per
    database (``getTablesByName``), where ``spark.catalog.tableExists`` and a location each
    cost a call per table."""
    catalog = spark._jsparkSession.sessionState().catalog()
    jvm: Any = spark._jvm
    converters = jvm.scala.jdk.javaapi.CollectionConverters
    by_database: dict[str, dict[str, list[str]]] = {}  # as the catalog matches: any case
    for table in tables:
        db, _, name = table.partition(".")
        by_database.setdefault(db, {}).setdefault(name.lower(), []).append(table)
    found: dict[str, str | None] = {}
    for db, wanted in by_database.items():
        if not catalog.databaseExists(db):
            continue
        identifier, some = jvm.org.apache.spark.sql.catalyst.TableIdentifier, jvm.scala.Some
        names = jvm.java.util.ArrayList()
        for name in wanted:
            names.add(identifier(name, some(db)))
        listed = catalog.getTablesByName(converters.asScala(names).toSeq()).iterator()
        while listed.hasNext():
            entry = listed.next()
            where = None
            if entry.storage().locationUri().isDefined():  # a view has none
                where = str(entry.location().toString())
            for table in wanted.get(str(entry.identifier().table()).lower(), ()):
                found[table] = where
    return found


_PLAIN_NAME = re.compile(r"[a-z0-9_]+")


def names(spark: SparkSession, tables: Iterable[str]) -> set[str]:
    """Those of ``tables`` (``DB.NAME``) the catalog holds, tables or views: one listing per
    database of the names matching them, no table's metadata (which :func:`entries` reads:
    for a view, about twice a table's cost). A name that is not a plain identifier (what a
    listing's pattern would read as one) is looked up by :func:`entries`."""
    catalog = spark._jsparkSession.sessionState().catalog()
    by_database: dict[str, dict[str, list[str]]] = {}  # as the catalog matches: any case
    odd: list[str] = []
    for table in tables:
        db, _, name = table.partition(".")
        if not _PLAIN_NAME.fullmatch(name.lower()):
            odd.append(table)
            continue
        by_database.setdefault(db, {}).setdefault(name.lower(), []).append(table)
    found = set(entries(spark, odd)) if odd else set()
    for db, wanted in by_database.items():
        if not catalog.databaseExists(db):
            continue
        listed = catalog.listTables(db, "|".join(wanted), False).iterator()
        while listed.hasNext():
            entry = listed.next()
            if entry.database().isDefined():  # not a temporary view
                found.update(wanted.get(str(entry.table()).lower(), ()))
    return found
