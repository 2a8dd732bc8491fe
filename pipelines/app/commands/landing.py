"""``dcp-cdc landing skip --bucket B --session S --sequence N``: declare a capture file lost.

Ingest takes a session's files in sequence order, so a file missing from the landing (lost in
transfer, deleted, a failed upload) holds every later file of its session back; the ingest
summary, ``dcp-cdc status`` and the quality suite ``landing_continuity`` name the session and
the sequence. When the file cannot be found, ``skip`` records in the ingest log that it is
lost (one row, one Delta commit; a second ``skip`` of the same file changes nothing), and the
next ingest goes on from the next file. The changes the lost file held are not in bronze:
silver goes on without them, and the quality suites report the snapshots the gap cut
(docs/edge-cases.md). Only a sequence that holds files back now can be skipped.
"""

from __future__ import annotations

import argparse
from typing import TextIO

from dcp_cdc.errors import ConfigError
from pipelines.app.commands.shared import command_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``dcp-cdc landing`` besides ``--config`` and ``--bucket``."""
    parser.add_argument("action", choices=("skip",))
    parser.add_argument("--session", required=True, help="the capture session's id")
    parser.add_argument(
        "--sequence", type=int, required=True, help="the sequence of the file that is lost"
    )


def command(args: argparse.Namespace, out: TextIO) -> int:
    """``dcp-cdc landing skip``: log the file lost, and say what that lets ingest do."""
    config = command_config(args.config)
    buckets = config.bucket(args.bucket)
    if len(buckets) != 1:
        raise ConfigError("landing skip: name the bucket (--bucket) the session captures")
    from pipelines.bronze import store  # pyspark: imported only when the verb runs
    from pipelines.lake.spark_session import session_for

    spark = session_for(config, "dcp-cdc-landing")
    group = store.declare_lost(spark, config, buckets[0], args.session, args.sequence)
    where = f"bucket {buckets[0].name!r}: session {args.session} sequence {args.sequence}"
    if group is None:
        out.write(f"{where} is declared lost already; nothing changed\n")
        return 0
    out.write(
        f"{where} declared lost: the next ingest goes on with the {len(group.files)} files it "
        f"held back ({group.files[0].path}, ...); its changes are not in bronze, and the "
        "quality check reports the snapshots the gap cut\n"
    )
    return 0
