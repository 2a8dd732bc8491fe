"""``dcp-cdc run``: the whole pipeline in one process, and the summary a newcomer reads.

Without ``--config`` it is the embedded demo: a small simulated bucket served over DCP by the
test producer (4 data nodes on 127.0.0.1, a live workload with a failover and a rebalance on
the way) and captured by the capture agent into ``--workdir`` (fresh each time), then ingest,
apply and check on a local warehouse there, with the configuration
every verb uses when given none (:data:`dcp_cdc.config.CONFIG_RULE`: ``$DCP_CDC_CONFIG``, else
``./conf/local.toml``, else the same settings built in) as it is, but for its landing and
warehouse. From a checkout's root (or an empty folder) the default ``--workdir`` is where that
configuration keeps its data, so ``dcp-cdc check``, ``tables``, ``sql`` find the demo's tables
with no options. With ``--config`` it runs the same steps on that configuration's landing data.
"""

from __future__ import annotations

import argparse
from typing import TextIO

from dcp_cdc.config import DEFAULT_WORKDIR
from pipelines.app.commands import check


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``dcp-cdc run`` besides ``--bucket``; the check step's flags too."""
    parser.add_argument(
        "--workdir", default=DEFAULT_WORKDIR, help="where the embedded demo's data go"
    )
    parser.add_argument("--config", help="a TOML file in conf/: run on its landing data instead")
    parser.add_argument(
        "--follow",
        action="store_true",
        help="keep following: ingest and apply in micro-batches every follow.interval_s, with "
        "the capture agent alongside, until SIGTERM or Ctrl-C (the embedded demo: a live "
        "workload at --rate)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=200.0,
        help="with --follow and no --config: the demo bucket's live changes a second",
    )
    parser.add_argument(
        "--no-capture",
        action="store_true",
        help="with --follow --config: run no capture agent (files land by other means)",
    )
    check.add_arguments(parser)


def command(args: argparse.Namespace, out: TextIO) -> int:
    """The main job, or with ``--follow`` follow mode (:mod:`pipelines.follow`). Exit 1 when
    a quality check of severity error failed (the data stay)."""
    if args.follow:
        from pipelines.follow.entry import follow

        return follow(
            out,
            config_file=args.config,
            workdir=args.workdir,
            bucket=args.bucket,
            rate=args.rate,
            no_capture=args.no_capture,
        )
    from pipelines.app.batch_run import run

    return run(
        out,
        config_file=args.config,
        workdir=args.workdir,
        bucket=args.bucket,
        screenshot=args.screenshot,
    )
