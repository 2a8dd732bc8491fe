"""The production rehearsal: every server a deployment runs, started the way docs/deployment.md
starts them, on 127.0.0.1.

- an S3 API (moto's server) holds the landing and the warehouse (``s3a://lake/...``); the keys
  reach every process through the AWS environment, never the configuration;
- ``dcp-cdc metastore start`` serves the shared catalog (a Derby network server whose database
  is a local path, named in ``[spark] metastore``);
- ``build-support/local_stack.py up`` (``make airflow-up``) runs Airflow's scheduler with its
  LocalExecutor on PostgreSQL, and a Spark standalone master with two workers;
- the test DCP producer is the cluster.

The bucket's DAG runs twice under the scheduler (capture into the S3 landing, then ingest,
apply and check ``spark-submit``-ed to the standalone master, on the S3 warehouse). Between the
runs the bucket changes. While the second run goes, a second process queries silver through the
shared catalog (``dcp-cdc sql``) again and again, and ``dcp-cdc maintain`` (purge, OPTIMIZE,
VACUUM) runs again and again over the same tables, overlapping the apply. Every run, query and
maintenance must succeed, and silver (read back from the bucket with delta-rs) must equal the
producer's truth. Under ``DCP_CDC_REHEARSAL=1`` (``make test-long``): about a quarter of an hour
on two cores.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pipelines.lake import object_storage
from tests.support.airflow_stack import Stack, local_stack, stack_settings
from tests.support.ports import free_port
from tests.support.s3_server import MotoS3Server

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("DCP_CDC_REHEARSAL") != "1", reason="make test-long (DCP_CDC_REHEARSAL=1)"
    ),
    pytest.mark.skipif(
        not (object_storage.CHECKOUT_S3_JARS_DIR / object_storage.LOG_STORE_JAR).is_file(),
        reason="no S3 jars (make setup-s3)",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "travel-sample"
DAG_ID = "dcp_cdc__travel_sample_a8560dff"
TASKS = ("capture", "ingest_bronze", "apply_silver", "check_quality")
LAKE = "lake"


@pytest.fixture
def work() -> Iterator[Path]:
    """A folder the ``postgres`` OS user can enter (pytest's own temp root is private)."""
    folder = Path(tempfile.mkdtemp(prefix="dcp-cdc-rehearsal-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _config(work: Path, s3: MotoS3Server, connection_string: str, metastore: str) -> Path:
    from tests.support.capture_harness import PASSWORD_ENV, USER

    capture = {"connection_string": connection_string, "username": USER}
    capture["password_env"] = PASSWORD_ENV
    # The S3 settings without the keys: those come from the AWS environment.
    s3_conf = {k: v for k, v in s3.spark_conf().items() if not k.endswith("key")}
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


def _cli(
    env: dict[str, str], *args: str, timeout: float = 1800
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipelines.app.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@dataclass
class Loop:
    """A command run again and again in a thread until stopped: each run's interval and result."""

    env: dict[str, str]
    args: tuple[str, ...]
    runs: list[tuple[float, float, subprocess.CompletedProcess[str]]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            began = time.time()
            done = _cli(self.env, *self.args)
            self.runs.append((began, time.time(), done))

    def __enter__(self) -> Loop:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=1800)


def _timestamp(value: str) -> float:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _task_times(stack: Stack, run_id: str) -> dict[str, tuple[float, float]]:
    found = stack.api.call("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances")
    return {
        ti["task_id"]: (_timestamp(ti["start_date"]), _timestamp(ti["end_date"]))
        for ti in found["task_instances"]
        if ti["start_date"] and ti["end_date"]
    }


def _run_dag(stack: Stack) -> tuple[str, dict[str, Any], dict[str, str | None]]:
    run_id = stack.api.trigger(DAG_ID)
    run = stack.api.wait_for_run(DAG_ID, run_id, seconds=2400)
    states = stack.api.task_states(DAG_ID, run_id)
    logs = stack.task_logs() if run["state"] != "success" else ""
    assert states == dict.fromkeys(TASKS, "success"), f"{states}\n{logs}"
    assert run["state"] == "success"
    return run_id, run, states


def _keys(s3: MotoS3Server, prefix: str) -> list[str]:
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=LAKE, Prefix=prefix)
    return [item["Key"] for page in pages for item in page.get("Contents", [])]


def _download(s3: MotoS3Server, prefix: str, into: Path) -> None:
    client = s3.client()
    for key in _keys(s3, prefix):
        if key.endswith("/"):  # a directory marker S3A leaves
            continue
        target = into / key
        target.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(LAKE, key, str(target))


def _truth(truth_out: Path) -> set[tuple[int, str, int]]:
    truth = set()
    for line in (truth_out / "truth" / "documents.jsonl").read_text().splitlines():
        doc = json.loads(line)
        key = doc.get("key") or base64.b64decode(doc["key_b64"]).decode("utf-8", "replace")
        truth.add((doc["collection_id"], key, doc["seqno"]))
    return truth


def _silver(s3: MotoS3Server, into: Path) -> set[tuple[int, str, int]]:
    from tests.support import delta_rs

    _download(s3, "warehouse/silver.db/", into)
    tables = sorted((into / "warehouse" / "silver.db").glob("*_all"))
    assert tables, "no silver table in the bucket"
    silver = {
        (r["_collection_id"], r["key"], r["_seqno"])
        for r in delta_rs.silver_rows(into / "warehouse" / "silver.db", ["_deleted"])
        if not r["_deleted"]
    }
    return silver


def test_production_rehearsal(work: Path) -> None:
    from tests.support.capture_harness import PASSWORD, PASSWORD_ENV, producer

    started = time.monotonic()
    database = work / "catalog" / "metastore_db"
    metastore = f"derby://127.0.0.1:{free_port()}{database}"
    with (
        MotoS3Server() as s3,
        producer(work, bucket=BUCKET, nodes=2, vbuckets=16, docs=300, ops=0, seed=11) as prod,
    ):
        s3.create_bucket(LAKE)
        prod.wait_workload()
        config = _config(work, s3, prod.info["connection_string"], metastore)
        # What every process gets: the capture password and the S3 keys, from the environment.
        env = {k: v for k, v in os.environ.items() if k != "DCP_CDC_CONFIG"}
        env |= {PASSWORD_ENV: PASSWORD, "PYTHONPATH": str(ROOT), "DCP_CDC_LOG_LEVEL": "WARNING"}
        env |= s3.credentials
        begun = _cli(env, "metastore", "start", "--config", str(config), timeout=120)
        assert begun.returncode == 0, begun.stderr
        try:
            with local_stack(work / "stack", config=config, env=env) as stack:
                ready = time.monotonic()
                stack.api.wait_for_dag(DAG_ID)
                _run_dag(stack)
                first = time.monotonic()
                first_silver = _silver(s3, work / "first")
                assert first_silver == _truth(prod.truth_out)
                tables = (work / "first" / "warehouse" / "silver.db").glob("*_all")
                table = min(p.name for p in tables)

                prod.control("changes 400")  # the bucket changes between the runs
                prod.control("truth")
                query = (
                    "sql",
                    "--config",
                    str(config),
                    f"SELECT count(*) AS n FROM silver.{table}",
                )
                maintain = ("maintain", "--config", str(config))
                with Loop(env, query) as queries, Loop(env, maintain) as maintenance:
                    run_id, run, _ = _run_dag(stack)
                    times = _task_times(stack, run_id)
                second = time.monotonic()
                logs = stack.task_logs()
        finally:
            stopped = _cli(env, "metastore", "stop", "--config", str(config), timeout=120)
        assert stopped.returncode == 0 and stopped.stdout.startswith("stopped "), stopped.stdout

        truth = _truth(prod.truth_out)
        assert truth != first_silver, "the changes between the runs changed nothing"
        assert _silver(s3, work / "second") == truth
        landing, bronze = _keys(s3, "landing/"), _keys(s3, "warehouse/bronze.db/")
        report = _keys(s3, "warehouse/quality/")  # the check's report and data docs
        secret = s3.credentials["AWS_SECRET_ACCESS_KEY"]

    print(
        f"rehearsal: stack up {ready - started:.0f} s, first run {first - ready:.0f} s, second "
        f"run {second - first:.0f} s with {len(queries.runs)} queries and "
        f"{len(maintenance.runs)} maintenance runs beside it; query spans "
        f"{[round(e - b) for b, e, _ in queries.runs]} s, maintenance spans "
        f"{[round(e - b) for b, e, _ in maintenance.runs]} s"
    )
    # the landing and the warehouse are in the bucket, not on local disk
    assert any(k.endswith(".dcpcap") for k in landing), "no capture file on S3"
    assert not (work / "landing").exists() and not (work / "warehouse").exists()
    assert any("/_delta_log/" in k for k in bronze)
    assert any(k.endswith("/summary.html") for k in report), report
    assert any(k.endswith("/data_docs/index.html") for k in report), report
    # the catalog is the shared one: its Derby database is where the setting says
    assert (database / "service.properties").is_file()

    run_start, run_end = _timestamp(run["start_date"]), _timestamp(run["end_date"])
    for _began, _ended, done in queries.runs + maintenance.runs:
        assert done.returncode == 0, f"{done.args}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        assert "Traceback" not in done.stderr
        assert PASSWORD not in done.stdout + done.stderr
        assert secret not in done.stdout + done.stderr
    spans = [(round(b - run_start), round(e - run_start)) for b, e, _ in queries.runs]
    answered = [d for b, e, d in queries.runs if b < run_end and e > run_start]
    lasted = run_end - run_start
    assert answered, f"queries (s from the start of a {lasted:.0f} s run): {spans}"
    assert all("(1 rows)" in d.stdout for d in answered)
    apply_start, apply_end = times["apply_silver"]
    overlapping = [d for b, e, d in maintenance.runs if b < apply_end and e > apply_start]
    assert overlapping, f"no maintenance run overlapped the apply: {maintenance.runs}, {times}"
    vacuumed = [int(m) for d in overlapping for m in re.findall(r"(\d+) vacuumed", d.stdout)]
    assert any(vacuumed), [d.stdout for d in overlapping]  # it found the tables and kept them
    assert secret not in logs and PASSWORD not in logs
