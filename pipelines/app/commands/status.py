"""``dcp-cdc status``: where each bucket's pipeline stands, on one screen.

Per bucket and stage (the cluster's high seqnos, the capture agent's checkpoint, bronze,
silver): how many seqnos it is behind the stage before, in how many vbuckets and the worst of
them, and when it last moved; how old silver's newest change is; the last quality check
(passed or failed, when, its expectations, its report). ``--json`` prints the same as one
JSON object (docs/commands.md describes its fields).

Cheap: it reads silver's stream state, the ingest log, the last quality run's results and
the agent's checkpoint, never bronze's events or silver's tables, and with delta-rs, no JVM:
Spark starts only for a shared catalog's table not found at its warehouse location
(docs/commands.md says when); the cluster is asked for
its high seqnos with the bucket's ``[buckets.capture]`` settings, the agent's own
connections (``--no-cluster``: not asked). A cluster that cannot be reached is a line of the
report, not an error. Exit status 0 whatever it finds; 2 for a configuration it cannot use.
The steps: :mod:`pipelines.status.read`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from typing import TextIO

from pipelines.app.commands.shared import catalog_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``dcp-cdc status`` besides ``--config``, ``--warehouse`` and ``--bucket``."""
    parser.add_argument("--json", action="store_true", help="one JSON object instead of the screen")
    parser.add_argument(
        "--no-cluster",
        action="store_true",
        help="do not ask the cluster for its high seqnos (the capture is the first stage)",
    )


def command(args: argparse.Namespace, out: TextIO) -> int:
    """``dcp-cdc status``: every bucket's (or ``--bucket``'s) status, as text or JSON."""
    from pipelines.status import read, render  # delta-rs: imported only when the verb runs

    statuses = read.run(catalog_config(args), args.bucket, cluster=not args.no_cluster)
    now = dt.datetime.now(dt.UTC)
    if args.json:
        out.write(json.dumps(render.as_json(statuses, now), indent=2) + "\n")
    else:
        out.write(render.screen(statuses, now))
    return 0
