"""Bronze ingest end to end: capture files → ``bronze.<bucket>_events``, events per second.

The captures are those of the decode benchmark (benchmarks/corpus.py: one session, 64 MiB
files). Each run ingests them into a fresh warehouse with the product's own entry point
(``pipelines.bronze.job.ingest_bucket``, default ingest settings, ``local[2]``) and checks
the events table holds every frame. While it runs, a sampler reads the resident memory of
the process tree every 0.2 s: this Python driver, the JVM (in local mode the driver and the
executor are one JVM) and the Python workers, and adds up their CPU seconds (on a shared
machine, CPU seconds move less than wall seconds); the JVM's heap peak comes from Spark's
own executor metrics in the event log. Each size runs in its own process (its own JVM), on
tables created before the timed run (a bucket's tables are created once).

Both writers of the events' Parquet files run (``[ingest] writer``): ``arrow``, the decode
tasks write them (the default), and ``spark``, Spark's Delta writer (what bronze used before):
one run of the benchmark gives the before and the after. The arrow writer runs with both
JITs of an ingest JVM (``[ingest] jvm_jit``): ``c1`` (the default) and ``tiered``; Spark's
writer always runs tiered (the setting applies to the arrow writer only).

    python -m benchmarks.ingest [--events 1000000 --events 10000000] [--runs 1]
        [--writer arrow --writer spark] [--jvm-jit c1 --jvm-jit tiered] [--event-log DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from benchmarks.common import Case, report
from benchmarks.corpus import DATA, captures
from dcp_cdc.config import AppConfig, BucketConfig, IngestConfig
from pipelines.bronze.job import ingest_bucket
from pipelines.bronze.store import ensure_tables
from pipelines.tables import BucketTables

BUCKET = "bench"


class Sampler:
    """Peak resident memory and CPU seconds of this process and its descendants, by kind
    (this Python driver, the JVM, the Python workers), sampled every ``interval`` seconds."""

    KINDS = ("driver_python", "jvm", "python_workers")

    def __init__(self, interval: float = 0.2) -> None:
        self.interval = interval
        self.peak = dict.fromkeys((*self.KINDS, "total"), 0)
        self.cpu = dict.fromkeys(self.KINDS, 0.0)
        self._seen: dict[int, float] = {}  # pid -> CPU seconds at the last sample
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._sample(count_cpu=False)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def _sample(self, *, count_cpu: bool = True) -> None:
        me = psutil.Process()
        sizes = dict.fromkeys(self.KINDS, 0)
        for proc in (me, *me.children(recursive=True)):
            try:
                kind = (
                    "driver_python"
                    if proc.pid == me.pid
                    else "jvm"
                    if "java" in proc.name()
                    else "python_workers"
                )
                sizes[kind] += proc.memory_info().rss
                times = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            used = times.user + times.system
            if count_cpu:
                self.cpu[kind] += used - self._seen.get(proc.pid, 0.0)  # new: all of it
            self._seen[proc.pid] = used
        for kind, size in (*sizes.items(), ("total", sum(sizes.values()))):
            self.peak[kind] = max(self.peak[kind], size)


def heap_peak(event_log_dir: Path, app_id: str) -> int | None:
    """The JVM heap peak Spark recorded for the application (bytes), if it logged one."""
    path = event_log_dir / app_id
    if not path.exists():
        return None
    peak = 0
    with open(path) as fh:
        for line in fh:
            if '"JVMHeapMemory"' not in line:
                continue
            event = json.loads(line)
            for metrics in _executor_metrics(event):
                peak = max(peak, int(metrics.get("JVMHeapMemory", 0)))
    return peak or None


def _executor_metrics(event: dict[str, Any]) -> list[dict[str, Any]]:
    """Executor metrics an event carries: task ends carry the executor's peaks so far."""
    found = []
    for key in ("Task Executor Metrics", "Executor Metrics", "Stage Executor Metrics"):
        value = event.get(key)
        if isinstance(value, dict):
            found.append(value)
    return found


def measure(n_events: int, runs: int, event_log: Path, writer: str, jit: str) -> dict[str, Any]:
    """Runs of one size in this process (one JVM), on a fresh warehouse."""
    from pipelines.lake.spark_session import build_spark_session, ingest_jvm_conf, merge_conf

    corpus = captures(n_events)
    warehouse = DATA / f"ingest-warehouse-{n_events}"
    shutil.rmtree(warehouse, ignore_errors=True)
    event_log.mkdir(parents=True, exist_ok=True)
    config = AppConfig(
        landing=str(corpus.landing),
        warehouse=str(warehouse),
        buckets=[BucketConfig(name=BUCKET)],
        ingest=IngestConfig(writer=writer, jvm_jit=jit),  # type: ignore[arg-type]
    )
    spark = build_spark_session(  # as `dcp-cdc ingest` builds it, with an event log
        "dcp-cdc-bench-ingest",
        warehouse,
        master="local[2]",
        extra_conf=merge_conf(
            {
                "spark.eventLog.enabled": "true",
                "spark.eventLog.dir": str(event_log),
                "spark.eventLog.compress": "false",
                "spark.eventLog.rolling.enabled": "false",
            },
            ingest_jvm_conf(config),
        ),
    )
    seconds, peaks, cpu, setup = [], [], [], []
    try:
        for _ in range(runs):
            for table in BucketTables(BUCKET).bronze.values():
                spark.sql(f"DROP TABLE IF EXISTS {table}")
            started = time.perf_counter()  # a bucket's tables are created once: not timed
            ensure_tables(spark, config, BUCKET)
            setup.append(time.perf_counter() - started)
            with Sampler() as sampler:
                started = time.perf_counter()
                summary = ingest_bucket(spark, config, config.buckets[0])
                seconds.append(time.perf_counter() - started)
            peaks.append(dict(sampler.peak))
            cpu.append(dict(sampler.cpu))
            stored = spark.table(BucketTables(BUCKET).events).count()
            assert summary.frames == stored == n_events, (summary.frames, stored, n_events)
            print(
                f"  {n_events:,} events ({writer} writer, {jit} JIT): {seconds[-1]:.1f} s, CPU s "
                + ", ".join(f"{k} {v:,.1f}" for k, v in sampler.cpu.items())
                + "; peak RSS "
                + ", ".join(f"{k} {v / 2**20:,.0f} MiB" for k, v in sampler.peak.items()),
                flush=True,
            )
        app_id = spark.sparkContext.applicationId
    finally:
        spark.stop()
    shutil.rmtree(warehouse, ignore_errors=True)
    return {
        "events": n_events,
        "seconds": seconds,
        "peak_rss_bytes": peaks,
        "cpu_s": cpu,
        "create_tables_s": setup,
        "jvm_heap_peak_bytes": heap_peak(event_log, app_id),
        "event_log": str(event_log / app_id),
        "files": len(corpus.files),
        "frame_bytes": corpus.frame_bytes,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.ingest", description=__doc__)
    parser.add_argument(
        "--events",
        type=int,
        action="append",
        help="capture size in events (repeatable; default 1M and 10M)",
    )
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument(
        "--writer",
        choices=["arrow", "spark"],
        action="append",
        help="who writes the Parquet files (repeatable; default both)",
    )
    parser.add_argument(
        "--event-log",
        type=Path,
        default=DATA / "spark-events",
        help="where Spark writes its event log (for the Spark UI history)",
    )
    parser.add_argument(
        "--jvm-jit",
        choices=["c1", "tiered"],
        action="append",
        help="[ingest] jvm_jit (repeatable; default both with the arrow writer; Spark's writer "
        "keeps tiered whatever this says)",
    )
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # child: write results here
    args = parser.parse_args(argv)
    sizes = args.events or [1_000_000, 10_000_000]
    writers = args.writer or ["arrow", "spark"]
    if args.one:
        jit = (args.jvm_jit or ["c1"])[0]
        result = measure(sizes[0], args.runs, args.event_log, writers[0], jit)
        args.one.write_text(json.dumps(result))
        return
    load_before = os.getloadavg()
    cases = []
    # each size, writer and JIT in its own process: its own JVM, its own memory peak
    runs = [
        (n, w, jit)
        for n in sizes
        for w in writers
        for jit in args.jvm_jit or (["c1", "tiered"] if w == "arrow" else ["tiered"])
    ]
    for n_events, writer, jit in runs:
        out = DATA / f"ingest-{n_events}-{writer}-{jit}.json"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "benchmarks.ingest",
                "--events",
                str(n_events),
                "--runs",
                str(args.runs),
                "--event-log",
                str(args.event_log),
                "--writer",
                writer,
                "--jvm-jit",
                jit,
                "--one",
                str(out),
            ],
            check=True,
        )
        result = json.loads(out.read_text())
        cases.append(
            Case(
                f"capture → bronze, {n_events // 1_000_000}M events, {writer} writer, {jit}",
                n_events,
                "events",
                result["seconds"],
                nbytes=result["frame_bytes"],
                extra={
                    k: result[k]
                    for k in (
                        "cpu_s",
                        "peak_rss_bytes",
                        "jvm_heap_peak_bytes",
                        "event_log",
                        "files",
                        "create_tables_s",
                    )
                },
            )
        )
    params = {
        "runs": args.runs,
        "master": "local[2]",
        "load_avg_before": load_before,
        "load_avg_after": os.getloadavg(),
    }
    report("ingest", cases, params=params)
    for case in cases:
        peak = max(case.extra["peak_rss_bytes"], key=lambda p: p["total"])
        heap = case.extra["jvm_heap_peak_bytes"]
        cpu = min(case.extra["cpu_s"], key=lambda c: sum(c.values()))
        total_cpu = sum(cpu.values())
        print(
            f"  {case.name}: CPU {total_cpu:,.1f} s ({case.items / total_cpu:,.0f} events per "
            "CPU-second; " + ", ".join(f"{k} {v:,.1f} s" for k, v in cpu.items()) + ")"
        )
        print(
            f"  {case.name}: peak RSS "
            + ", ".join(f"{k} {v / 2**20:,.0f} MiB" for k, v in peak.items())
            + (f"; JVM heap peak {heap / 2**20:,.0f} MiB" if heap else "")
        )


if __name__ == "__main__":
    main()
