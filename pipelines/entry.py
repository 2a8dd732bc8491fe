"""What every job's ``python -m`` entry point shares: its arguments, logging and error exit.

Each job (ingest, apply, check, maintain) takes ``--config`` and ``--bucket``, logs at
``DCP_CDC_LOG_LEVEL``, prints one summary per bucket, and turns a :class:`DcpError` into a
one-line message and exit status 2 (a bug's traceback still shows in full).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from dcp_cdc.config import AppConfig, load_config
from dcp_cdc.errors import DcpError


class Summary(Protocol):
    def render(self) -> str: ...


S = TypeVar("S", bound=Summary)


def job_parser(prog: str, doc: str | None, **kwargs: Any) -> argparse.ArgumentParser:
    """A parser with the ``--config`` and ``--bucket`` options of every job."""
    parser = argparse.ArgumentParser(prog=f"python -m {prog}", description=doc, **kwargs)
    parser.add_argument("--config", required=True, help="a TOML file in conf/")
    parser.add_argument("--bucket", help="only this bucket")
    return parser


def run_job(
    verb: str, args: argparse.Namespace, body: Callable[[AppConfig], Sequence[S]]
) -> Sequence[S] | None:
    """Load ``args.config``, run ``body`` and print its summaries; None (after saying why on
    stderr as ``dcp-cdc <verb>: error: ...``) when it raised a :class:`DcpError`."""
    logging.basicConfig(level=os.environ.get("DCP_CDC_LOG_LEVEL", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")  # fmt: skip
    try:
        summaries = body(load_config(args.config))
    except DcpError as exc:
        print(f"dcp-cdc {verb}: error: {exc}", file=sys.stderr)
        return None
    for summary in summaries:
        print(summary.render())
    return summaries
