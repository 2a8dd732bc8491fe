"""``dcp-cdc simulate``: a simulated bucket's DCP capture files (``OUT/landing``) and its
ground truth (``OUT/truth``): a load of ``--docs`` documents, then ``--ops`` changes of the
``--scenario``; ``--inject-malformed`` adds corrupted frames, which the truth reports. The
bucket is made at ``--start`` (now unless given), so its TTLs count from today's changes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time
from pathlib import Path
from typing import TextIO


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``dcp-cdc simulate``."""
    from dcp_cdc.simulator.scenarios import SCENARIOS, SimConfig

    defaults = SimConfig()
    parser.add_argument("--out", required=True, help="output folder (landing/ and truth/)")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--scenario", choices=SCENARIOS, default=defaults.scenario)
    parser.add_argument("--bucket", default=defaults.bucket)
    parser.add_argument("--vbuckets", type=int, default=defaults.vbuckets)
    parser.add_argument("--collections", type=int, default=defaults.collections)
    parser.add_argument("--docs", type=int, default=defaults.docs, help="documents loaded first")
    parser.add_argument("--ops", type=int, default=defaults.ops, help="changes after the load")
    parser.add_argument("--max-file-bytes", type=int, default=defaults.max_file_bytes)
    parser.add_argument(
        "--inject-malformed",
        type=int,
        default=0,
        metavar="N",
        help="write N corrupted frames (reported in the truth)",
    )
    parser.add_argument(
        "--start",
        type=start_ns,
        default=None,
        metavar="TIME",
        help="the bucket's time when it is made, ISO 8601 (UTC unless it says): the same "
        "seed and start give byte-identical files (default: now)",
    )


def start_ns(text: str) -> int:
    """``--start``: an ISO 8601 time (UTC unless it gives an offset) in nanoseconds since
    the epoch."""
    try:
        at = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an ISO 8601 time such as 2026-01-05T09:30:00Z, got {text!r}"
        ) from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=dt.UTC)
    return round(at.timestamp() * 1_000_000) * 1000


def command(args: argparse.Namespace, out: TextIO) -> int:
    """Simulate, then print what was written: frames and bytes, events by kind, where."""
    from dcp_cdc.simulator import SimConfig, simulate

    config = SimConfig(
        scenario=args.scenario,
        seed=args.seed,
        bucket=args.bucket,
        vbuckets=args.vbuckets,
        collections=args.collections,
        docs=args.docs,
        ops=args.ops,
        max_file_bytes=args.max_file_bytes,
        inject_malformed=args.inject_malformed,
        start_ns=time.time_ns() if args.start is None else args.start,
    )
    started = time.perf_counter()
    result = simulate(args.out, config)
    seconds = time.perf_counter() - started
    out.write(
        f"scenario {config.scenario} seed {config.seed}: {result.frames} frames, "
        f"{result.bytes / 1e6:.1f} MB in {len(result.files)} files, {seconds:.1f} s "
        f"({result.frames / seconds:,.0f} events/s)\n"
    )
    for op, count in sorted(result.event_counts.items(), key=lambda kv: (-kv[1], kv[0])):
        out.write(f"  {op:<26}{count:>10}\n")
    out.write(f"captures in {Path(args.out) / 'landing'}, ground truth in {result.truth.parent}\n")
    return 0
