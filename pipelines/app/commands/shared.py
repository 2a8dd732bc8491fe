"""What the catalog's verbs (``sql``, ``tables``, ``spark-conf``, ``thrift-server``) share:
the configuration they read, with ``--warehouse`` over its warehouse, and the table they print.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from dcp_cdc.config import AppConfig, load_config
from dcp_cdc.logs import configure_logging_from


def command_config(
    path: str | None, *, log_level: str | None = None, **overrides: object
) -> AppConfig:
    """The configuration a verb runs on (:func:`~dcp_cdc.config.load_config`), its log
    settings applied (``log_level``: the level when neither the configuration nor the
    environment names one; :func:`~dcp_cdc.logs.configure_logging_from`)."""
    config = load_config(path, **overrides)
    configure_logging_from(config, log_level)
    return config


def catalog_config(args: argparse.Namespace) -> AppConfig:
    """``--config`` (None: :data:`~dcp_cdc.config.CONFIG_RULE`, as for every verb), with
    ``--warehouse`` over its warehouse."""
    overrides = {"warehouse": str(Path(args.warehouse).resolve())} if args.warehouse else {}
    return command_config(args.config, **overrides)


def print_table(out: TextIO, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    out.write(" | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip() + "\n")
    out.write("-+-".join("-" * w for w in widths) + "\n")
    for r in rows:
        out.write(" | ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() + "\n")
