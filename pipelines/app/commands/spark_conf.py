"""``dcp-cdc spark-conf``: the catalog's settings as a Spark properties file, for
``spark-sql``, ``pyspark`` and ``spark-submit --properties-file``."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TextIO

from pipelines.app.commands.shared import catalog_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``dcp-cdc spark-conf`` besides ``--config`` and ``--warehouse``."""
    parser.add_argument("--out", help="write them to this properties file (default: print)")


def command(args: argparse.Namespace, out: TextIO) -> int:
    """The catalog's settings as a Spark properties file, for ``spark-sql``, ``pyspark`` and
    ``spark-submit --properties-file``."""
    from pipelines.lake.spark_session import launch_conf, properties_text

    config = catalog_config(args)
    text = properties_text(launch_conf(config, "dcp-cdc-shell", master=config.spark.master))
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
        out.write(
            f"wrote {args.out}: use it with spark-sql, pyspark or spark-submit "
            f"--properties-file {args.out}\n"
        )
    else:
        out.write(text)
    return 0
