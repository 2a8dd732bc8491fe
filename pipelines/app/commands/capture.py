"""``dcp-cdc capture``: record a bucket's DCP changes into capture files in its landing
(a folder, or an ``s3://``/``s3a://`` prefix: docs/capture.md; the bucket's
``[buckets.capture]`` section); until now (the high seqnos at the
start), or following until SIGTERM or SIGINT. Either way the stop is clean: files closed,
checkpoint committed.
"""

from __future__ import annotations

import argparse
from typing import TextIO

from pipelines.app.commands.shared import command_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``dcp-cdc capture`` besides ``--config`` and ``--bucket``."""
    until = parser.add_mutually_exclusive_group()
    until.add_argument(
        "--until",
        choices=["now"],
        default="now",
        help="stop once every vbucket reached its high seqno of the start (the default)",
    )
    until.add_argument(
        "--follow", action="store_true", help="keep capturing until SIGTERM or SIGINT"
    )
    parser.add_argument(
        "--vbuckets", metavar="A-B", help="only these vbuckets (default: the section's vbuckets)"
    )


def command(args: argparse.Namespace, out: TextIO) -> int:
    """Record a bucket's DCP changes into capture files in its landing folder (the bucket's
    ``[buckets.capture]`` section); until now (the high seqnos at the start), or following
    until SIGTERM/SIGINT. Either way the stop is clean: files closed, checkpoint committed."""
    from dcp_cdc.agent.driver import run
    from dcp_cdc.agent.settings import settings_from_config
    from dcp_cdc.config.capture import parse_vbucket_range
    from dcp_cdc.errors import ConfigError

    config = command_config(args.config, log_level="INFO")
    buckets = [b for b in config.bucket(args.bucket) if b.capture is not None]
    if not buckets:
        where = f"bucket {args.bucket!r}" if args.bucket else "no bucket"
        raise ConfigError(f"{where} has a [buckets.capture] section: nothing to capture")
    if len(buckets) > 1:
        names = ", ".join(b.name for b in buckets)
        raise ConfigError(
            f"several buckets have a capture section ({names}): name one with --bucket"
        )
    vbuckets = None
    if args.vbuckets:
        try:
            vbuckets = parse_vbucket_range(args.vbuckets)
        except ValueError as exc:
            raise ConfigError(f"--vbuckets: {exc}") from None
    settings = settings_from_config(config, buckets[0], vbuckets=vbuckets)
    summary = run(settings, mode="follow" if args.follow else "until-now")
    for line in summary.lines():
        out.write(line + "\n")
    return 0
