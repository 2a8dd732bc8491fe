"""What a quality check costs after a run that adds a little to a large bronze table: the
check from the last check's state against a check over everything, on the same tables.

A scenario is simulated (``--scenario``, ``basic``: ``mixed`` holds failovers and drops,
after which a check reads everything; ``--events`` operations on ``--vbuckets`` vbuckets);
all its capture files but the last ``--percent`` of its frames are ingested, applied and
checked (over everything: no state yet); then the rest arrives, is ingested and applied, and
the check's metric frames are computed four times on the same tables: from the state
(Spark's, ``quality.incremental_from_bytes``), over everything in Spark (``dcp-cdc check
--full`` above ``quality.columnar_below_bytes``), in the driver over columns (``dcp-cdc
check`` below it) and over rows (``quality.on_driver_below_bytes``). One Spark session;
each stage's seconds. ``python -m benchmarks.check_cost --events 5000000 --vbuckets 1024``.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Case, Stages, report

DATA = Path(__file__).resolve().parent / ".data" / "check_cost"


def run_once(
    events: int,
    vbuckets: int,
    percent: float,
    work: Path,
    scenario: str = "basic",
    rows_too: bool = True,
) -> dict[str, Any]:
    from dcp_cdc.config import AppConfig, BucketConfig, QualityConfig
    from dcp_cdc.simulator import simulate
    from pipelines.bronze.job import ingest_bucket
    from pipelines.lake.spark_session import build_spark_session
    from pipelines.quality import carry
    from pipelines.quality.compute import compute
    from pipelines.quality.job import check_bucket, pinned_versions
    from pipelines.quality.small.columnar import compute_columnar
    from pipelines.quality.small.compute import compute_small
    from pipelines.silver.job import apply_bucket

    shutil.rmtree(work, ignore_errors=True)
    stages = Stages(22)
    stage = stages.end

    t = time.perf_counter()
    sim = simulate(
        work / "sim",
        bucket="bench",
        scenario=scenario,
        seed=1,
        vbuckets=vbuckets,
        docs=max(1000, events // 10),
        ops=events,
        versions=False,
    )
    t = stage("simulate", t)
    files = sorted(sim.files)
    total = sum(f.stat().st_size for f in files)
    late: list[Path] = []
    while files and sum(f.stat().st_size for f in late) < total * percent / 100:
        late.insert(0, files.pop())
    landing = work / "landing"
    landing.mkdir(parents=True)
    for f in files:
        shutil.copy(f, landing)
    config = AppConfig(
        landing=str(landing),
        warehouse=str(work / "warehouse"),
        buckets=[BucketConfig(name="bench")],
        # the first check is Spark's, which keeps its state
        quality=QualityConfig(incremental_from_bytes=0, columnar_below_bytes=0),
    )
    bucket = config.buckets[0]
    spark = build_spark_session("dcp-cdc-bench-check", config.warehouse)
    try:
        t = stage("spark start", t)
        ingest_bucket(spark, config, bucket)
        apply_bucket(spark, config, bucket)
        t = stage("ingest + apply", t)
        first = check_bucket(spark, config, bucket)
        t = stage("first check (full)", t)
        for f in late:
            shutil.copy(f, landing)
        ingest_bucket(spark, config, bucket)
        applied = apply_bucket(spark, config, bucket)
        t = stage(f"ingest + apply {percent:g} %", t)
        at = pinned_versions(spark, bucket.name)
        state = carry.read(spark, bucket.name)
        since = compute(
            spark,
            bucket.name,
            at,
            state,
            save=lambda s: carry.write(spark, bucket.name, s, config.tables.properties),
        )
        t = stage("check since the last", t)
        everything = compute(spark, bucket.name, at, None, full=True)
        t = stage("check over everything", t)
        over_columns = compute_columnar(spark, bucket.name, at)
        t = stage("check over columns", t)
        in_driver = compute_small(spark, bucket.name, at) if rows_too else None
        stage("check over rows", t)
    finally:
        spark.stop()

    def rows(metrics: dict[str, Any]) -> dict[str, list[str]]:
        return {n: sorted(repr(sorted(r.items())) for r in m.rows) for n, m in metrics.items()}

    same = rows(since.metrics) == rows(everything.metrics)
    same_in_driver = in_driver is None or rows(in_driver.metrics) == rows(everything.metrics)
    same_over_columns = rows(over_columns.metrics) == rows(everything.metrics)
    return {
        "frames": sim.frames,
        "late_files": len(late),
        "stages": stages,
        "changes": applied.changes,
        "first_passed": first.passed,
        "incremental": since.full_because is None,
        "full_because": since.full_because,
        "same_rows": same,
        "same_rows_in_driver": same_in_driver,
        "same_rows_over_columns": same_over_columns,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.check_cost", description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000, help="simulated operations")
    parser.add_argument("--vbuckets", type=int, default=1024)
    parser.add_argument("--percent", type=float, default=1.0, help="of the frames, last")
    parser.add_argument("--scenario", default="basic")
    parser.add_argument(
        "--no-rows", action="store_true", help="skip the check over rows (minutes at 1M frames)"
    )
    args = parser.parse_args(argv)
    result = run_once(
        args.events, args.vbuckets, args.percent, DATA, args.scenario, rows_too=not args.no_rows
    )
    stages = result["stages"]
    full = stages["check over everything"]
    cases = [
        Case("check over everything", result["frames"], "frames", [full], baseline=True),
        Case("check since the last", result["frames"], "frames", [stages["check since the last"]]),
        Case("check over columns", result["frames"], "frames", [stages["check over columns"]]),
    ]
    if not args.no_rows:
        cases.append(
            Case("check over rows", result["frames"], "frames", [stages["check over rows"]])
        )
    report(
        "check_cost",
        cases,
        params=vars(args) | {k: v for k, v in result.items() if k != "stages"},
    )
    print(
        f"  since the last / over everything: {stages['check since the last'] / full:.1%}; "
        f"from the state: {result['incremental']} ({result['full_because']}); "
        f"the same rows: {result['same_rows']}; over columns "
        f"{stages['check over columns'] / full:.1%}, the same rows: "
        f"{result['same_rows_over_columns']}; over rows, the same rows: "
        f"{result['same_rows_in_driver']}"
    )


if __name__ == "__main__":
    main()
