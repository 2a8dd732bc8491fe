"""Several drivers committing to the same Delta tables on S3 at once keep every commit.

Two writer processes (two Spark JVMs, :mod:`tests.support.concurrent_writers`) append to the
same two tables on the moto S3 server in overlapping rounds; afterwards each table's log must hold one
commit per writer and round (labels ``w<id>-r<round>``) and versions 0..2×rounds. With Delta's
single-driver log store the same run loses commits: the test of that shows the check can fail.

Two Spark JVMs for minutes: only under ``DCP_CDC_S3=1`` (``make test-long``), 20 rounds with
each store; ``DCP_CDC_S3_ROUNDS`` changes the number.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.concurrent_writers import (
    WRITERS,
    WritersRun,
    expected,
    initial_commit,
    labels_of,
    run_writers,
)
from tests.support.s3_server import MotoS3Server

ROUNDS = int(os.environ.get("DCP_CDC_S3_ROUNDS", "20"))
pytestmark = pytest.mark.skipif(
    os.environ.get("DCP_CDC_S3") != "1", reason="DCP_CDC_S3=1 (make test-long)"
)
TABLES = ("a", "b")


def _create_tables(s3: MotoS3Server, prefix: str) -> list[str]:
    """Version 0 of each table (an empty commit), written with boto3 before the writers start."""
    client = s3.client()
    for index, name in enumerate(TABLES):
        client.put_object(
            Bucket="lake",
            Key=f"{prefix}/{name}/_delta_log/{0:020d}.json",
            Body=initial_commit(index).encode(),
        )
    return [f"s3a://lake/{prefix}/{name}" for name in TABLES]


def _commits(s3: MotoS3Server, prefix: str, name: str) -> tuple[list[int], list[str]]:
    """The versions in a table's log and the writers' labels of its commits."""
    client = s3.client()
    listed = client.list_objects_v2(Bucket="lake", Prefix=f"{prefix}/{name}/_delta_log/")
    versions, labels = [], []
    for item in listed.get("Contents", []):
        file = item["Key"].rsplit("/", 1)[1]
        if not (file.endswith(".json") and file[:-5].isdigit()):
            continue
        versions.append(int(file[:-5]))
        body = client.get_object(Bucket="lake", Key=item["Key"])["Body"].read().decode()
        labels += labels_of(body)
    return sorted(versions), labels


def _run_writers(
    s3: MotoS3Server, tmp_path: Path, log_store: str, rounds: int
) -> tuple[str, WritersRun]:
    prefix = f"writers-{log_store}-{rounds}"
    tables = _create_tables(s3, prefix)
    run = run_writers(
        tables, tmp_path, rounds=rounds, conf=s3.spark_conf(), log_store=log_store, timeout_s=900
    )
    return prefix, run


def test_conditional_put_keeps_every_commit(s3_server: MotoS3Server, tmp_path: Path) -> None:
    rounds = ROUNDS
    s3_server.create_bucket("lake")
    prefix, run = _run_writers(s3_server, tmp_path, "s3-conditional-put", rounds)
    for name in TABLES:
        versions, labels = _commits(s3_server, prefix, name)
        assert versions == list(range(WRITERS * rounds + 1)), name
        assert sorted(labels) == expected(rounds), name
    print(f"{WRITERS} writers × {rounds} rounds × {len(TABLES)} tables: {run.seconds:.1f} s")


def test_single_driver_log_store_loses_commits(s3_server: MotoS3Server, tmp_path: Path) -> None:
    """The same run with Delta's S3SingleDriverLogStore: both writers report every commit
    done, yet the logs miss some, since two drivers wrote the same version."""
    rounds = ROUNDS
    s3_server.create_bucket("lake")
    prefix, run = _run_writers(s3_server, tmp_path, "single-driver", rounds)
    missing = sum(
        len(run.lost(f"s3a://lake/{prefix}/{name}", _commits(s3_server, prefix, name)[1]))
        for name in TABLES
    )
    total = WRITERS * rounds * len(TABLES)
    print(f"single-driver: {missing} commits lost of {total} ({run.seconds:.1f} s)")
    assert missing > 0
