"""``dcp-cdc tables``: the bronze, silver and quality tables and views of the catalog, with
their row counts."""

from __future__ import annotations

import argparse
from typing import TextIO

from pipelines.app.commands.shared import catalog_config, print_table


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``dcp-cdc tables`` has no flags besides ``--config`` and ``--warehouse``."""


def command(args: argparse.Namespace, out: TextIO) -> int:
    """Bronze, silver and quality tables with their row counts."""
    from pipelines.catalog.contents import list_tables
    from pipelines.lake.spark_session import session_for

    config = catalog_config(args)
    tables = list_tables(session_for(config, "dcp-cdc-tables"))
    print_table(
        out,
        ["layer", "table", "kind", "rows"],
        [[t.layer, t.name, t.kind, f"{t.rows:,}"] for t in tables],
    )
    out.write(
        f"({len(tables)} tables and views in the catalog of {config.warehouse}; a view "
        "holds a collection's live documents, its _all table tombstones too)\n"
    )
    return 0
