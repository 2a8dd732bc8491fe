"""``dcp-cdc sql``: one SQL statement against the catalog, its result printed as a table
(at most ``--limit`` rows). A statement Spark cannot parse or analyse is a one-line error; a
table that does not exist says whether its bucket has not been applied yet or the name is
wrong.
"""

from __future__ import annotations

import argparse
from typing import TextIO

from pipelines.app.commands.shared import catalog_config, print_table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``dcp-cdc sql`` besides ``--config`` and ``--warehouse``."""
    parser.add_argument("query")
    parser.add_argument("--limit", type=int, default=50, help="rows to print")


def command(args: argparse.Namespace, out: TextIO) -> int:
    """Run one SQL statement against the catalog and print the result as a table."""
    from pyspark.errors import AnalysisException

    from pipelines.catalog.contents import query_error
    from pipelines.lake.spark_session import session_for

    config = catalog_config(args)
    spark = session_for(config, "dcp-cdc-sql")
    try:
        rows = spark.sql(args.query).limit(args.limit + 1).collect()
    except AnalysisException as exc:  # the statement's fault (parse errors too)
        raise query_error(spark, exc, [b.name for b in config.buckets]) from None
    columns = rows[0].__fields__ if rows else []
    cells = [[("NULL" if v is None else str(v))[:80] for v in row] for row in rows[: args.limit]]
    print_table(out, columns, cells)
    more = " (more not shown)" if len(rows) > args.limit else ""
    out.write(f"({len(cells)} rows{more})\n")
    return 0
