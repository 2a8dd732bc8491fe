"""``dcp-cdc maintain``: each bucket's tables kept in shape, in this order: the tombstone
purge (older than ``silver.tombstone_retention_hours``), the quality results' retention
(``quality.results_retention_days``), OPTIMIZE of every Delta table, VACUUM with
``maintenance.vacuum_retention_hours``. The deletes come first, so that OPTIMIZE rewrites the
files they touched and VACUUM removes what both left behind, the same day. Run daily by the
``dcp_cdc_maintenance`` DAG; the steps: :mod:`pipelines.maintenance.job`.
"""

from __future__ import annotations

import argparse
from typing import TextIO


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``dcp-cdc maintain`` has no flags besides ``--config`` and ``--bucket``."""


def command(args: argparse.Namespace, out: TextIO) -> int:
    """``dcp-cdc maintain``: one summary per bucket."""
    from pipelines.app.commands.shared import command_config
    from pipelines.maintenance import job as maintenance

    for summary in maintenance.run(command_config(args.config), args.bucket):
        out.write(summary.render() + "\n")
    return 0
