"""The ``dcp-cdc`` command line.

Subcommands stay thin: they parse arguments and call the library (or, for Spark jobs, the
``pipelines`` entry points, imported lazily so ``decode`` starts fast).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from dcp_cdc.capture import EXTENSION, iter_capture, iter_stream, read_capture_header
from dcp_cdc.errors import DcpError, MalformedFrameError
from dcp_cdc.events import Event
from dcp_cdc.render import error_to_json, event_to_json

if TYPE_CHECKING:
    from dcp_cdc.config import AppConfig
    from pipelines.quality.report import QualityReport


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
THRIFT_SERVER_CLASS = "org.apache.spark.sql.hive.thriftserver.HiveThriftServer2"


class _Step:
    """One numbered step of a long command: its line, a running clock while it works (on a
    terminal), and how long it took."""

    def __init__(self, out: TextIO, number: int, total: int, label: str) -> None:
        self.out, self.line = out, f"[{number}/{total}] {label}"
        self.done = threading.Event()
        self.ticker: threading.Thread | None = None

    def __enter__(self) -> _Step:
        self.started = time.perf_counter()
        self.out.write(self.line + " ...")
        self.out.flush()
        if self.out.isatty():
            self.ticker = threading.Thread(target=self._tick, daemon=True)
            self.ticker.start()
        return self

    def _tick(self) -> None:
        while not self.done.wait(1.0):
            self.out.write(f"\r{self.line} ... {time.perf_counter() - self.started:.0f} s")
            self.out.flush()

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        if self.ticker is not None:
            self.ticker.join()
        seconds = time.perf_counter() - self.started
        ending = "done" if exc[0] is None else "FAILED"
        # a log (no terminal) gets one line per step; a terminal has its ticking line redrawn
        again = f"\r{self.line} ... " if self.ticker is not None else " "
        self.out.write(f"{again}{ending} in {seconds:.1f} s\n")
        self.out.flush()


def _indent(text: str, prefix: str = "      ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


def _command_name() -> str:
    """How the reader calls this command again: ``dcp-cdc`` if it is on the PATH."""
    if shutil.which("dcp-cdc"):
        return "dcp-cdc"
    beside = Path(sys.executable).with_name("dcp-cdc")
    try:
        return str(beside.relative_to(Path.cwd()))
    except ValueError:
        return str(beside)


def _load(args: argparse.Namespace) -> AppConfig:
    """``--config`` (default ``conf/local.toml``), with ``--warehouse`` over its warehouse."""
    from dcp_cdc.config import load_config

    overrides = {"warehouse": str(Path(args.warehouse).resolve())} if args.warehouse else {}
    return load_config(args.config or DEFAULT_CONFIG, **overrides)


def cmd_run(args: argparse.Namespace, out: TextIO) -> int:
    """The main job. Without ``--config``: simulate a small bucket into ``--workdir`` (fresh
    each time) and run the pipeline on a local warehouse there; with it, run on real data.
    Exit 1 when a quality check of severity error failed (the data stay)."""
    from dcp_cdc.config import load_config
    from dcp_cdc.simulator import SimConfig, simulate

    simulated = not args.config
    total = 5 if simulated else 4
    number = iter(range(1, total + 1))
    if args.config:
        config = load_config(args.config)
    else:
        target = Path(args.workdir).resolve()
        for folder in ("landing", "truth", "warehouse"):  # the embedded demo starts afresh
            shutil.rmtree(target / folder, ignore_errors=True)
        config = load_config(
            DEFAULT_CONFIG, landing=str(target / "landing"), warehouse=str(target / "warehouse")
        )
        sim = SimConfig(scenario="mixed", seed=1, bucket=config.buckets[0].name, vbuckets=16,
                        docs=400, ops=2000, inject_malformed=1)  # fmt: skip
        with _Step(out, next(number), total, f"simulating bucket {sim.bucket!r} "
                   f"({sim.scenario} scenario, seed {sim.seed})"):  # fmt: skip
            result = simulate(target, sim)
        out.write(f"      {result.frames:,} DCP frames in {len(result.files)} capture files "
                  f"under {target / 'landing'}\n")  # fmt: skip
        # the sample carries malformed frames on purpose, to show the quarantine: the
        # quality threshold allows those, and only those
        quality = config.quality.model_copy(update={"quarantine_threshold": sim.inject_malformed})
        config = config.model_copy(update={"quality": quality})
    buckets = [b.name for b in config.bucket(args.bucket)]

    from pipelines.bronze.job import run as ingest
    from pipelines.catalog import bucket_overview
    from pipelines.quality.job import run as check
    from pipelines.silver.job import run as apply
    from pipelines.spark_session import session_for

    with _Step(out, next(number), total, f"starting Spark ({config.spark.master}) on "
               f"{config.warehouse}"):  # fmt: skip
        spark = session_for(config, "dcp-cdc-run")
    with _Step(out, next(number), total, "ingesting capture files into bronze"):
        ingested = ingest(config, args.bucket, spark=spark)
    out.write("".join(_indent(s.render()) + "\n" for s in ingested))
    with _Step(out, next(number), total, "applying bronze to silver (MERGE per collection)"):
        applied = apply(config, args.bucket, spark=spark)
    out.write("".join(_indent(s.render()) + "\n" for s in applied))
    with _Step(out, next(number), total, "checking data quality"):
        reports = check(config, args.bucket, spark=spark, screenshot=args.screenshot)

    cli = _command_name()
    default_warehouse = load_config(DEFAULT_CONFIG).warehouse
    where = "" if config.warehouse == default_warehouse else f" --warehouse {config.warehouse}"
    where += f" --config {args.config}" if args.config else ""
    for bucket in buckets:
        overview = bucket_overview(spark, bucket)
        out.write(f"\n=== bucket {bucket!r} ===\n\n{overview.render()}\n\n")
        for report in (r for r in reports if r.bucket == bucket):
            out.write(_verdict(report) + "\n")
        sample = next((c.table for c in overview.collections if c.live), None)
        out.write("\nTry (the tables are in the catalog under "
                  f"{config.warehouse}):\n"
                  f"  {cli} tables{where}\n"
                  f'  {cli} sql{where} "SELECT op, count(*) AS n FROM {overview.events_table} '
                  f'GROUP BY op ORDER BY n DESC"\n')  # fmt: skip
        if sample:
            out.write(f'  {cli} sql{where} "SELECT key, _seqno, _change, doc FROM {sample} '
                      f'ORDER BY _seqno DESC LIMIT 5"\n')  # fmt: skip
    return 0 if all(r.passed for r in reports) else 1


def _verdict(report: QualityReport) -> str:
    """A quality report in the run summary: the verdict, what failed, where to read more."""
    met = sum(1 for o in report.outcomes if o.success)
    verdict = "PASSED" if report.passed else f"FAILED ({len(report.failed_errors)} errors)"
    lines = [f"Quality: {verdict}, {met} of {len(report.outcomes)} expectations met"
             + (f", warnings: {', '.join(report.failed_warnings)}" if report.failed_warnings else "")]  # fmt: skip
    lines += [f"  error: {key}" for key in report.failed_errors]
    lines += [f"  report:    {report.report_path}", f"  data docs: {report.data_docs_path}",
              f"  results:   {report.results_table}"]  # fmt: skip
    return "\n".join(lines)


def cmd_apply(args: argparse.Namespace, out: TextIO) -> int:
    from dcp_cdc.config import load_config
    from pipelines.silver.job import run as apply

    config = load_config(args.config)
    for summary in apply(config, args.bucket, collection=args.collection, rebuild=args.rebuild):
        out.write(summary.render() + "\n")
    return 0


def _print_table(out: TextIO, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    out.write(" | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip() + "\n")
    out.write("-+-".join("-" * w for w in widths) + "\n")
    for r in rows:
        out.write(" | ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() + "\n")


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
    from pipelines.spark_session import session_for

    spark = session_for(_load(args), "dcp-cdc-sql")
    rows = spark.sql(args.query).limit(args.limit + 1).collect()
    columns = rows[0].__fields__ if rows else []
    cells = [[("NULL" if v is None else str(v))[:80] for v in row] for row in rows[: args.limit]]
    _print_table(out, columns, cells)
    more = " (more not shown)" if len(rows) > args.limit else ""
    out.write(f"({len(cells)} rows{more})\n")
    return 0


def cmd_tables(args: argparse.Namespace, out: TextIO) -> int:
    """Bronze, silver and quality tables with their row counts."""
    from pipelines.catalog import list_tables
    from pipelines.spark_session import session_for

    config = _load(args)
    tables = list_tables(session_for(config, "dcp-cdc-tables"))
    _print_table(
        out,
        ["layer", "table", "kind", "rows"],
        [[t.layer, t.name, t.kind, f"{t.rows:,}"] for t in tables],
    )
    out.write(f"({len(tables)} tables and views in the catalog of {config.warehouse}; a view "
              "holds a collection's live documents, its _all table tombstones too)\n")  # fmt: skip
    return 0


def cmd_maintain(args: argparse.Namespace, out: TextIO) -> int:
    from dcp_cdc.config import load_config
    from pipelines.maintenance import run as maintain

    for summary in maintain(load_config(args.config), args.bucket):
        out.write(summary.render() + "\n")
    return 0


def _launch_conf(args: argparse.Namespace, app_name: str) -> dict[str, str]:
    from pipelines.spark_session import launch_conf

    config = _load(args)
    return launch_conf(config, app_name, master=config.spark.master)


def cmd_spark_conf(args: argparse.Namespace, out: TextIO) -> int:
    """The catalog's settings as a Spark properties file, for ``spark-sql``, ``pyspark`` and
    ``spark-submit --properties-file``."""
    from pipelines.spark_session import properties_text

    text = properties_text(_launch_conf(args, "dcp-cdc-shell"))
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
        out.write(f"wrote {args.out}: use it with spark-sql, pyspark or spark-submit "
                  f"--properties-file {args.out}\n")  # fmt: skip
    else:
        out.write(text)
    return 0


def cmd_thrift_server(args: argparse.Namespace, out: TextIO) -> int:
    """Serve the catalog over JDBC/ODBC (HiveServer2 protocol) until stopped."""
    import subprocess
    import tempfile

    from pipelines.spark_session import properties_text

    conf = _launch_conf(args, "dcp-cdc-thrift-server")
    with tempfile.NamedTemporaryFile("w", suffix=".conf", prefix="dcp-cdc-") as props:
        props.write(properties_text(conf))
        props.flush()
        command = [
            _spark_script("spark-submit"), "--properties-file", props.name,
            "--class", THRIFT_SERVER_CLASS, "spark-internal",
            "--hiveconf", f"hive.server2.thrift.port={args.port}",
            "--hiveconf", f"hive.server2.thrift.bind.host={args.host}",
        ]  # fmt: skip
        out.write(f"serving {conf['spark.sql.warehouse.dir']} on jdbc:hive2://{args.host}:"
                  f"{args.port}/ (Ctrl-C stops)\n")  # fmt: skip
        out.flush()
        return subprocess.call(command)


def _spark_script(name: str) -> str:
    """A launcher script of the installed pyspark (``spark-submit``, ``beeline``, ...)."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise DcpError("pyspark is not installed for this Python: run `make setup`")
    return str(Path(spec.origin).parent / "bin" / name)


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
    run.add_argument("--screenshot", action="store_true",
                     help="also save the quality report as summary.png (headless Chromium)")  # fmt: skip
    run.set_defaults(func=cmd_run)

    ingest = sub.add_parser("ingest", help="new capture files into bronze Delta tables")
    ingest.add_argument("--config", required=True, help="a TOML file in conf/")
    ingest.add_argument("--bucket", help="only this bucket")
    ingest.set_defaults(func=cmd_ingest)

    apply = sub.add_parser("apply", help="bronze events into silver tables (MERGE)")
    apply.add_argument("--config", required=True, help="a TOML file in conf/")
    apply.add_argument("--bucket", help="only this bucket")
    apply.add_argument("--collection", metavar="SCOPE.NAME", help="only this collection")
    apply.add_argument("--rebuild", action="store_true",
                       help="a backfill: empty the tables (or --collection's) and apply all of "
                            "bronze again")  # fmt: skip
    apply.set_defaults(func=cmd_apply)

    check = sub.add_parser(
        "check", help="data-quality suites; exit 1 if an error expectation fails"
    )
    check.add_argument("--config", required=True, help="a TOML file in conf/")
    check.add_argument("--bucket", help="only this bucket")
    check.add_argument("--screenshot", action="store_true",
                       help="also save summary.png of the report (headless Chromium)")  # fmt: skip
    check.set_defaults(func=cmd_check)

    catalog = argparse.ArgumentParser(add_help=False)
    catalog.add_argument("--config", help="a TOML file in conf/ (default: conf/local.toml)")
    catalog.add_argument("--warehouse", help="this warehouse instead of the configuration's")

    sql = sub.add_parser("sql", parents=[catalog], help="run a SQL query against the catalog")
    sql.add_argument("query")
    sql.add_argument("--limit", type=int, default=50, help="rows to print")
    sql.set_defaults(func=cmd_sql)

    tables = sub.add_parser("tables", parents=[catalog],
                            help="bronze, silver and quality tables with row counts")  # fmt: skip
    tables.set_defaults(func=cmd_tables)

    maintain = sub.add_parser("maintain", help="OPTIMIZE, VACUUM, tombstone purge, retention")
    maintain.add_argument("--config", required=True, help="a TOML file in conf/")
    maintain.add_argument("--bucket", help="only this bucket")
    maintain.set_defaults(func=cmd_maintain)

    conf = sub.add_parser("spark-conf", parents=[catalog],
                          help="the catalog's Spark settings for spark-sql, pyspark, spark-submit")  # fmt: skip
    conf.add_argument("--out", help="write them to this properties file (default: print)")
    conf.set_defaults(func=cmd_spark_conf)

    thrift = sub.add_parser("thrift-server", parents=[catalog],
                            help="serve the catalog over JDBC (Spark Thrift server)")  # fmt: skip
    thrift.add_argument("--port", type=int, default=10000)
    thrift.add_argument("--host", default="127.0.0.1", help="address to listen on")
    thrift.set_defaults(func=cmd_thrift_server)
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
