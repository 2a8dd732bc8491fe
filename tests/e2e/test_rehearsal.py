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

import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from pipelines.lake import object_storage
from tests.support.rehearsal import (
    cli,
    keys,
    rehearsal,
    run_dag,
    silver,
    task_times,
    timestamp,
    truth,
)

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


@pytest.fixture
def work() -> Iterator[Path]:
    """A folder the ``postgres`` OS user can enter (pytest's own temp root is private)."""
    folder = Path(tempfile.mkdtemp(prefix="dcp-cdc-rehearsal-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


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
            done = cli(self.env, *self.args)
            self.runs.append((began, time.time(), done))

    def __enter__(self) -> Loop:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=1800)


def test_production_rehearsal(work: Path) -> None:
    from tests.support.capture_harness import PASSWORD

    started = time.monotonic()
    options = {"nodes": 2, "vbuckets": 16, "docs": 300, "ops": 0, "seed": 11}
    with rehearsal(work, **options) as deployed:
        s3, prod, stack, env = deployed.s3, deployed.producer, deployed.stack, deployed.env
        config = str(deployed.config)
        ready = time.monotonic()
        run_dag(stack)
        first = time.monotonic()
        first_silver = silver(s3, work / "first")
        assert first_silver == truth(prod.truth_out)
        table = min(p.name for p in (work / "first" / "warehouse" / "silver.db").glob("*_all"))

        prod.control("changes 400")  # the bucket changes between the runs
        prod.control("truth")
        query = ("sql", "--config", config, f"SELECT count(*) AS n FROM silver.{table}")
        maintain = ("maintain", "--config", config)
        with Loop(env, query) as queries, Loop(env, maintain) as maintenance:
            run_id, run = run_dag(stack)
            times = task_times(stack, run_id)
        second = time.monotonic()
        logs = stack.task_logs()
        # read back while the S3 server runs (it stops with the deployment)
        second_silver = silver(s3, work / "second")
        landing, bronze = keys(s3, "landing/"), keys(s3, "warehouse/bronze.db/")
        report = keys(s3, "warehouse/quality/")  # the check's report and data docs
        secret = s3.credentials["AWS_SECRET_ACCESS_KEY"]

    expected = truth(prod.truth_out)
    assert expected != first_silver, "the changes between the runs changed nothing"
    assert second_silver == expected

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
    assert (deployed.database / "service.properties").is_file()

    run_start, run_end = timestamp(run["start_date"]), timestamp(run["end_date"])
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
