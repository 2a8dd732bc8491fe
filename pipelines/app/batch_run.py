"""``dcp-cdc run``: the whole pipeline in one process, and the summary a newcomer reads.

Capture (the embedded demo, :mod:`pipelines.app.demo`, when no configuration is given), then
ingest, apply and check in one Spark session, each a numbered step with its time; then, per
bucket, its overview, the quality verdict and commands to try next.
"""

from __future__ import annotations

import shutil
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

from dcp_cdc.config import load_config
from dcp_cdc.logs import configure_logging_from
from pipelines.app.demo import DEMO_NODES, demo_capture, demo_simulation, fresh_workdir
from pipelines.bronze.job import run as ingest
from pipelines.bronze.landing import check_landing
from pipelines.bronze.memory import IngestMemory
from pipelines.catalog.contents import bucket_overview, bucket_overview_read
from pipelines.lake import delta_io, spark_session
from pipelines.quality.job import run as check
from pipelines.quality.report import QualityReport
from pipelines.quality.validate import import_soon
from pipelines.silver.job import run as apply
from pipelines.silver.memory import ApplyMemory
from pipelines.tables import BucketTables


class Step:
    """One numbered step of a long command: its line, a running clock while it works (on a
    terminal), and how long it took."""

    def __init__(self, out: TextIO, number: int, total: int, label: str) -> None:
        self.out, self.line = out, f"[{number}/{total}] {label}"
        self.done = threading.Event()
        self.ticker: threading.Thread | None = None

    def __enter__(self) -> Step:
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


def run(
    out: TextIO,
    *,
    config_file: str | None,
    workdir: str,
    bucket: str | None = None,
    screenshot: bool = False,
) -> int:
    """The main job. Without ``config_file``: simulate a small bucket into ``workdir`` (fresh
    each time) and run the pipeline on a local warehouse there; with it, run on real data.
    Exit 1 when a quality check of severity error failed (the data stay)."""
    simulated = not config_file
    total = 5 if simulated else 4
    number = iter(range(1, total + 1))
    if config_file:
        config = load_config(config_file)
        configure_logging_from(config)
    else:
        target, config = fresh_workdir(workdir)
        configure_logging_from(config)
        sim = demo_simulation(config.buckets[0].name)
        with Step(
            out,
            next(number),
            total,
            f"capturing bucket {sim.bucket!r} over DCP from {DEMO_NODES} simulated data nodes "
            f"on 127.0.0.1 (live workload, seed {sim.seed})",
        ):
            followed, bounded = demo_capture(target, sim)
        files = sorted(target.joinpath("landing").glob("*.dcpcap"))
        size = sum(f.stat().st_size for f in files)
        out.write(
            f"      followed {sim.ops:,} live changes through a failover and a rebalance "
            f"({followed.rollbacks + bounded.rollbacks} rollbacks, "
            f"{followed.moves + bounded.moves} moved vbuckets), then "
            f"{len(bounded.done)} vbuckets up to now: {len(files)} capture files, {size:,} bytes "
            f"under {target / 'landing'}\n"
        )
    buckets = [b.name for b in config.bucket(bucket)]

    check_landing(config, config.bucket(bucket), config_file)  # before Spark starts
    import_soon()  # Great Expectations' seconds of import, while the JVM starts and works
    with Step(
        out, next(number), total, f"starting Spark ({config.spark.master}) on {config.warehouse}"
    ):
        spark = spark_session.session_for(config, "dcp-cdc-run")
    # what ingest wrote, kept for the apply: it finds the run in the log's rows and reads
    # the run's frames from the files it wrote, not from the tables
    kept = {name: IngestMemory() for name in buckets}
    with Step(out, next(number), total, "ingesting capture files into bronze"):
        ingested = ingest(config, bucket, spark=spark, memories=kept)
    out.write("".join(_indent(s.render()) + "\n" for s in ingested))
    how = "through the live layer" if config.silver.live_layer else "MERGE per collection"
    with Step(out, next(number), total, f"applying bronze to silver ({how})"):
        memories = {name: ApplyMemory(ingest=m) for name, m in kept.items()}
        applied = apply(config, bucket, spark=spark, memories=memories)
    out.write("".join(_indent(s.render()) + "\n" for s in applied))
    with Step(out, next(number), total, "checking data quality"):
        reports = check(config, bucket, spark=spark, screenshot=screenshot)

    cli = _command_name()
    default_warehouse = load_config(None).warehouse
    where = "" if config.warehouse == default_warehouse else f" --warehouse {config.warehouse}"
    where += f" --config {config_file}" if config_file else ""
    for name in buckets:
        events = BucketTables(name).events
        size = delta_io.table_size(spark, events)[1] if spark.catalog.tableExists(events) else 0
        if size < config.quality.on_driver_below_bytes:
            overview = bucket_overview_read(spark, name)
        else:
            interpreted = size < config.spark.interpreted_below_bytes
            plain = delta_io.static_plan_session(spark, interpreted=interpreted)
            overview = bucket_overview(plain, name)
        out.write(f"\n=== bucket {name!r} ===\n\n{overview.render()}\n\n")
        for report in (r for r in reports if r.bucket == name):
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
