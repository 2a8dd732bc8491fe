"""The ``dcp-cdc`` command line.

Subcommands stay thin: they parse arguments and call the library (or, for Spark jobs, the
``pipelines`` entry points, imported lazily so ``decode`` starts fast).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO

from dcp_cdc.capture import EXTENSION, iter_capture, iter_stream, read_capture_header
from dcp_cdc.errors import DcpError, MalformedFrameError
from dcp_cdc.events import Event
from dcp_cdc.render import error_to_json, event_to_json


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


def cmd_decode(args: argparse.Namespace, out: TextIO) -> int:
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


def summarize(paths: Sequence[Path], out: TextIO) -> int:
    """Counts per op and per vbucket of the captures, and their errors."""
    ops: Counter[str] = Counter()
    vbuckets: set[int] = set()
    errors: list[MalformedFrameError] = []
    total_bytes = 0
    for path in paths:
        header, _ = read_capture_header(path)
        total_bytes += path.stat().st_size
        for item in iter_capture(path):
            if isinstance(item, MalformedFrameError):
                errors.append(item)
                continue
            ops[item.op] += 1
            if item.header.vbucket is not None and item.op != "noop":
                vbuckets.add(item.header.vbucket)
        out.write(
            f"  {path.name}: bucket={header.bucket} session={header.session_id} "
            f"sequence={header.sequence}\n"
        )
    out.write(f"{sum(ops.values())} frames, {total_bytes} bytes, {len(vbuckets)} vbuckets\n")
    for op, count in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])):
        out.write(f"  {op:<26}{count:>10}\n")
    for err in errors:
        out.write(f"  error: {err}\n")
    return 1 if errors else 0


def cmd_run(args: argparse.Namespace, out: TextIO) -> int:
    """The main job on embedded default data: simulate a small bucket, then decode it."""
    from dcp_cdc.simulator import SimConfig, simulate

    target = Path(args.workdir)
    for folder in ("landing", "truth"):  # each run starts from fresh sample data
        shutil.rmtree(target / folder, ignore_errors=True)
    config = SimConfig(scenario="mixed", seed=1, vbuckets=16, docs=400, ops=2000,
                       inject_malformed=1)  # fmt: skip
    result = simulate(target, config)
    out.write(f"simulated bucket {config.bucket!r} ({config.scenario}, seed {config.seed}) "
              f"into {target / 'landing'}\n")  # fmt: skip
    code = summarize(result.files, out)
    expected = len(result.expected_errors)
    out.write(f"{expected} of the errors above were injected on purpose by the simulator\n")
    return 0 if code == 0 or expected else code


def cmd_simulate(args: argparse.Namespace, out: TextIO) -> int:
    import time

    from dcp_cdc.simulator import SimConfig, simulate

    config = SimConfig(
        scenario=args.scenario, seed=args.seed, bucket=args.bucket, vbuckets=args.vbuckets,
        collections=args.collections, docs=args.docs, ops=args.ops,
        max_file_bytes=args.max_file_bytes, inject_malformed=args.inject_malformed,
    )  # fmt: skip
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dcp-cdc", description="Couchbase DCP change data capture into Delta Lake."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    decode = sub.add_parser("decode", help="print every frame of captures as JSON Lines")
    decode.add_argument("paths", nargs="+", help="capture files or folders of them")
    decode.add_argument("--raw", action="store_true", help="headerless stream of frames")
    group = decode.add_mutually_exclusive_group()
    group.add_argument(
        "--collections", dest="collections", action="store_true", default=None,
        help="keys carry a LEB128 collection id (default: from the capture header)",
    )  # fmt: skip
    group.add_argument("--no-collections", dest="collections", action="store_false")
    decode.set_defaults(func=cmd_decode)

    from dcp_cdc.simulator.scenarios import SCENARIOS, SimConfig

    defaults = SimConfig()
    sim = sub.add_parser("simulate", help="simulate a bucket: DCP captures and their truth")
    sim.add_argument("--out", required=True, help="output folder (landing/ and truth/)")
    sim.add_argument("--seed", type=int, default=defaults.seed)
    sim.add_argument("--scenario", choices=SCENARIOS, default=defaults.scenario)
    sim.add_argument("--bucket", default=defaults.bucket)
    sim.add_argument("--vbuckets", type=int, default=defaults.vbuckets)
    sim.add_argument("--collections", type=int, default=defaults.collections)
    sim.add_argument("--docs", type=int, default=defaults.docs, help="documents loaded first")
    sim.add_argument("--ops", type=int, default=defaults.ops, help="changes after the load")
    sim.add_argument("--max-file-bytes", type=int, default=defaults.max_file_bytes)
    sim.add_argument("--inject-malformed", type=int, default=0, metavar="N",
                     help="write N corrupted frames (reported in the truth)")  # fmt: skip
    sim.set_defaults(func=cmd_simulate)

    run = sub.add_parser("run", help="the main job on the embedded default data")
    run.add_argument("--workdir", default="work", help="where data and tables go")
    run.set_defaults(func=cmd_run)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    args = build_parser().parse_args(argv)
    stream = out or sys.stdout
    try:
        return int(args.func(args, stream))
    except DcpError as exc:
        print(f"dcp-cdc: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `dcp-cdc decode x | head`
        return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
