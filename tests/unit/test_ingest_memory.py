"""pipelines.bronze.memory.IngestMemory without a JVM: the ingest log's rows are kept while
the log is at their version, read again when it moved, extended by this process's own commit
and forgotten when another commit came between (the log's version and its read are faked)."""

from __future__ import annotations

from typing import Any

import pytest

from pipelines.bronze import memory as memory_module
from pipelines.bronze import store
from pipelines.bronze.memory import IngestMemory

TABLE = "bronze.b__ingest_log"
SPARK: Any = None  # no session: the log's version and its read are faked


def _row(path: str, version: int, sequence: int) -> dict[str, Any]:
    return {
        "file": path,
        "status": "ingested",
        "run_version": version,
        "ingest_run_id": f"run{version}",
        "size": 10,
        "modified_ms": 1,
        "session_id": "s",
        "file_sequence": sequence,
        "end_state": None,
    }


class Log:
    """A fake ingest log: its Delta version and rows, and how often its rows were read."""

    def __init__(self) -> None:
        self.version = 0
        self.rows: list[dict[str, Any]] = []
        self.reads = 0

    def append(self, rows: list[dict[str, Any]]) -> None:
        self.rows += rows
        self.version += 1

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def read(spark: Any, table: str, version: int | None = None) -> list[dict[str, Any]]:
            assert (table, version) == (TABLE, self.version)
            self.reads += 1
            return list(self.rows)

        monkeypatch.setattr(memory_module, "table_version", lambda spark, table: self.version)
        monkeypatch.setattr(store, "read_log_rows", read)


def test_the_rows_are_kept_while_the_log_is_at_their_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = Log()
    log.install(monkeypatch)
    log.append([_row("a", 1, 0)])
    memory = IngestMemory()
    assert set(memory.state(SPARK, TABLE).ingested) == {"a"}
    assert memory.state(SPARK, TABLE).last_version == 1
    assert log.reads == 1

    # this process's commit: kept with it, nothing read
    mine = [_row("b", 2, 1)]
    log.append(mine)
    memory.logged(SPARK, TABLE, mine)
    assert set(memory.state(SPARK, TABLE).ingested) == {"a", "b"}
    assert (memory.version, log.reads) == (2, 1)

    # another writer's commit: read again
    log.append([_row("c", 3, 2)])
    assert set(memory.state(SPARK, TABLE).ingested) == {"a", "b", "c"}
    assert (memory.version, log.reads) == (3, 2)


def test_a_commit_of_another_writer_before_this_ones_forgets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log = Log()
    log.install(monkeypatch)
    memory = IngestMemory()
    memory.state(SPARK, TABLE)
    log.append([_row("theirs", 1, 0)])
    mine = [_row("mine", 2, 1)]
    log.append(mine)
    memory.logged(SPARK, TABLE, mine)
    assert memory == IngestMemory()
    assert set(memory.state(SPARK, TABLE).ingested) == {"theirs", "mine"}
    assert log.reads == 2


def test_run_files_are_kept_while_only_this_process_commits_to_the_events_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each run's commit of its files is kept while the events table moved by that commit
    alone; a commit of another writer between two of ours, or after the last, forgets them
    (its OPTIMIZE may have replaced them), and a run not kept makes the apply read the
    table."""
    version = {"events": 4}
    monkeypatch.setattr(memory_module, "table_version", lambda spark, table: version[table])
    kept = IngestMemory()

    def commit(run: str, *paths: str) -> None:
        version["events"] += 1
        kept.committed_files(SPARK, "events", run, list(paths))

    commit("r1", "/t/a.parquet")
    commit("r2", "/t/b.parquet", "/t/c.parquet")
    assert kept.run_files(SPARK, "events", ["r1", "r2"]) == [
        "/t/a.parquet",
        "/t/b.parquet",
        "/t/c.parquet",
    ]
    assert kept.run_files(SPARK, "events", ["r0", "r2"]) is None  # r0: not this process's
    version["events"] += 1  # another writer's commit between two of ours
    commit("r3", "/t/d.parquet")
    assert kept.run_files(SPARK, "events", ["r2", "r3"]) is None
    assert kept.run_files(SPARK, "events", ["r3"]) == ["/t/d.parquet"]
    version["events"] += 1  # and after the last of ours
    assert kept.run_files(SPARK, "events", ["r3"]) is None
    commit("r4")  # a run that wrote no events file
    assert kept.run_files(SPARK, "events", ["r4"]) == []
    kept.forget()
    assert kept.run_files(SPARK, "events", ["r4"]) is None


def test_the_files_of_the_newest_runs_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    version = {"events": 0}
    monkeypatch.setattr(memory_module, "table_version", lambda spark, table: version[table])
    kept = IngestMemory()
    for i in range(memory_module.KEPT_RUNS + 3):
        version["events"] += 1
        kept.committed_files(SPARK, "events", f"r{i}", [f"/t/{i}.parquet"])
    assert kept.run_files(SPARK, "events", ["r2"]) is None
    assert kept.run_files(SPARK, "events", ["r3"]) == ["/t/3.parquet"]
