"""The small tables of ``dcp-cdc status`` read through the Spark catalog: what a shared
catalog's table not found at its warehouse location costs (a Spark session, a JVM), and the
reference the tests hold the reader without a JVM (:mod:`pipelines.status.tables_read`) to.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
from pyspark.sql import SparkSession

from dcp_cdc.config import AppConfig
from pipelines.lake.delta_rs import plain_types
from pipelines.lake.spark_session import session_for


class SparkTables:
    """The tables as the catalog of ``spark`` has them."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark

    @classmethod
    def of(cls, config: AppConfig) -> SparkTables:
        """The tables of ``config``'s catalog, in the session of ``dcp-cdc status``."""
        return cls(session_for(config, "dcp-cdc-status"))

    def read(self, table: str, columns: Sequence[str]) -> pa.Table | None:
        if not self.spark.catalog.tableExists(table):
            return None
        return plain_types(self.spark.table(table).select(*columns).toArrow())
