"""``dcp-cdc sql``: one SQL statement against the catalog, its result printed as a table
(at most ``--limit`` rows)."""

from __future__ import annotations

import argparse
from typing import TextIO

from pipelines.commands.shared import catalog_config, print_table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``dcp-cdc sql`` besides ``--config`` and ``--warehouse``."""
    parser.add_argument("query")
    parser.add_argument("--limit", type=int, default=50, help="rows to print")


def command(args: argparse.Namespace, out: TextIO) -> int:
    """Run one SQL statement against the catalog and print the result as a table."""
    from pipelines.spark_session import session_for

    spark = session_for(catalog_config(args), "dcp-cdc-sql")
    rows = spark.sql(args.query).limit(args.limit + 1).collect()
    columns = rows[0].__fields__ if rows else []
    cells = [[("NULL" if v is None else str(v))[:80] for v in row] for row in rows[: args.limit]]
    print_table(out, columns, cells)
    more = " (more not shown)" if len(rows) > args.limit else ""
    out.write(f"({len(cells)} rows{more})\n")
    return 0
