"""``dcp-cdc check``: five Great Expectations suites over each bucket's bronze and silver
and its landing.

Bronze's frames since the last check (or all of them, ``--full``) are placed in their streams
and snapshots; silver's tables are read for coverage and reconciliation; the landing is listed
for files a missing one holds back. The results are appended to
``quality.<bucket>_results`` (one row per expectation), with Data Docs and a one-page summary
under
``<warehouse>/quality/<bucket>/``. A failed expectation of severity ``error`` fails the
check (exit status 1, naming it); ``warn`` is reported only. The steps:
:mod:`pipelines.quality.job`.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``dcp-cdc check`` besides ``--config`` and ``--bucket`` (``dcp-cdc run``
    takes them too, for its check step)."""
    parser.add_argument(
        "--screenshot",
        action="store_true",
        # the name is the quality job's SCREENSHOT_NAME, written out: help imports no job
        help="also save summary.png of the summary (headless Chromium)",
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help="read all of bronze, not only what arrived since the last check",
    )


def command(args: argparse.Namespace, out: TextIO) -> int:
    """``dcp-cdc check``: one report per bucket; exit 1 naming every failed expectation of
    severity ``error``."""
    from pipelines.app.commands.shared import command_config
    from pipelines.quality import job

    reports = job.run(
        command_config(args.config), args.bucket, screenshot=args.screenshot, full=args.full
    )
    for report in reports:
        out.write(report.render() + "\n")
    failed = job.failed_errors(reports)
    if failed:
        print(f"dcp-cdc check: failed error expectations: {'; '.join(failed)}", file=sys.stderr)
        return 1
    return 0
