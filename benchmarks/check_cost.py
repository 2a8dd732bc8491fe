"""What a quality check costs after a run that adds a little to a large bronze table: the
check from the last check's state against a check over everything, on the same tables.

A scenario is simulated (``--scenario``, ``basic``: ``mixed`` holds failovers and drops,
after which a check reads everything; ``--events`` operations on ``--vbuckets`` vbuckets);
all its capture files but the last ``--percent`` of its frames are ingested, applied and
checked (``dcp-cdc check``: over everything, keeping the state); then the rest arrives, is
ingested and applied, and ``dcp-cdc check`` runs from the state, then with ``--full`` over
everything: each the whole check (metric frames, Great Expectations, results, report), on
the same tables, in one warm Spark session. Their verdicts and counts must be the same.
``--spark`` also times Spark's metric frames from its state and over everything
(``quality.columnar_below_bytes`` 0), and ``--rows`` the row check in the driver.
``python -m benchmarks.check_cost --events 5000000 --vbuckets 1024``.
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
    rows_too: bool = False,
    spark_too: bool = False,
) -> dict[str, Any]:
    from dcp_cdc.config import AppConfig, BucketConfig
    from dcp_cdc.simulator import simulate
    from pipelines.bronze.job import ingest_bucket
    from pipelines.lake.spark_session import build_spark_session
    from pipelines.quality.job import check_bucket
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
    )
    bucket = config.buckets[0]
    spark = build_spark_session("dcp-cdc-bench-check", config.warehouse)
    extra: dict[str, Any] = {}
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
        since = check_bucket(spark, config, bucket)
        t = stage("check since the last", t)
        everything = check_bucket(spark, config, bucket, full=True)
        t = stage("check over everything", t)
        if spark_too or rows_too:
            extra = _others(spark, config, bucket.name, stage, spark_too, rows_too)
    finally:
        spark.stop()
    return {
        "frames": sim.frames,
        "late_files": len(late),
        "stages": stages,
        "changes": applied.changes,
        "first_passed": first.passed,
        "incremental": since.full_because is None,
        "full_because": since.full_because,
        "same_verdicts": _verdicts(since) == _verdicts(everything),
        **extra,
    }


def _verdicts(report: Any) -> Any:
    """What a check found: each expectation's outcome and the counts of the summary."""
    return (
        sorted((o.key, o.success, o.unexpected_count) for o in report.outcomes),
        report.counts,
    )


def _others(
    spark: Any, config: Any, bucket: str, stage: Any, spark_too: bool, rows_too: bool
) -> dict[str, Any]:
    """Spark's metric frames from its state and over everything, the row check's; whether
    their rows are those of the columnar check over everything."""
    from pipelines.quality import carry
    from pipelines.quality.compute import compute
    from pipelines.quality.job import pinned_versions
    from pipelines.quality.small.columnar import compute_columnar
    from pipelines.quality.small.compute import compute_small

    def rows(metrics: dict[str, Any]) -> dict[str, list[str]]:
        return {n: sorted(repr(sorted(r.items())) for r in m.rows) for n, m in metrics.items()}

    at = pinned_versions(spark, bucket)
    theirs = rows(compute_columnar(spark, bucket, at).metrics)
    found: dict[str, Any] = {}
    t = time.perf_counter()
    if spark_too:
        since = compute(
            spark,
            bucket,
            at,
            carry.read(spark, bucket),
            save=lambda s: carry.write(spark, bucket, s, config.tables.properties),
        )
        t = stage("Spark: since its last state", t)
        everything = compute(spark, bucket, at, None, full=True)
        t = stage("Spark: over everything", t)
        found["spark_same_rows"] = rows(since.metrics) == rows(everything.metrics) == theirs
        found["spark_full_because"] = since.full_because
    if rows_too:
        found["rows_same_rows"] = rows(compute_small(spark, bucket, at).metrics) == theirs
        stage("over rows", t)
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.check_cost", description=__doc__)
    parser.add_argument("--events", type=int, default=1_000_000, help="simulated operations")
    parser.add_argument("--vbuckets", type=int, default=1024)
    parser.add_argument("--percent", type=float, default=1.0, help="of the frames, last")
    parser.add_argument("--scenario", default="basic")
    parser.add_argument("--spark", action="store_true", help="Spark's metric frames too")
    parser.add_argument("--rows", action="store_true", help="the row check too (slow)")
    args = parser.parse_args(argv)
    result = run_once(
        args.events,
        args.vbuckets,
        args.percent,
        DATA,
        args.scenario,
        rows_too=args.rows,
        spark_too=args.spark,
    )
    stages = result["stages"]
    full = stages["check over everything"]
    cases = [
        Case("check over everything", result["frames"], "frames", [full], baseline=True),
        Case("check since the last", result["frames"], "frames", [stages["check since the last"]]),
    ]
    report(
        "check_cost",
        cases,
        params=vars(args) | {k: v for k, v in result.items() if k != "stages"},
    )
    print(
        f"  since the last / over everything: {stages['check since the last'] / full:.1%}; "
        f"from the state: {result['incremental']} ({result['full_because']}); "
        f"the same verdicts: {result['same_verdicts']}"
    )


if __name__ == "__main__":
    main()
