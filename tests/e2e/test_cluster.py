"""ingest → apply → check on a Spark standalone cluster whose executors do not have dcp-cdc.

A master and a worker are started from pyspark's own ``spark-class`` (loopback only, work dir
in a temporary folder) by ``build-support/local_stack.py``'s code
(:mod:`tests.support.standalone_cluster`). The executors' Python is a venv that sees the dependencies (a ``.pth``
line naming this interpreter's site-packages, so the editable install's own ``.pth`` there is
not processed) but not the package: the code must come from ``[spark] py_files`` (``auto``),
shipped by the session every entry point builds. The driver is ``dcp-cdc run --config``.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import sysconfig
import time
import venv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.standalone_cluster import standalone_cluster

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    # about 2.5 minutes: in make test-long, which keeps make test under its 30-minute budget
    pytest.mark.skipif(
        os.environ.get("DCP_CDC_CLUSTER") != "1", reason="make test-long (DCP_CDC_CLUSTER=1)"
    ),
]
CLI = Path(sys.executable).with_name("dcp-cdc")
BUCKET = "travel-sample"


def _cluster_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("PYSPARK")}
    env |= {"SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}
    return env


@pytest.fixture(scope="module")
def executor_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Python with the dependencies and without dcp_cdc or pipelines."""
    folder = tmp_path_factory.mktemp("executor-venv")
    venv.EnvBuilder(with_pip=False).create(folder)
    python = folder / "bin" / "python"
    done = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    site = Path(done.stdout.strip())
    # A plain path line: that folder joins sys.path, but its own .pth files (the editable
    # install's finder) are not processed.
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = _cluster_env()
    for module, importable in (("pyarrow", True), ("pipelines", False), ("dcp_cdc", False)):
        probe = subprocess.run(
            [str(python), "-c", f"import {module}"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            cwd=folder,
        )
        assert (probe.returncode == 0) == importable, (module, probe.stderr[-500:])
    return python


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, executor_python: Path) -> Iterator[str]:
    """``spark://127.0.0.1:PORT`` of a master and one worker (1 core, 1 GiB)."""
    folder = tmp_path_factory.mktemp("cluster")
    env = _cluster_env() | {"PYSPARK_PYTHON": str(executor_python)}
    with standalone_cluster(folder, env=env, workers=1, cores=1, memory="1g") as master_url:
        yield master_url


def _silver(warehouse: Path) -> dict[tuple[int, str], tuple[Any, ...]]:
    from tests.support import delta_rs

    rows = {}
    for r in delta_rs.silver_rows(warehouse / "silver.db", ["_deleted"]):
        if not r["_deleted"]:
            rows[(r["_collection_id"], r["key"])] = (r["_seqno"], r["_rev_seqno"], r["_vbucket"])
    return rows


def _truth(out: Path) -> dict[tuple[int, str], tuple[Any, ...]]:
    docs = {}
    for line in (out / "truth" / "documents.jsonl").read_text().splitlines():
        d = json.loads(line)
        key = d["key"] if "key" in d else base64.b64decode(d["key_b64"]).decode("utf-8", "replace")
        docs[(d["collection_id"], key)] = (d["seqno"], d["rev_seqno"], d["vbucket"])
    return docs


def test_run_on_a_standalone_cluster_ships_the_code_and_silver_equals_the_truth(
    cluster: str, executor_python: Path, tmp_path: Path
) -> None:
    from dcp_cdc.simulator import simulate

    result = simulate(
        tmp_path / "sim", scenario="basic", seed=3, vbuckets=4, docs=120, ops=300, bucket=BUCKET
    )
    config = tmp_path / "cluster.toml"
    config.write_text(f"""
landing = "{tmp_path / "sim" / "landing"}"
warehouse = "{tmp_path / "warehouse"}"
[[buckets]]
name = "{BUCKET}"
[spark]
master = "{cluster}"
shuffle_partitions = 1
[spark.conf]
"spark.driver.host" = "127.0.0.1"
"spark.driver.bindAddress" = "127.0.0.1"
"spark.cores.max" = "1"
"spark.executor.memory" = "768m"
"spark.pyspark.python" = "{executor_python}"
"spark.driver.extraJavaOptions" = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m -XX:+UseSerialGC"
"spark.executor.extraJavaOptions" = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m -XX:+UseSerialGC"
""")
    # The driver has the package (this environment); the executors only the dependencies.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK")}
    env |= {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": str(executor_python)}
    started = time.monotonic()
    done = subprocess.run(
        [str(CLI), "run", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    print(f"dcp-cdc run on the cluster: {time.monotonic() - started:.0f} s")
    assert "Quality: PASSED" in done.stdout, done.stdout[-3000:]
    assert _silver(tmp_path / "warehouse") == _truth(result.out)
