"""The pipeline DAG scheduled and run by Airflow's own scheduler, not ``dag.test()``.

``build-support/local_stack.py up`` starts what a user starts (the metadata database, the API
server with the execution API, the DAG processor, the scheduler with its LocalExecutor, and a
Spark standalone master with two workers, all on 127.0.0.1); the test triggers the bucket's DAG
through the REST API, reads the run's and every task's state back from it, and compares silver
with the test producer's truth. ``capture`` streams the producer; the three jobs are
``spark-submit`` to the standalone master.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.airflow_stack import local_stack, stack_settings

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    # minutes on two cores (three JVMs and four Airflow processes): in make test-long
    pytest.mark.skipif(
        os.environ.get("DCP_CDC_AIRFLOW") != "1", reason="make test-long (DCP_CDC_AIRFLOW=1)"
    ),
]
DAG_ID = "dcp_cdc__travel_sample_a8560dff"
TASKS = ("capture", "ingest_bronze", "apply_silver", "check_quality")


@pytest.fixture
def work() -> Iterator[Path]:
    """A folder the ``postgres`` OS user can enter (pytest's own temp root is private)."""
    folder = Path(tempfile.mkdtemp(prefix="dcp-cdc-airflow-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_the_scheduler_runs_the_pipeline_dag_on_a_standalone_cluster(work: Path) -> None:
    from tests.support import delta_rs
    from tests.support.capture_harness import PASSWORD, PASSWORD_ENV, USER, producer

    started = time.monotonic()
    with producer(
        work, bucket="travel-sample", nodes=2, vbuckets=16, docs=300, ops=0, seed=4
    ) as prod:
        prod.wait_workload()  # no live changes: the truth is the initial load
        config = work / "dcp-cdc.toml"
        capture = {
            "connection_string": prod.info["connection_string"],
            "username": USER,
            "password_env": PASSWORD_ENV,
        }
        config.write_text(f"""
landing = "{work / "landing"}"
warehouse = "{work / "warehouse"}"
[spark]
shuffle_partitions = 2
[[buckets]]
name = "travel-sample"
{stack_settings(capture)}""")
        # the capture task's agent reads the password from the worker's environment
        env = os.environ | {PASSWORD_ENV: PASSWORD}
        with local_stack(work / "stack", config=config, env=env) as stack:
            ready = time.monotonic()
            stack.api.wait_for_dag(DAG_ID)
            run_id = stack.api.trigger(DAG_ID)
            run = stack.api.wait_for_run(DAG_ID, run_id, seconds=1800)
            states = stack.api.task_states(DAG_ID, run_id)
            logs = stack.task_logs() if run["state"] != "success" else ""
            finished = time.monotonic()
            used = stack.info["database"]
    print(
        f"stack up {ready - started:.0f} s, DAG run {finished - ready:.0f} s, "
        f"all stopped {time.monotonic() - finished:.0f} s later (metadata on {used})"
    )
    assert used == "postgres"  # a metadata database Airflow supports for the LocalExecutor
    assert states == dict.fromkeys(TASKS, "success"), f"{states}\n{logs}"
    assert run["state"] == "success" and run["run_type"] == "manual"
    assert list((work / "landing").glob("*.dcpcap"))
    # the three jobs ran executors on the standalone workers, one application each
    apps = {app.name for app in (work / "stack" / "spark").glob("worker-*/app-*")}
    assert len(apps) == 3, apps

    truth = set()
    for line in (prod.truth_out / "truth" / "documents.jsonl").read_text().splitlines():
        doc = json.loads(line)
        key = doc.get("key") or base64.b64decode(doc["key_b64"]).decode("utf-8", "replace")
        truth.add((doc["collection_id"], key, doc["seqno"]))
    silver = {
        (r["_collection_id"], r["key"], r["_seqno"])
        for r in delta_rs.silver_rows(work / "warehouse" / "silver.db", ["_deleted"])
        if not r["_deleted"]
    }
    assert silver and silver == truth
