"""The production rehearsal's deployment, shared by ``tests/e2e/test_rehearsal.py`` and
``benchmarks/dag_run.py``: an S3 API (moto's server) holding the landing and the warehouse, the
shared catalog (``dcp-cdc metastore start``), Airflow's scheduler with the Spark standalone
cluster (``build-support/local_stack.py up``) and the test DCP producer as the cluster, each
started the way docs/deployment.md starts it, on 127.0.0.1, and stopped at the end."""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.airflow_stack import Stack, local_stack, stack_settings
from tests.support.capture_harness import Producer
from tests.support.ports import free_port
from tests.support.s3_server import MotoS3Server

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "travel-sample"
DAG_ID = "dcp_cdc__travel_sample_a8560dff"
TASKS = ("capture", "ingest_bronze", "apply_silver", "check_quality")
LAKE = "lake"


@dataclass
class Rehearsal:
    """Everything the rehearsal started: the servers, the configuration every process reads
    and the environment every process gets (the capture password and the S3 keys)."""

    s3: MotoS3Server
    producer: Producer
    config: Path
    env: dict[str, str]
    stack: Stack
    database: Path


def write_config(
    work: Path,
    s3: MotoS3Server,
    connection_string: str,
    metastore: str,
    spark_conf: Mapping[str, str] = {},
) -> Path:
    """The deployment's configuration: landing and warehouse on S3 without the keys (those
    come from the AWS environment), the shared catalog, the DAG's jobs sized for the stack
    (plus ``spark_conf``)."""
    from tests.support.capture_harness import PASSWORD_ENV, USER

    capture = {"connection_string": connection_string, "username": USER}
    capture["password_env"] = PASSWORD_ENV
    s3_conf = {k: v for k, v in s3.spark_conf().items() if not k.endswith("key")}
    s3_conf |= spark_conf
    path = work / "dcp-cdc.toml"
    path.write_text(f"""
landing = "s3a://{LAKE}/landing"
warehouse = "s3a://{LAKE}/warehouse"
[spark]
shuffle_partitions = 2
metastore = "{metastore}"
[[buckets]]
name = "{BUCKET}"
{stack_settings(capture, s3_conf)}""")
    return path


def cli(env: dict[str, str], *args: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    """``dcp-cdc ARGS`` in a child process with ``env``."""
    return subprocess.run(
        [sys.executable, "-m", "pipelines.app.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@contextmanager
def rehearsal(
    work: Path,
    spark_conf: Mapping[str, str] = {},
    log_level: str = "WARNING",
    **producer_options: Any,
) -> Iterator[Rehearsal]:
    """Every server of the deployment, up and ready, with the DAG parsed (its jobs get
    ``spark_conf`` too, and log at ``log_level``); all stopped at the end (the catalog's
    ``dcp-cdc metastore stop`` must answer ``stopped``)."""
    from tests.support.capture_harness import PASSWORD, PASSWORD_ENV, producer

    database = work / "catalog" / "metastore_db"
    metastore = f"derby://127.0.0.1:{free_port()}{database}"
    with MotoS3Server() as s3, producer(work, bucket=BUCKET, **producer_options) as prod:
        s3.create_bucket(LAKE)
        prod.wait_workload()
        config = write_config(work, s3, prod.info["connection_string"], metastore, spark_conf)
        env = {k: v for k, v in os.environ.items() if k != "DCP_CDC_CONFIG"}
        env |= {PASSWORD_ENV: PASSWORD, "PYTHONPATH": str(ROOT), "DCP_CDC_LOG_LEVEL": log_level}
        env |= s3.credentials
        begun = cli(env, "metastore", "start", "--config", str(config), timeout=120)
        assert begun.returncode == 0, begun.stderr
        try:
            with local_stack(work / "stack", config=config, env=env) as stack:
                stack.api.wait_for_dag(DAG_ID)
                yield Rehearsal(s3, prod, config, env, stack, database)
        finally:
            stopped = cli(env, "metastore", "stop", "--config", str(config), timeout=120)
        assert stopped.returncode == 0 and stopped.stdout.startswith("stopped "), stopped.stdout


def timestamp(value: str) -> float:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def task_times(stack: Stack, run_id: str) -> dict[str, tuple[float, float]]:
    """Each finished task's start and end (epoch seconds), as Airflow recorded them."""
    found = stack.api.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances")
    return {
        ti["task_id"]: (timestamp(ti["start_date"]), timestamp(ti["end_date"]))
        for ti in found["task_instances"]
        if ti["start_date"] and ti["end_date"]
    }


def run_dag(stack: Stack) -> tuple[str, dict[str, Any]]:
    """Trigger the bucket's DAG and wait for it: its run id and run, every task a success."""
    run_id = stack.api.trigger(DAG_ID)
    run = stack.api.wait_for_run(DAG_ID, run_id, seconds=2400)
    states = stack.api.task_states(DAG_ID, run_id)
    logs = stack.task_logs() if run["state"] != "success" else ""
    assert states == dict.fromkeys(TASKS, "success"), f"{states}\n{logs}"
    assert run["state"] == "success"
    return run_id, run


def keys(s3: MotoS3Server, prefix: str) -> list[str]:
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=LAKE, Prefix=prefix)
    return [item["Key"] for page in pages for item in page.get("Contents", [])]


def _download(s3: MotoS3Server, prefix: str, into: Path) -> None:
    client = s3.client()
    for key in keys(s3, prefix):
        if key.endswith("/"):  # a directory marker S3A leaves
            continue
        target = into / key
        target.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(LAKE, key, str(target))


def truth(truth_out: Path) -> set[tuple[int, str, int]]:
    """The producer's documents as (collection id, key, seqno)."""
    found = set()
    for line in (truth_out / "truth" / "documents.jsonl").read_text().splitlines():
        doc = json.loads(line)
        key = doc.get("key") or base64.b64decode(doc["key_b64"]).decode("utf-8", "replace")
        found.add((doc["collection_id"], key, doc["seqno"]))
    return found


def silver(s3: MotoS3Server, into: Path) -> set[tuple[int, str, int]]:
    """Silver's live rows as users see them, read back from the bucket with delta-rs."""
    from tests.support import delta_rs

    _download(s3, "warehouse/silver.db/", into)
    tables = sorted((into / "warehouse" / "silver.db").glob("*_all"))
    assert tables, "no silver table in the bucket"
    return {
        (r["_collection_id"], r["key"], r["_seqno"])
        for r in delta_rs.silver_rows(into / "warehouse" / "silver.db", ["_deleted"])
        if not r["_deleted"]
    }
