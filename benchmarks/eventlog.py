"""Stage by stage, what a Spark event log says a run spent: the Spark UI's stage table, in text.

    python -m benchmarks.eventlog benchmarks/.data/spark-events/local-...

Wall seconds per stage, task run time, JVM CPU time (Python workers' CPU is not in it),
shuffle and spill volumes, bytes read and written; then every SQL execution over 1 s.
Reads plain or zstd-compressed logs (Spark's default ``.zstd``).
"""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

_METRICS = (
    ("run s", "internal.metrics.executorRunTime", 1e3),
    ("cpu s", "internal.metrics.executorCpuTime", 1e9),
    ("shuf W MB", "internal.metrics.shuffle.write.bytesWritten", 2**20),
    ("shuf R MB", "internal.metrics.shuffle.read.localBytesRead", 2**20),
    ("spill MB", "internal.metrics.diskBytesSpilled", 2**20),
    ("in MB", "internal.metrics.input.bytesRead", 2**20),
    ("out MB", "internal.metrics.output.bytesWritten", 2**20),
)


def conf(folder: Path) -> dict[str, str]:
    """The Spark settings that keep a run's event log in ``folder`` (made here), uncompressed."""
    folder.mkdir(parents=True, exist_ok=True)
    return {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": folder.as_uri(),
        "spark.eventLog.compress": "false",
    }


def events(path: Path) -> Iterator[dict[str, Any]]:
    files = sorted(path.glob("events_*")) if path.is_dir() else [path]
    for file in files:
        raw = pa.CompressedInputStream(str(file), "zstd") if file.suffix == ".zstd" else None
        with io.TextIOWrapper(raw) if raw is not None else open(file) as fh:
            for line in fh:
                yield json.loads(line)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.eventlog", description=__doc__)
    parser.add_argument("log", type=Path, help="an event log file, or a rolling log's folder")
    args = parser.parse_args(argv)
    stages: list[tuple[int, str, int, float, dict[str, float]]] = []
    sql: dict[int, list[Any]] = {}
    for e in events(args.log):
        kind = e["Event"]
        if kind == "SparkListenerStageCompleted":
            s = e["Stage Info"]
            acc = {a["Name"]: a.get("Value") or 0 for a in s.get("Accumulables", [])}
            wall = (s["Completion Time"] - s["Submission Time"]) / 1e3
            values = {label: float(acc.get(name, 0)) / scale for label, name, scale in _METRICS}
            stages.append((s["Stage ID"], s["Stage Name"], s["Number of Tasks"], wall, values))
        elif kind.endswith("SparkListenerSQLExecutionStart"):
            sql[e["executionId"]] = [e["description"], e["time"], None]
        elif kind.endswith("SparkListenerSQLExecutionEnd") and e["executionId"] in sql:
            sql[e["executionId"]][2] = e["time"]
    print(
        f"{'stage':>5}  {'name':<48}{'tasks':>6}{'wall s':>8}"
        + "".join(f"{label:>10}" for label, _, _ in _METRICS)
    )
    for stage_id, name, tasks, wall, values in sorted(stages):
        print(
            f"{stage_id:>5}  {name[:47]:<48}{tasks:>6}{wall:>8.1f}"
            + "".join(f"{values[label]:>10.1f}" for label, _, _ in _METRICS)
        )
    print(
        f"{'':>5}  {'all stages':<48}{'':>6}{sum(s[3] for s in stages):>8.1f}"
        + "".join(f"{sum(s[4][label] for s in stages):>10.1f}" for label, _, _ in _METRICS)
    )
    print("\nSQL executions over 1 s:")
    for execution, (description, start, end) in sorted(sql.items()):
        if end is not None and end - start > 1000:
            print(f"  {execution:>4} {(end - start) / 1e3:7.1f} s  {description[:90]}")


if __name__ == "__main__":
    main()
