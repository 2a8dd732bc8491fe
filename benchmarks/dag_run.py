"""The bucket's DAG under Airflow's scheduler, on the deployment of docs/deployment.md
(``make bench ARGS=dag-run``; needs ``make setup-s3``).

The rehearsal's servers (tests/support/rehearsal.py): the landing and the warehouse on an S3
API, the shared catalog, Airflow's scheduler with its LocalExecutor on PostgreSQL, the Spark
standalone cluster with two 1-core workers, and the test producer as the cluster. The DAG
runs once for the initial load (set-up, reported but not the goal), then ``--rounds`` times,
each after ``--changes`` live changes: capture into the S3 landing, then ingest, apply and
check ``spark-submit``-ed to the standalone master. Nothing else runs beside a run.

Per run: each task's seconds as Airflow recorded them, and the run's span from the first
task's start to the last task's end. After each run, silver (read back from the bucket with
delta-rs, as users see it) must equal the producer's truth.

Goal on 2 cores: a run bringing about 1,000 changes <= 2 minutes.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks import eventlog
from benchmarks.common import Case, report
from tests.support.rehearsal import TASKS, Rehearsal, rehearsal, run_dag, silver, task_times, truth


def _timed_run(deployed: Rehearsal, work: Path, name: str) -> dict[str, float]:
    """One DAG run: each task's seconds and the span, after checking silver against the truth."""
    run_id, _ = run_dag(deployed.stack)
    times = task_times(deployed.stack, run_id)
    seconds = {task: round(times[task][1] - times[task][0], 1) for task in TASKS}
    span = max(end for _, end in times.values()) - min(start for start, _ in times.values())
    expected = truth(deployed.producer.truth_out)
    found = silver(deployed.s3, work / name)
    if found != expected:
        raise AssertionError(f"{name}: silver differs from the truth: {len(found ^ expected)} rows")
    shown = "  ".join(f"{task} {s:.1f}" for task, s in seconds.items())
    print(f"  {name}: {span:.1f} s from the first task's start to the last's end ({shown})")
    return {"span": span, **seconds}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.dag_run", description=__doc__)
    parser.add_argument("--docs", type=int, default=1000, help="documents of the initial load")
    parser.add_argument("--changes", type=int, default=1000, help="live changes before a run")
    parser.add_argument("--rounds", type=int, default=2, help="measured runs")
    parser.add_argument("--vbuckets", type=int, default=1024, help="1,024: Couchbase's")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the run's folder (Airflow's task logs) and say where",
    )
    parser.add_argument(
        "--event-log",
        action="store_true",
        help="keep each task's Spark event log in the run's folder (benchmarks/eventlog.py "
        "reads it) and log at INFO; implies --keep",
    )
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="dcp-cdc-dag-run-"))
    work.chmod(0o755)  # the postgres OS user enters it
    spark_conf = {}
    if args.event_log:
        args.keep = True
        spark_conf = eventlog.conf(work / "spark-events")
    runs: list[dict[str, float]] = []
    started = time.monotonic()
    try:
        options = {"nodes": args.nodes, "vbuckets": args.vbuckets, "docs": args.docs, "ops": 0}
        level = "INFO" if args.event_log else "WARNING"
        with rehearsal(work, spark_conf, level, seed=11, **options) as deployed:
            print(f"  deployment up in {time.monotonic() - started:.0f} s", flush=True)
            load = _timed_run(deployed, work, "initial load")
            for n in range(args.rounds):
                deployed.producer.control(f"changes {args.changes}")
                deployed.producer.control("truth")
                runs.append(_timed_run(deployed, work, f"run {n + 1}"))
    finally:
        if args.keep:
            print(f"  kept {work} (task logs under stack/)")
        else:
            shutil.rmtree(work, ignore_errors=True)
    cases = [Case("initial load (set-up)", args.docs, "documents", [load["span"]], extra=load)]
    cases.append(
        Case(
            f"run of {args.changes:,} changes",
            args.changes,
            "changes",
            [r["span"] for r in runs],
            baseline=True,
            extra={task: [r[task] for r in runs] for task in TASKS},
        )
    )
    report("dag_run", cases, params=vars(args))


if __name__ == "__main__":
    main()
