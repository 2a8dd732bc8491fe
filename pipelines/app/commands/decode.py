"""``dcp-cdc decode``: every frame of capture files (or of the capture files in folders) as
one JSON object a line, malformed frames as errors naming their file and byte offset; exit
status 1 if any frame was malformed.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO

from dcp_cdc.capture import EXTENSION, iter_capture, iter_stream
from dcp_cdc.errors import MalformedFrameError
from dcp_cdc.events import Event
from dcp_cdc.render import error_to_json, event_to_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``dcp-cdc decode``."""
    parser.add_argument("paths", nargs="+", help="capture files or folders of them")
    parser.add_argument("--raw", action="store_true", help="headerless stream of frames")
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--collections",
        dest="collections",
        action="store_true",
        default=None,
        help="keys carry a LEB128 collection id (default: from the capture header)",
    )
    group.add_argument("--no-collections", dest="collections", action="store_false")


def command(args: argparse.Namespace, out: TextIO) -> int:
    """One JSON object per frame (JSON Lines); exit 1 if any frame was malformed."""
    failed = False
    for path in _capture_paths(args.paths):
        for item in _frames(path, raw=args.raw, collections=args.collections):
            if isinstance(item, MalformedFrameError):
                failed = True
                record = error_to_json(item)
            else:
                record = event_to_json(item, file=str(path))
            out.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
    return 1 if failed else 0


def _capture_paths(paths: Sequence[str]) -> list[Path]:
    """Files named, and the capture files inside folders named, in a stable order."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(p.rglob(f"*{EXTENSION}")))
        else:
            out.append(p)
    return out


def _frames(
    path: Path, *, raw: bool, collections: bool | None
) -> Iterator[Event | MalformedFrameError]:
    if raw:
        with open(path, "rb") as fh:
            yield from iter_stream(fh, collections=bool(collections), file=str(path))
    else:
        yield from iter_capture(path, collections=collections)
