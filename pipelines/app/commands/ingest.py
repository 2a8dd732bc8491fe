"""``dcp-cdc ingest``: new capture files of the landing location into bronze Delta tables.

Run it as often as you like. Exactly once per frame comes from the ingest log plus Delta's
idempotent writes: the files to ingest are chosen in session order (a file waits until the
previous file of its session is in), bound to their bytes (size and digest) and logged as the
run's plan before any data is written; each file is then decoded once and its events appended
under the run's version, and the files are logged ``ingested`` with their counts. A run that
dies anywhere is finished by the next run. The steps: :mod:`pipelines.bronze.job`.
"""

from __future__ import annotations

import argparse
from typing import TextIO

from pipelines.app.commands.shared import command_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``dcp-cdc ingest`` has no flags besides ``--config`` and ``--bucket``."""


def command(args: argparse.Namespace, out: TextIO) -> int:
    """``dcp-cdc ingest``: one summary per bucket."""
    from pipelines.bronze import job  # pyspark: imported only when the verb runs

    for summary in job.run(command_config(args.config), args.bucket, config_file=args.config):
        out.write(summary.render() + "\n")
    return 0
