"""Several drivers committing to the same Delta tables on S3 at once keep every commit.

Two writer processes (two Spark JVMs, :mod:`tests.support.s3_writer`) append to the same two
tables on the moto S3 server in overlapping rounds; afterwards each table's log must hold one
commit per writer and round (labels ``w<id>-r<round>``) and versions 0..2×rounds. With Delta's
single-driver log store the same run loses commits: the test of that shows the check can fail.

Two Spark JVMs for minutes: only under ``DCP_CDC_S3=1`` (``make test-long``), 20 rounds with
each store; ``DCP_CDC_S3_ROUNDS`` changes the number.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.s3_server import MotoS3Server

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = int(os.environ.get("DCP_CDC_S3_ROUNDS", "20"))
pytestmark = pytest.mark.skipif(
    os.environ.get("DCP_CDC_S3") != "1", reason="DCP_CDC_S3=1 (make test-long)"
)
WRITERS = 2
TABLES = ("a", "b")


def _create_tables(s3: MotoS3Server, prefix: str) -> list[str]:
    """Version 0 of each table (an empty commit), written with boto3 before the writers start."""
    created = []
    client = s3.client()
    schema = json.dumps(
        {
            "type": "struct",
            "fields": [
                {"name": "writer", "type": "integer", "nullable": False, "metadata": {}},
                {"name": "round", "type": "integer", "nullable": False, "metadata": {}},
            ],
        }
    )
    for name in TABLES:
        key = f"{prefix}/{name}/_delta_log/{0:020d}.json"
        actions = [
            {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
            {
                "metaData": {
                    "id": f"00000000-0000-0000-0000-00000000000{TABLES.index(name)}",
                    "format": {"provider": "parquet", "options": {}},
                    "schemaString": schema,
                    "partitionColumns": [],
                    "configuration": {},
                    "createdTime": 0,
                }
            },
        ]
        client.put_object(
            Bucket="lake", Key=key, Body="\n".join(json.dumps(a) for a in actions).encode()
        )
        created.append(f"s3a://lake/{prefix}/{name}")
    return created


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
        for line in body.splitlines():
            info = json.loads(line).get("commitInfo")
            if info and info.get("userMetadata"):
                labels.append(info["userMetadata"])
    return sorted(versions), labels


def _run_writers(
    s3: MotoS3Server, tmp_path: Path, log_store: str, rounds: int
) -> tuple[str, float]:
    prefix = f"writers-{log_store}-{rounds}"
    tables = _create_tables(s3, prefix)
    sync = tmp_path / "sync"
    sync.mkdir()
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    started = time.monotonic()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.s3_writer",
                f"--writer={writer}",
                f"--writers={WRITERS}",
                f"--rounds={rounds}",
                f"--sync={sync}",
                f"--warehouse={tmp_path / f'warehouse-{writer}'}",
                f"--log-store={log_store}",
                f"--s3-conf={json.dumps(s3.spark_conf())}",
                "--tables",
                *tables,
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for writer in range(WRITERS)
    ]
    for writer, proc in enumerate(procs):
        out, _ = proc.communicate(timeout=900)
        assert proc.returncode == 0, f"writer {writer} failed:\n{out[-5000:]}"
    return prefix, time.monotonic() - started


def _expected(rounds: int) -> list[str]:
    return sorted(f"w{w}-r{r}" for w in range(WRITERS) for r in range(rounds))


def test_conditional_put_keeps_every_commit(s3_server: MotoS3Server, tmp_path: Path) -> None:
    rounds = ROUNDS
    s3_server.create_bucket("lake")
    prefix, took = _run_writers(s3_server, tmp_path, "s3-conditional-put", rounds)
    for name in TABLES:
        versions, labels = _commits(s3_server, prefix, name)
        assert versions == list(range(WRITERS * rounds + 1)), name
        assert sorted(labels) == _expected(rounds), name
    print(f"{WRITERS} writers × {rounds} rounds × {len(TABLES)} tables: {took:.1f} s")


def test_single_driver_log_store_loses_commits(s3_server: MotoS3Server, tmp_path: Path) -> None:
    """The same run with Delta's S3SingleDriverLogStore: both writers report every commit
    done, yet the logs miss some, since two drivers wrote the same version."""
    rounds = ROUNDS
    s3_server.create_bucket("lake")
    prefix, took = _run_writers(s3_server, tmp_path, "single-driver", rounds)
    lost = 0
    for name in TABLES:
        _, labels = _commits(s3_server, prefix, name)
        lost += len(set(_expected(rounds)) - set(labels))
    print(f"single-driver: {lost} commits lost of {WRITERS * rounds * len(TABLES)} ({took:.1f} s)")
    assert lost > 0
