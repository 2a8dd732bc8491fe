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


DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "conf" / "local.toml"


def cmd_run(args: argparse.Namespace, out: TextIO) -> int:
    """The main job. Without ``--config``: simulate a small bucket into ``--workdir`` (fresh
    each time) and run the pipeline on a local warehouse there; with it, run on real data."""
    from dcp_cdc.config import load_config
    from dcp_cdc.simulator import SimConfig, simulate
    from pipelines.bronze.job import run as ingest

    if args.config:
        config = load_config(args.config)
    else:
        target = Path(args.workdir)
        for folder in ("landing", "truth", "warehouse"):  # the embedded demo starts afresh
            shutil.rmtree(target / folder, ignore_errors=True)
        config = load_config(
            DEFAULT_CONFIG, landing=str(target / "landing"), warehouse=str(target / "warehouse")
        )
        sim = SimConfig(scenario="mixed", seed=1, bucket=config.buckets[0].name, vbuckets=16,
                        docs=400, ops=2000, inject_malformed=1)  # fmt: skip
        result = simulate(target, sim)
        out.write(f"1/3 simulated bucket {sim.bucket!r} ({sim.scenario}, seed {sim.seed}): "
                  f"{result.frames} frames in {len(result.files)} files under "
                  f"{target / 'landing'}\n")  # fmt: skip
    from pipelines.silver.job import run as apply

    out.write("2/3 ingesting into bronze (Spark)...\n")
    out.flush()
    for summary in ingest(config, args.bucket):
        out.write(summary.render() + "\n")
    out.write("3/3 applying to silver...\n")
    out.flush()
    for applied in apply(config, args.bucket):
        out.write(applied.render() + "\n")
    from pipelines.bronze.job import table_names

    events = table_names(config.buckets[0].name)["events"]
    out.write(f"\ntables are in the catalog under {config.warehouse}; try\n"
              f"  .venv/bin/dcp-cdc sql \"SELECT op, count(*) AS n FROM {events} GROUP BY op\"\n")  # fmt: skip
    return 0


def cmd_apply(args: argparse.Namespace, out: TextIO) -> int:
    from dcp_cdc.config import load_config
    from pipelines.silver.job import run as apply

    config = load_config(args.config)
    for summary in apply(config, args.bucket, collection=args.collection):
        out.write(summary.render() + "\n")
    return 0


def cmd_check(args: argparse.Namespace, out: TextIO) -> int:
    """The quality suites; exit 1 naming every failed expectation of severity ``error``."""
    from dcp_cdc.config import load_config
    from pipelines.quality.job import failed_errors
    from pipelines.quality.job import run as check

    config = load_config(args.config)
    reports = check(config, args.bucket, screenshot=args.screenshot)
    for report in reports:
        out.write(report.render() + "\n")
    failed = failed_errors(reports)
    if failed:
        print(f"dcp-cdc check: failed error expectations: {'; '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def cmd_sql(args: argparse.Namespace, out: TextIO) -> int:
    """Run one SQL statement against the catalog and print the result as a table."""
    from dcp_cdc.config import load_config
    from pipelines.spark_session import build_spark_session

    config = load_config(args.config or DEFAULT_CONFIG)
    spark = build_spark_session("dcp-cdc-sql", config.warehouse, master=config.spark.master,
                                shuffle_partitions=config.spark.shuffle_partitions)  # fmt: skip
    rows = spark.sql(args.query).limit(args.limit + 1).collect()
    columns = rows[0].__fields__ if rows else []
    cells = [[("NULL" if v is None else str(v))[:80] for v in row] for row in rows[: args.limit]]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    out.write(" | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)) + "\n")
    out.write("-+-".join("-" * w for w in widths) + "\n")
    for r in cells:
        out.write(" | ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) + "\n")
    more = " (more not shown)" if len(rows) > args.limit else ""
    out.write(f"({len(cells)} rows{more})\n")
    return 0


def cmd_ingest(args: argparse.Namespace, out: TextIO) -> int:
    from dcp_cdc.config import load_config
    from pipelines.bronze.job import run as ingest

    config = load_config(args.config)
    for summary in ingest(config, args.bucket):
        out.write(summary.render() + "\n")
    return 0


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

    run = sub.add_parser("run", help="the main job (embedded sample data unless --config)")
    run.add_argument("--workdir", default="work", help="where the embedded demo's data go")
    run.add_argument("--config", help="a TOML file in conf/: run on its landing data instead")
    run.add_argument("--bucket", help="only this bucket")
    run.set_defaults(func=cmd_run)

    ingest = sub.add_parser("ingest", help="new capture files into bronze Delta tables")
    ingest.add_argument("--config", required=True, help="a TOML file in conf/")
    ingest.add_argument("--bucket", help="only this bucket")
    ingest.set_defaults(func=cmd_ingest)

    apply = sub.add_parser("apply", help="bronze events into silver tables (MERGE)")
    apply.add_argument("--config", required=True, help="a TOML file in conf/")
    apply.add_argument("--bucket", help="only this bucket")
    apply.add_argument("--collection", metavar="SCOPE.NAME", help="only this collection")
    apply.set_defaults(func=cmd_apply)

    check = sub.add_parser(
        "check", help="data-quality suites; exit 1 if an error expectation fails"
    )
    check.add_argument("--config", required=True, help="a TOML file in conf/")
    check.add_argument("--bucket", help="only this bucket")
    check.add_argument("--screenshot", action="store_true",
                       help="also save summary.png of the report (headless Chromium)")  # fmt: skip
    check.set_defaults(func=cmd_check)

    sql = sub.add_parser("sql", help="run a SQL query against the catalog")
    sql.add_argument("query")
    sql.add_argument("--config", help="a TOML file in conf/ (default: conf/local.toml)")
    sql.add_argument("--limit", type=int, default=50, help="rows to print")
    sql.set_defaults(func=cmd_sql)
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
