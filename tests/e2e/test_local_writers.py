"""Several drivers committing to the same local Delta tables at once keep every commit.

Delta's stock log store for ``file:`` paths (``HDFSLogStore``) commits version N by checking
that ``_delta_log/<N>.json`` does not exist and then renaming a temporary file onto it; a local
rename replaces an existing target, and nothing but a lock inside one JVM orders the check and
the rename, so two JVMs can both pass the check, both "commit" N, and one commit is lost.
dcp-cdc's ``LocalHardLinkLogStore``, in every session, creates ``<N>.json`` with ``link(2)``,
which fails when the name exists (docs/object-storage.md, "Several writers: the log stores").

- ``make test``: two plain JVMs commit to one log through a log store as Delta does
  (:mod:`tests.support.commit_race`), seconds: the hard-link store keeps all 300 commits while
  the JVMs race for versions; Delta's stock store, held 200 ms between its checks and its
  rename (the fault point ``SlowRenameLocalFs``), loses some.
- ``make test-long`` (``-m long``): the same race without a fault point, four JVMs of 1,000
  commits each (up to three races), where the stock store loses some on its own; and two Spark drivers
  (:mod:`tests.support.concurrent_writers`) appending to the same two local tables in
  overlapping rounds (``DCP_CDC_LOCAL_ROUNDS``, 100 by default: 400 commits): with the
  hard-link store every commit is in the logs, with the stock store held in its window a
  version is written twice.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dcp_cdc.config.storage import LOCAL_LOG_STORE_CLASS, LOCAL_LOG_STORE_KEY
from tests.support.commit_race import (
    STOCK_LOCAL_STORE,
    build_test_jar,
    race,
    slow_rename_conf,
)
from tests.support.concurrent_writers import (
    WRITERS,
    create_local_tables,
    expected,
    local_commits,
    retried_commits,
    run_writers,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ROUNDS = int(os.environ.get("DCP_CDC_LOCAL_ROUNDS", "100"))
TABLES = ("a", "b")
HOLD_MS = 200
"""How long the fault point holds a writer of the stock store between check and rename."""


@pytest.fixture(scope="module")
def test_jar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_test_jar(tmp_path_factory.mktemp("java") / "dcp-cdc-tests.jar")


def test_two_jvms_racing_through_the_hard_link_store_keep_every_commit(
    tmp_path: Path, test_jar: Path
) -> None:
    result = race(LOCAL_LOG_STORE_CLASS, tmp_path / "_delta_log", test_jar, commits=150)
    print(result)
    assert result.refused > 0  # they did race for versions
    assert (result.found, result.duplicated, result.versions) == (300, 0, 300)


def test_the_stock_store_held_between_check_and_rename_loses_commits(
    tmp_path: Path, test_jar: Path
) -> None:
    result = race(
        STOCK_LOCAL_STORE,
        tmp_path / "_delta_log",
        test_jar,
        commits=10,
        hadoop_conf=slow_rename_conf(HOLD_MS),
    )
    print(result)
    assert result.lost > 0


@pytest.mark.long
def test_the_stock_store_loses_commits_to_racing_jvms_unaided(
    tmp_path: Path, test_jar: Path
) -> None:
    """Four JVMs on two cores (a writer preempted between its check and its rename is what
    loses a commit), up to three races of 1,000 commits each until one loses some: on a
    quiet machine two JVMs raced 2,000 commits each without a loss."""
    results = []
    for attempt in range(3):
        log = tmp_path / f"race{attempt}" / "_delta_log"
        results.append(race(STOCK_LOCAL_STORE, log, test_jar, writers=4, commits=1000))
        print(results[-1])
        if results[-1].lost:
            break
    assert any(r.lost > 0 for r in results), results


@pytest.mark.long
def test_two_drivers_keep_every_commit_to_local_tables(tmp_path: Path) -> None:
    tables = create_local_tables(tmp_path / "tables", TABLES)
    run = run_writers(tables, tmp_path / "writers", rounds=ROUNDS)
    for table in tables:
        versions, labels = local_commits(table)
        assert versions == list(range(WRITERS * ROUNDS + 1)), table
        assert sorted(labels) == expected(ROUNDS), table
    retried = sum(retried_commits(table) for table in tables)
    print(
        f"hard-link store: {WRITERS} writers × {ROUNDS} rounds × {len(TABLES)} tables, "
        f"{WRITERS * ROUNDS * len(TABLES)} commits, all in the logs, {retried} of them retried "
        f"after losing a version to the other writer ({run.seconds:.0f} s)"
    )
    assert retried > 0  # the writers did race for versions


@pytest.mark.long
def test_two_drivers_lose_commits_with_the_stock_store_held_in_its_window(
    tmp_path: Path, test_jar: Path
) -> None:
    """Both writers commit one version: the later rename replaces the earlier commit, whose
    writer was told it is done. Hadoop's checksum of the file (``.<N>.json.crc``) stays the
    earlier writer's, so the next read of that version fails with ``ChecksumException``: the
    later writer fails as it retries, and the run stops. Either shows the two commits of one
    version (which one a run shows depends on which writer gets there first)."""
    rounds = 5  # the first round's race usually ends the run (a writer fails on the checksum)
    tables = create_local_tables(tmp_path / "tables", TABLES)
    conf = {LOCAL_LOG_STORE_KEY: STOCK_LOCAL_STORE, "spark.driver.extraClassPath": str(test_jar)}
    conf |= {f"spark.hadoop.{key}": value for key, value in slow_rename_conf(HOLD_MS).items()}
    run = run_writers(
        tables, tmp_path / "writers", rounds=rounds, conf=conf, tolerate_failures=True
    )
    told = sum(len(labels) for labels in run.committed.values())
    missing = sum(len(run.lost(table, local_commits(table)[1])) for table in tables)
    broken = sorted(w for w, out in run.failures.items() if "ChecksumException" in out)
    print(
        f"stock store held {HOLD_MS} ms: {told} commits done of {WRITERS * rounds * len(TABLES)}"
        f" asked, {missing} of them not in the logs; writers failing on a checksum: {broken}"
        f" ({run.seconds:.0f} s)"
    )
    assert missing > 0 or broken
