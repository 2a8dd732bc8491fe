"""The DAGs: made from the configuration, light to parse, and runnable end to end."""

from __future__ import annotations

import base64
import contextlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.dags.conftest import DAGS

PIPELINE = ["ingest_bronze", "apply_silver", "check_quality"]
HEAVY = ("pyspark", "py4j", "great_expectations", "delta", "deltalake", "pandas", "pyarrow")


def _config(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _dagbag() -> Any:
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


def test_parsing_imports_neither_spark_nor_great_expectations(
    airflow_env: dict[str, str], config_file: Path
) -> None:
    """The DAG processor's view, in a fresh interpreter: no import errors, no heavy modules."""
    _config(config_file, 'landing = "l"\nwarehouse = "w"\n[[buckets]]\nname = "travel-sample"\n')
    probe = (
        "import json, sys\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag(dag_folder={str(DAGS)!r})\n"
        "print(json.dumps({'errors': bag.import_errors, 'dags': sorted(bag.dags),\n"
        f"    'heavy': [m for m in {HEAVY!r} if m in sys.modules]}}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {
        "errors": {},
        "dags": ["dcp_cdc__travel_sample_a8560dff", "dcp_cdc_maintenance"],
        "heavy": [],
    }


def test_an_invalid_configuration_is_an_import_error_naming_the_field(config_file: Path) -> None:
    _config(
        config_file,
        'landing = "l"\nwarehouse = "w"\n[[buckets]]\nname = "b"\n[airflow]\nretries = -1\n',
    )
    bag = _dagbag()
    assert not bag.dags
    (error,) = bag.import_errors.values()
    assert "airflow.retries" in error and str(config_file) in error


def test_dags_tasks_and_settings_come_from_the_configuration(config_file: Path) -> None:
    import datetime as dt

    _config(
        config_file,
        """
landing = "landing"
warehouse = "warehouse"
[[buckets]]
name = "travel-sample"
[[buckets]]
name = "orders"
[airflow]
schedule = "*/20 * * * *"
maintenance_schedule = "0 3 * * *"
start_date = 2026-02-01
retries = 4
retry_delay_seconds = 60
retry_exponential_backoff = 3.0
max_retry_delay_seconds = 900
execution_timeout_minutes = 45
spark_conn_id = "my_spark"
pool = "spark_pool"
""",
    )
    bag = _dagbag()
    assert bag.import_errors == {}
    assert sorted(bag.dags) == [
        "dcp_cdc__orders",
        "dcp_cdc__travel_sample_a8560dff",
        "dcp_cdc_maintenance",
    ]
    for dag_id in ("dcp_cdc__orders", "dcp_cdc__travel_sample_a8560dff"):
        dag = bag.dags[dag_id]
        assert [t.task_id for t in dag.topological_sort()] == PIPELINE
        assert {t.task_id: sorted(t.downstream_task_ids) for t in dag.tasks} == {
            "ingest_bronze": ["apply_silver"],
            "apply_silver": ["check_quality"],
            "check_quality": [],
        }
        assert (dag.max_active_runs, dag.catchup) == (1, False)
        assert dag.timetable.expression == "*/20 * * * *"
        assert dag.start_date == dt.datetime(2026, 2, 1, tzinfo=dt.UTC)
        assert set(dag.params) == {"backfill"}
        for task in dag.tasks:
            assert task._conn_id == "my_spark"
            assert task.retries == (0 if task.task_id == "check_quality" else 4)
            assert task.retry_delay == dt.timedelta(seconds=60)
            assert task.retry_exponential_backoff == 3.0
            assert task.max_retry_delay == dt.timedelta(seconds=900)
            assert task.execution_timeout == dt.timedelta(minutes=45)
            assert task.pool == "spark_pool" and not task.depends_on_past
    bucket_args = {t.task_id: t.application_args for t in bag.dags["dcp_cdc__orders"].tasks}
    assert bucket_args == {
        task: ["--config", str(config_file), "--bucket", "orders"] for task in PIPELINE
    }
    maintenance = bag.dags["dcp_cdc_maintenance"]
    assert maintenance.timetable.expression == "0 3 * * *" and maintenance.max_active_runs == 1
    assert [t.task_id for t in maintenance.topological_sort()] == [
        "maintain__travel_sample_a8560dff",
        "check_full__travel_sample_a8560dff",
        "maintain__orders",
        "check_full__orders",
    ]
    for t in maintenance.tasks:
        if t.task_id.startswith("maintain__"):
            assert t.application.endswith("pipelines/maintenance/job.py")
        else:  # a full check after each bucket's maintenance, which fails alone
            assert t.application.endswith("pipelines/quality/job.py") and t.retries == 0
            assert t.application_args[-1] == "--full"


def test_spark_submit_command_has_the_delta_jars_and_the_backfill_flags(
    config_file: Path,
) -> None:
    from airflow.sdk.exceptions import ParamValidationError

    from pipelines.lake.spark_session import C1_ONLY

    _config(config_file, 'landing = "l"\nwarehouse = "w"\n[[buckets]]\nname = "orders"\n')
    dag = _dagbag().dags["dcp_cdc__orders"]
    apply = dag.get_task("apply_silver")
    apply.prepare({"params": {"backfill": "inventory.airline"}})
    command = apply._get_hook()._build_spark_submit_command(apply.application)
    assert Path(command[0]).name == "spark-submit" and Path(command[0]).exists()
    assert command[command.index("--master") + 1] == "local[2]"
    conf = dict(command[i + 1].split("=", 1) for i, arg in enumerate(command) if arg == "--conf")
    assert "spark.master" not in conf  # the connection's, above
    assert "--py-files" not in command  # a local master's executors are this Python
    assert any(Path(j).name.startswith("delta-spark_") for j in conf["spark.jars"].split(","))
    assert conf["spark.sql.warehouse.dir"] == str(config_file.parent / "w")
    assert conf["spark.driver.memory"] == "6g"
    application = Path(apply.application)
    assert application.is_file() and application.parts[-2:] == ("silver", "job.py")
    assert command[command.index(apply.application) + 1 :] == [
        "--config",
        str(config_file),
        "--bucket",
        "orders",
        "--rebuild",
        "--collection",
        "inventory.airline",
    ]
    assert apply.flags({"params": {"backfill": "bucket"}}) == ["--rebuild"]
    assert apply.flags({"params": {"backfill": ""}}) == []
    assert "TieredStopAtLevel" not in conf["spark.driver.extraJavaOptions"]  # C2 for MERGE
    ingest = dag.get_task("ingest_bronze")  # a backfill is silver's business only
    ingest.prepare({"params": {"backfill": "bucket"}})
    command = ingest._get_hook()._build_spark_submit_command(ingest.application)
    assert command[-4:] == ["--config", str(config_file), "--bucket", "orders"]
    conf = dict(command[i + 1].split("=", 1) for i, arg in enumerate(command) if arg == "--conf")
    # a JVM for ingest alone runs C1 only ([ingest] jvm_jit), after the session's own options
    driver = conf["spark.driver.extraJavaOptions"]
    assert driver.startswith("-Dderby.system.home=") and driver.endswith(f" {C1_ONLY}")
    assert conf["spark.executor.extraJavaOptions"] == C1_ONLY
    backfill = dag.params.get_param("backfill")
    assert backfill.resolve("bucket") == "bucket"
    with pytest.raises(ParamValidationError):
        backfill.resolve("no dot")


def test_on_a_cluster_a_runs_tasks_start_their_executors_only_for_a_spark_job(
    config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A small run's ingest, apply and check run in the driver: on a cluster master their
    applications ask for executors only when a job needs them; the maintenance task keeps its
    own from the start, and the configuration's own dynamic allocation settings win."""
    from pipelines.lake.spark_session import EXECUTORS_ON_DEMAND, executors_on_demand
    from tests.dags.conftest import SPARK_CONN

    assert executors_on_demand("local[2]") == {}
    cluster = {"conn_type": "spark", "host": "spark://127.0.0.1", "port": 7077}
    monkeypatch.setenv(SPARK_CONN, json.dumps(cluster))
    text = 'landing = "l"\nwarehouse = "w"\n[[buckets]]\nname = "orders"\n'

    def conf_of(task_id: str, dag_id: str = "dcp_cdc__orders") -> dict[str, str]:
        task = _dagbag().dags[dag_id].get_task(task_id)
        task.prepare({"params": {}})
        command = task._get_hook()._build_spark_submit_command(task.application)
        assert command[command.index("--master") + 1] == "spark://127.0.0.1:7077"
        return dict(command[i + 1].split("=", 1) for i, a in enumerate(command) if a == "--conf")

    _config(config_file, text)
    for task_id in ("ingest_bronze", "apply_silver", "check_quality"):
        conf = conf_of(task_id)
        assert {k: conf[k] for k in EXECUTORS_ON_DEMAND} == EXECUTORS_ON_DEMAND
    maintain = conf_of("maintain__orders", "dcp_cdc_maintenance")
    assert not any(k.startswith("spark.dynamicAllocation.") for k in maintain)
    _config(config_file, text + '[spark.conf]\n"spark.dynamicAllocation.enabled" = "false"\n')
    assert conf_of("check_quality")["spark.dynamicAllocation.enabled"] == "false"


@pytest.mark.long
@pytest.mark.slow
def test_pipeline_dag_captures_then_runs_end_to_end(
    config_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dag.test()``: the capture task streams the test producer (a child process, 2 data
    nodes) up to now, then three spark-submit jobs on a local master; silver equals the truth."""
    from pipelines.lake.spark_session import C1_ONLY
    from tests.support import delta_rs
    from tests.support.capture_harness import PASSWORD, PASSWORD_ENV, USER, producer

    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)  # the capture task's child process reads it
    stack = contextlib.ExitStack()
    prod = stack.enter_context(
        producer(tmp_path, bucket="travel-sample", nodes=2, vbuckets=16, docs=300, ops=0, seed=4)
    )
    prod.wait_workload()  # no live changes: the truth is the initial load
    _config(
        config_file,
        f"""
landing = "{tmp_path / "landing"}"
warehouse = "../warehouse"
[[buckets]]
name = "travel-sample"
[buckets.capture]
connection_string = "{prod.info["connection_string"]}"
username = "{USER}"
password_env = "{PASSWORD_ENV}"
[spark]
shuffle_partitions = 2
conf = {{ "spark.driver.extraJavaOptions" = "{C1_ONLY} -XX:+UseSerialGC" }}
[airflow]
retries = 0
execution_timeout_minutes = 10
""",
    )
    dag = _dagbag().dags["dcp_cdc__travel_sample_a8560dff"]
    with stack:
        run = dag.test()
    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert states == dict.fromkeys(("capture", *PIPELINE), "success") and run.state == "success"
    assert list((tmp_path / "landing").glob("*.dcpcap"))

    warehouse = tmp_path / "warehouse"
    truth = set()
    for line in (prod.truth_out / "truth" / "documents.jsonl").read_text().splitlines():
        doc = json.loads(line)
        key = doc.get("key") or base64.b64decode(doc["key_b64"]).decode("utf-8", "replace")
        truth.add((doc["collection_id"], key, doc["seqno"]))
    silver = {
        (r["_collection_id"], r["key"], r["_seqno"])
        for r in delta_rs.silver_rows(warehouse / "silver.db", ["_deleted"])
        if not r["_deleted"]
    }
    assert silver == truth


def test_default_configuration_for_a_checkout_and_an_installed_package(
    airflow_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pipelines.app.airflow_tasks as dcp_airflow
    from dcp_cdc.errors import ConfigError

    monkeypatch.delenv("DCP_CDC_CONFIG", raising=False)
    assert dcp_airflow.config_path() == dcp_airflow.CHECKOUT_CONFIG  # make-built checkout
    # an installed package has no checkout beside it: ./conf/local.toml, else an error
    monkeypatch.setattr(dcp_airflow, "CHECKOUT_CONFIG", tmp_path / "site" / "conf" / "local.toml")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="DCP_CDC_CONFIG"):
        dcp_airflow.config_path()
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "local.toml").write_text("")
    assert dcp_airflow.config_path() == tmp_path / "conf" / "local.toml"
    monkeypatch.setenv("DCP_CDC_CONFIG", "elsewhere.toml")
    assert dcp_airflow.config_path() == tmp_path / "elsewhere.toml"


def test_a_bucket_with_a_capture_section_captures_first(config_file: Path) -> None:
    _config(
        config_file,
        'landing = "l"\nwarehouse = "w"\n[[buckets]]\nname = "orders"\n[[buckets]]\n'
        'name = "live"\n[buckets.capture]\nconnection_string = "couchbase://127.0.0.1"\n'
        'username = "reader"\npassword_env = "CB_PASSWORD"\n',
    )
    bag = _dagbag()
    assert [t.task_id for t in bag.dags["dcp_cdc__orders"].topological_sort()] == PIPELINE
    dag = bag.dags["dcp_cdc__live"]
    assert [t.task_id for t in dag.topological_sort()] == ["capture", *PIPELINE]
    capture = dag.get_task("capture")
    assert capture.command()[-7:] == [
        "capture",
        "--config",
        str(config_file),
        "--bucket",
        "live",
        "--until",
        "now",
    ]
    assert "CB_PASSWORD" not in " ".join(capture.command())  # the agent reads it, not Airflow


def test_a_capture_task_stopped_midway_stops_its_agent(
    config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Airflow's execution timeout interrupts the task while the agent runs: the agent gets
    SIGTERM (what makes its capture durable) and the task fails at once, not when it ends."""
    import signal
    import time

    from airflow.sdk.exceptions import AirflowTaskTimeout
    from airflow.sdk.execution_time.timeout import timeout

    from pipelines.app import airflow_tasks

    children: list[subprocess.Popen[str]] = []
    popen = subprocess.Popen

    def spawn(*args: Any, **kwargs: Any) -> subprocess.Popen[str]:
        children.append(popen(*args, **kwargs))
        return children[-1]

    operator = airflow_tasks.DcpCaptureOperator(
        task_id="capture", config_path=str(config_file), bucket="live"
    )
    agent = "import time; print('capturing', flush=True); time.sleep(120)"
    monkeypatch.setattr(operator, "command", lambda: [sys.executable, "-c", agent])
    monkeypatch.setattr(airflow_tasks.subprocess, "Popen", spawn)
    started = time.monotonic()
    with pytest.raises(AirflowTaskTimeout), timeout(2):
        operator.execute({})  # type: ignore[arg-type]
    assert children and children[0].returncode == -signal.SIGTERM
    assert time.monotonic() - started < 30
