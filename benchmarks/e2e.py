"""End to end: simulate → ingest → apply → check for about 1M events, each stage timed.

One Spark session serves the three Spark stages, as ``dcp-cdc run`` does (the apply reads
the run's frames from the files the ingest wrote); its start-up is reported as a stage of its
own. 1,024 vbuckets by default (Couchbase's). The simulated bucket is the ``mixed`` scenario. With
``--history`` every collection also keeps a history table (``[[buckets]] history = true``):
the apply stage then shows what history costs.
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.common import Case, Stages, report

DATA = Path(__file__).resolve().parent / ".data" / "e2e"


def run_once(events: int, vbuckets: int, work: Path, *, history: bool = False) -> dict[str, Any]:
    from dcp_cdc.config import AppConfig, BucketConfig
    from dcp_cdc.simulator import simulate
    from pipelines.bronze.job import ingest_bucket
    from pipelines.bronze.memory import IngestMemory
    from pipelines.lake.spark_session import build_spark_session
    from pipelines.quality.job import check_bucket
    from pipelines.silver.job import apply_bucket
    from pipelines.silver.memory import ApplyMemory

    shutil.rmtree(work, ignore_errors=True)
    stages = Stages(12)
    stage = stages.end

    t = time.perf_counter()
    sim = simulate(
        work / "sim",
        bucket="bench",
        scenario="mixed",
        seed=1,
        vbuckets=vbuckets,
        docs=max(1000, events // 10),
        ops=events,
        versions=False,  # no history truth: only the live documents are checked
    )
    t = stage("simulate", t)
    config = AppConfig(
        landing=str(work / "sim" / "landing"),
        warehouse=str(work / "warehouse"),
        buckets=[BucketConfig(name="bench", history=history)],
    )
    spark = build_spark_session("dcp-cdc-bench-e2e", config.warehouse)
    try:
        t = stage("spark start", t)
        memory = IngestMemory()
        ingest_bucket(spark, config, config.buckets[0], memory=memory)
        t = stage("ingest", t)
        applied = apply_bucket(spark, config, config.buckets[0], memory=ApplyMemory(ingest=memory))
        t = stage("apply", t)
        quality = check_bucket(spark, config, config.buckets[0])
        stage("check", t)
    finally:
        spark.stop()
    return {
        "frames": sim.frames,
        "bytes": sim.bytes,
        "stages": stages,
        "changes": applied.changes,
        "versions": sum(applied.history.values()),
        "quality_passed": quality.passed,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.e2e", description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000, help="simulated operations")
    parser.add_argument("--vbuckets", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--history", action="store_true", help="history tables on")
    args = parser.parse_args(argv)
    # Each run in a process of its own, as a scheduled run is: the JVM keeps a stopped
    # session's catalog, which still names the tables the next run's fresh warehouse lacks.
    spawn = multiprocessing.get_context("spawn")
    results = []
    for _ in range(args.runs):
        with ProcessPoolExecutor(1, mp_context=spawn) as process:
            run = process.submit(run_once, args.events, args.vbuckets, DATA, history=args.history)
            results.append(run.result())
    frames = results[-1]["frames"]
    names = list(results[-1]["stages"])
    totals = [sum(r["stages"].values()) for r in results]
    cases = [
        Case(
            "total: simulate → check", frames, "frames", totals, results[-1]["bytes"], baseline=True
        )
    ]
    cases += [
        Case(
            name,
            frames,
            "frames",
            [r["stages"][name] for r in results],
            extra={"share": sum(r["stages"][name] for r in results) / sum(totals)},
        )
        for name in names
    ]
    report(
        "e2e",
        cases,
        params=vars(args)
        | {
            "changes": results[-1]["changes"],
            "versions": results[-1]["versions"],
            "quality_passed": results[-1]["quality_passed"],
        },
    )
    print(
        "  share of the total: " + ", ".join(f"{c.name} {c.extra['share']:.0%}" for c in cases[1:])
    )


if __name__ == "__main__":
    main()
