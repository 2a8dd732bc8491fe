"""``dcp-cdc apply``: bronze events into one current-state silver table per collection.

Per bucket, the frames no run has consumed yet are walked in session order; only complete
snapshots commit. Rolled-back changes are retracted, drops and flushes remove their rows, and
the newest committed change per key is MERGEd into its collection's table where it is newer
than the row (deletions and expirations become tombstones). ``--rebuild`` empties the tables
(or ``--collection``'s) and applies all of bronze again. The steps:
:mod:`pipelines.silver.job`.
"""

from __future__ import annotations

import argparse
from typing import TextIO


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``dcp-cdc apply`` besides ``--config`` and ``--bucket``."""
    parser.add_argument("--collection", metavar="SCOPE.NAME", help="only this collection's table")
    parser.add_argument(
        "--rebuild",
        action="store_true",
        help="a backfill: empty the tables (or --collection's) and apply all of bronze again",
    )


def command(args: argparse.Namespace, out: TextIO) -> int:
    """``dcp-cdc apply``: one summary per bucket."""
    from pipelines.app.commands.shared import command_config
    from pipelines.silver import job

    config = command_config(args.config)
    for summary in job.run(config, args.bucket, collection=args.collection, rebuild=args.rebuild):
        out.write(summary.render() + "\n")
    return 0
