"""``dcp-cdc run``: the whole pipeline in one process, and the summary a newcomer reads.

Without ``--config`` it is the embedded demo: a small simulated bucket in ``--workdir`` (fresh
each time), then ingest, apply and check on a local warehouse there. With ``--config`` it runs
the same steps on that configuration's landing data.

Without ``--config``, every verb that takes an optional one (``run``, ``sql``, ``tables``,
``spark-conf``, ``thrift-server``) uses :func:`local_config`: ``$DCP_CDC_CONFIG``, else
``./conf/local.toml`` when the working directory has one (a checkout), else the same settings
built in, so that an installed package runs the demo and finds its warehouse from any folder.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from dcp_cdc.config import AppConfig, find_config, load_config

if TYPE_CHECKING:
    from pipelines.quality.report import QualityReport

DEFAULT_WORKDIR = "work"
DEMO_BUCKET = "travel-sample"


def local_config(**overrides: object) -> AppConfig:
    """The configuration when none is named: the file :func:`dcp_cdc.config.find_config`
    finds (``$DCP_CDC_CONFIG``, else ``./conf/local.toml``), else the settings of
    ``conf/local.toml`` built in (bucket ``travel-sample``, data under ``./work/``).

    The built-in copy keeps an installed package working outside a checkout; a unit test
    keeps it equal to the checkout's ``conf/local.toml``."""
    found = find_config()
    if found is not None:
        return load_config(found, **overrides)
    work = Path(DEFAULT_WORKDIR).resolve()
    raw: dict[str, object] = {
        "landing": str(work / "landing"),
        "warehouse": str(work / "warehouse"),
        "buckets": [{"name": DEMO_BUCKET}],
    }
    return AppConfig.model_validate(raw | overrides)


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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``dcp-cdc run`` besides ``--bucket``; the check step's flags too."""
    from pipelines.quality.job import add_arguments as check_arguments

    parser.add_argument(
        "--workdir", default=DEFAULT_WORKDIR, help="where the embedded demo's data go"
    )
    parser.add_argument("--config", help="a TOML file in conf/: run on its landing data instead")
    check_arguments(parser)


def command(args: argparse.Namespace, out: TextIO) -> int:
    """The main job. Without ``--config``: simulate a small bucket into ``--workdir`` (fresh
    each time) and run the pipeline on a local warehouse there; with it, run on real data.
    Exit 1 when a quality check of severity error failed (the data stay)."""
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
        config = local_config(landing=str(target / "landing"), warehouse=str(target / "warehouse"))
        sim = SimConfig(
            scenario="mixed",
            seed=1,
            bucket=config.buckets[0].name,
            vbuckets=16,
            docs=400,
            ops=2000,
            inject_malformed=1,
        )
        with _Step(
            out,
            next(number),
            total,
            f"simulating bucket {sim.bucket!r} ({sim.scenario} scenario, seed {sim.seed})",
        ):
            result = simulate(target, sim)
        out.write(
            f"      {result.frames:,} DCP frames in {len(result.files)} capture files "
            f"under {target / 'landing'}\n"
        )
        # the sample carries malformed frames on purpose, to show the quarantine: the
        # quality threshold allows those, and only those
        quality = config.quality.model_copy(update={"quarantine_threshold": sim.inject_malformed})
        config = config.model_copy(update={"quality": quality})
    buckets = [b.name for b in config.bucket(args.bucket)]

    from pipelines.bronze.job import check_landing
    from pipelines.bronze.job import run as ingest
    from pipelines.catalog import bucket_overview
    from pipelines.quality.job import run as check
    from pipelines.silver.job import run as apply
    from pipelines.spark_session import session_for

    check_landing(config, config.bucket(args.bucket), args.config)  # before Spark starts
    with _Step(
        out, next(number), total, f"starting Spark ({config.spark.master}) on {config.warehouse}"
    ):
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
    default_warehouse = local_config().warehouse
    where = "" if config.warehouse == default_warehouse else f" --warehouse {config.warehouse}"
    where += f" --config {args.config}" if args.config else ""
    for bucket in buckets:
        overview = bucket_overview(spark, bucket)
        out.write(f"\n=== bucket {bucket!r} ===\n\n{overview.render()}\n\n")
        for report in (r for r in reports if r.bucket == bucket):
            out.write(_verdict(report) + "\n")
        sample = next((c.table for c in overview.collections if c.live), None)
        out.write(
            "\nTry (the tables are in the catalog under "
            f"{config.warehouse}):\n"
            f"  {cli} tables{where}\n"
            f'  {cli} sql{where} "SELECT op, count(*) AS n FROM {overview.events_table} '
            f'GROUP BY op ORDER BY n DESC"\n'
        )
        if sample:
            out.write(
                f'  {cli} sql{where} "SELECT key, _seqno, _change, doc FROM {sample} '
                f'ORDER BY _seqno DESC LIMIT 5"\n'
            )
    return 0 if all(r.passed for r in reports) else 1


def _verdict(report: QualityReport) -> str:
    """A quality report in the run summary: the verdict, what failed, where to read more."""
    met = sum(1 for o in report.outcomes if o.success)
    verdict = "PASSED" if report.passed else f"FAILED ({len(report.failed_errors)} errors)"
    lines = [
        f"Quality: {verdict}, {met} of {len(report.outcomes)} expectations met"
        + (f", warnings: {', '.join(report.failed_warnings)}" if report.failed_warnings else "")
    ]
    lines += [f"  error: {key}" for key in report.failed_errors]
    lines += [
        f"  report:    {report.report_path}",
        f"  data docs: {report.data_docs_path}",
        f"  results:   {report.results_table}",
    ]
    return "\n".join(lines)
