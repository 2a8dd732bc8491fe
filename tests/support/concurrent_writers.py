"""Several Spark drivers committing to the same Delta tables at once, and what their logs kept.

The tests of several writers (``tests/s3/test_concurrent_writers.py`` on S3,
``tests/e2e/test_local_writers.py`` on local disk) make version 0 of each table
(:func:`initial_commit`), start :func:`run_writers`, then read each table's log: every commit
is labelled ``w<writer>-r<round>`` (Delta's ``userMetadata``), so :meth:`WritersRun.lost`
says which commits the log store let another writer overwrite: those their writer was told
were done and the log does not have.

Each writer is a process of its own, ``python -m tests.support.concurrent_writers`` (its own
Spark JVM and local catalog): for each round it waits until every writer reached the round
(files in ``--sync``), then appends one row to each table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WRITERS = 2

_SCHEMA = {
    "type": "struct",
    "fields": [
        {"name": "writer", "type": "integer", "nullable": False, "metadata": {}},
        {"name": "round", "type": "integer", "nullable": False, "metadata": {}},
    ],
}


def initial_commit(table_index: int) -> str:
    """The body of ``_delta_log/00000000000000000000.json`` of an empty table of the writers'
    rows (written before the writers start, so that none of them creates the table)."""
    actions = [
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {
            "metaData": {
                "id": f"00000000-0000-0000-0000-{table_index:012d}",
                "format": {"provider": "parquet", "options": {}},
                "schemaString": json.dumps(_SCHEMA),
                "partitionColumns": [],
                "configuration": {},
                "createdTime": 0,
            }
        },
    ]
    return "\n".join(json.dumps(action) for action in actions)


def create_local_tables(folder: Path, names: Iterable[str]) -> list[str]:
    """Version 0 of a table in ``folder/<name>`` for each name; their locations."""
    tables = []
    for index, name in enumerate(names):
        log = folder / name / "_delta_log"
        log.mkdir(parents=True)
        (log / f"{0:020d}.json").write_text(initial_commit(index), encoding="utf-8")
        tables.append(str(folder / name))
    return tables


def labels_of(commit: str) -> list[str]:
    """The writers' labels (``userMetadata``) in the body of a commit file."""
    labels = []
    for line in commit.splitlines():
        info = json.loads(line).get("commitInfo")
        if info and info.get("userMetadata"):
            labels.append(info["userMetadata"])
    return labels


def local_commits(table: str | Path) -> tuple[list[int], list[str]]:
    """The versions in a local table's log and the labels of its commits."""
    versions, labels = [], []
    for file in Path(table, "_delta_log").glob("*.json"):
        if file.stem.isdigit():
            versions.append(int(file.stem))
            labels += labels_of(file.read_text(encoding="utf-8"))
    return sorted(versions), labels


def retried_commits(table: str | Path) -> int:
    """How many commits of a local table were refused a version another writer had taken,
    and retried by Delta on the next: their ``readVersion`` is below their version minus one."""
    count = 0
    for file in Path(table, "_delta_log").glob("*.json"):
        if not file.stem.isdigit():
            continue
        for line in file.read_text(encoding="utf-8").splitlines():
            info = json.loads(line).get("commitInfo")
            if info and info.get("readVersion", int(file.stem) - 1) < int(file.stem) - 1:
                count += 1
    return count


def expected(rounds: int, writers: int = WRITERS) -> list[str]:
    """The labels of every commit the writers make to one table."""
    return sorted(f"w{w}-r{r}" for w in range(writers) for r in range(rounds))


@dataclass(frozen=True, slots=True)
class WritersRun:
    seconds: float
    committed: dict[str, list[str]]
    """Each table's commits whose ``save`` returned in their writer: what it was told."""
    failures: dict[int, str]
    """The output of each writer that failed (or stopped since another failed)."""

    def lost(self, table: str, labels: Sequence[str]) -> list[str]:
        """The commits of ``table`` its writers were told were done, missing from its log's
        ``labels``."""
        return sorted(set(self.committed.get(table, [])) - set(labels))


def run_writers(
    tables: Sequence[str],
    workdir: Path,
    *,
    rounds: int,
    conf: Mapping[str, str] | None = None,
    log_store: str | None = None,
    writers: int = WRITERS,
    timeout_s: float = 1800,
    tolerate_failures: bool = False,
) -> WritersRun:
    """Run ``writers`` driver processes over ``tables`` for ``rounds`` rounds, each with the
    extra Spark settings ``conf`` (and ``[storage] log_store`` ``log_store`` for tables on S3).
    A writer that fails stops the others at the next round; that fails the call unless
    ``tolerate_failures``."""
    sync = workdir / "sync"
    sync.mkdir(parents=True)
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    logs = [workdir / f"writer-{writer}.log" for writer in range(writers)]
    procs = []
    for writer, log in enumerate(logs):
        with log.open("w") as out:
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "tests.support.concurrent_writers",
                        f"--writer={writer}",
                        f"--writers={writers}",
                        f"--rounds={rounds}",
                        f"--sync={sync}",
                        f"--warehouse={workdir / f'warehouse-{writer}'}",
                        f"--conf={json.dumps(dict(conf or {}))}",
                        *([f"--log-store={log_store}"] if log_store else []),
                        "--tables",
                        *tables,
                    ],
                    cwd=ROOT,
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            )
    try:
        while any(proc.poll() is None for proc in procs):
            assert time.monotonic() - started < timeout_s, f"writers still running: {logs}"
            time.sleep(0.5)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    failures = {
        writer: logs[writer].read_text(encoding="utf-8")
        for writer, proc in enumerate(procs)
        if proc.returncode != 0
    }
    assert tolerate_failures or not failures, "\n".join(
        f"writer {writer} failed:\n{out[-5000:]}" for writer, out in failures.items()
    )
    committed: dict[str, list[str]] = {}
    for file in sync.glob("committed-w*"):
        for line in file.read_text(encoding="utf-8").splitlines():
            table, label = line.split("\t")
            committed.setdefault(table, []).append(label)
    return WritersRun(time.monotonic() - started, committed, failures)


def _barrier(sync: Path, writer: int, writers: int, step: str, timeout_s: float = 300) -> None:
    (sync / f"{step}-w{writer}").touch()
    deadline = time.monotonic() + timeout_s
    while len(list(sync.glob(f"{step}-w*"))) < writers:
        if failed := sorted(f.name for f in sync.glob("failed-w*")):
            raise RuntimeError(f"writer {writer}: stopping, since {failed[0]}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"writer {writer}: the others never reached {step}")
        time.sleep(0.005)


def main(argv: list[str] | None = None) -> int:
    """One writer: a dcp-cdc session (its own local catalog) appending to ``--tables``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--writer", type=int, required=True)
    parser.add_argument("--writers", type=int, default=WRITERS)
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--tables", nargs="+", required=True, help="table locations")
    parser.add_argument("--sync", type=Path, required=True)
    parser.add_argument("--warehouse", type=Path, required=True)
    parser.add_argument("--conf", default="{}", help="JSON of extra Spark settings")
    parser.add_argument("--log-store", default="s3-conditional-put", help="for tables on S3")
    args = parser.parse_args(argv)

    from pyspark.sql import types as T

    from pipelines.lake.object_storage import on_s3
    from pipelines.lake.spark_session import build_spark_session

    spark = build_spark_session(
        f"writer-{args.writer}",
        args.warehouse,
        shuffle_partitions=1,
        extra_conf=json.loads(args.conf) | {"spark.driver.memory": "1g"},
        tables_on_s3=any(on_s3(table) for table in args.tables),
        log_store=args.log_store,
    )
    schema = T.StructType(
        [
            T.StructField("writer", T.IntegerType(), False),
            T.StructField("round", T.IntegerType(), False),
        ]
    )
    committed = args.sync / f"committed-w{args.writer}"  # what this writer was told is done
    try:
        _barrier(args.sync, args.writer, args.writers, "started")
        for round_ in range(args.rounds):
            rows = spark.createDataFrame([(args.writer, round_)], schema)
            _barrier(args.sync, args.writer, args.writers, f"round{round_:04d}")
            for table in args.tables:
                label = f"w{args.writer}-r{round_}"
                rows.write.format("delta").mode("append").option("userMetadata", label).save(table)
                with committed.open("a", encoding="utf-8") as done:
                    done.write(f"{table}\t{label}\n")
    except Exception:
        (args.sync / f"failed-w{args.writer}").touch()  # the others stop at their next round
        raise
    print(f"writer {args.writer}: {args.rounds} rounds committed", flush=True)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
