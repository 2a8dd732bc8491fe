"""What the catalog's verbs (``sql``, ``tables``, ``spark-conf``, ``thrift-server``) share:
the configuration they read, with ``--warehouse`` over its warehouse, and the table they print.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from dcp_cdc.config import AppConfig, load_config


def catalog_config(args: argparse.Namespace) -> AppConfig:
    """``--config`` (None: :data:`~dcp_cdc.config.CONFIG_RULE`, as for every verb), with
    ``--warehouse`` over its warehouse."""
    overrides = {"warehouse": str(Path(args.warehouse).resolve())} if args.warehouse else {}
    return load_config(args.config, **overrides)


def print_table(out: TextIO, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    out.write(" | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip() + "\n")
    out.write("-+-".join("-" * w for w in widths) + "\n")
    for r in rows:
        out.write(" | ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() + "\n")
