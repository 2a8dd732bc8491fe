"""Bronze, silver, quality and maintenance on a warehouse on S3 (the moto server): silver
equals the simulator's truth, the quality suites pass, OPTIMIZE and VACUUM run, and every
table's files are in the bucket. One process of its own (:mod:`tests.support.s3_pipeline`),
since the S3 jars join a JVM only when it starts. Under ``DCP_CDC_S3=1`` (``make test-long``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipelines.lake import object_storage
from tests.support.s3_server import MotoS3Server

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.skipif(os.environ.get("DCP_CDC_S3") != "1", reason="DCP_CDC_S3=1 (make test-long)"),
    pytest.mark.skipif(
        not (object_storage.CHECKOUT_S3_JARS_DIR / object_storage.LOG_STORE_JAR).is_file()
        and not os.environ.get(object_storage.S3_JARS_DIR_ENV),
        reason="no S3 jars (make setup-s3)",
    ),
]


def test_bronze_silver_quality_maintenance_on_s3(s3_server: MotoS3Server, tmp_path: Path) -> None:
    warehouse = s3_server.create_bucket("warehouse") + "/dcp"
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.support.s3_pipeline",
            f"--out={tmp_path / 'sim'}",
            f"--catalog={tmp_path / 'catalog'}",
            f"--warehouse-uri={warehouse}",
            f"--s3-conf={json.dumps(s3_server.spark_conf())}",
        ],
        cwd=ROOT,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("SUMMARY "))
    summary = json.loads(line.removeprefix("SUMMARY "))
    assert summary["failed_errors"] == []
    assert summary["optimized"] > 0 and summary["vacuumed"]
    assert summary["locations"] and all(
        loc.startswith("s3a://warehouse/dcp/") for loc in summary["locations"]
    ), summary["locations"]
    keys = [
        item["Key"]
        for page in s3_server.client().get_paginator("list_objects_v2").paginate(Bucket="warehouse")
        for item in page.get("Contents", [])
    ]
    assert any("/_delta_log/" in k for k in keys) and any(k.endswith(".parquet") for k in keys)
    print(f"pipeline on S3: {summary['seconds']} ({time.monotonic() - started:.1f} s in all)")
