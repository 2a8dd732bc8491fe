"""A JVM started for ingest alone runs its JIT at C1 by default (``[ingest] jvm_jit``): asked
of the JVM itself (its input arguments), in a process of its own. (What the setting adds and
that ``tiered`` adds nothing: tests/unit/test_spark_launch.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.lake.spark_session import C1_ONLY

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PROBE = """
import json, sys
from dcp_cdc.config import AppConfig, BucketConfig
from pipelines.bronze import job
from pyspark.sql import SparkSession

landing, warehouse = sys.argv[1:3]
config = AppConfig(landing=landing, warehouse=warehouse, buckets=[BucketConfig(name="b")])
summaries = job.run(config)  # builds the session as `dcp-cdc ingest` does; nothing to ingest
spark = SparkSession.getActiveSession()
jvm = spark.sparkContext._jvm
arguments = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
print(json.dumps({"files": [s.files for s in summaries], "jvm": arguments}))
spark.stop()
"""


def test_an_ingest_jvm_runs_c1_only(tmp_path: Path) -> None:
    landing = tmp_path / "landing"
    (landing / "b").mkdir(parents=True)
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(landing), str(tmp_path / "warehouse")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["files"] == [0]
    for option in C1_ONLY.split():  # C1 alone, with a code cache a MERGE cannot fill
        assert option in found["jvm"], found["jvm"]
