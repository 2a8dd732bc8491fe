"""Bronze reads an S3 landing: the capture agent writes its files and checkpoint into moto's
S3 server on 127.0.0.1 (with a failure between an upload and its checkpoint, so frames land
twice), bronze lists and reads them through pyarrow's S3 filesystem with the server's endpoint
(``[spark.conf]`` ``spark.hadoop.fs.s3a.*``), and silver in a local warehouse equals the
simulator's truth.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pyspark.sql import SparkSession

from dcp_cdc.agent.driver import capture
from dcp_cdc.agent.s3_store import S3Landing
from dcp_cdc.agent.writer import CheckpointStore
from dcp_cdc.capture import iter_capture
from dcp_cdc.config import AppConfig, BucketConfig, SparkConfig
from dcp_cdc.events import Mutation
from dcp_cdc.simulator.server import ProducerServer
from dcp_cdc.simulator.state import SimConfig
from pipelines.bronze.job import ingest_bucket
from pipelines.silver.job import apply_bucket
from pipelines.tables import BucketTables
from tests.support.capture_harness import in_process_settings
from tests.support.s3_agent_server import S3Server, s3_server
from tests.support.silver_runs import drop_all
from tests.support.truth import assert_equal_to_truth


class Killed(Exception):
    """The agent dying after an upload, before the checkpoint that covers it."""


async def _capture_with_a_replay(
    s3: S3Server, out: Path, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> str:
    landing = f"s3a://{s3.bucket}/couchbase/{bucket}"
    config = SimConfig(scenario="mixed", bucket=bucket, vbuckets=8, docs=200, ops=0)
    async with ProducerServer(config, nodes=2) as server:
        s = in_process_settings(
            out,
            server.connection_string,
            bucket=bucket,
            landing=landing,
            staging=out / "staging",
            state_dir=f"{landing}/.dcp-cdc-capture",
            rotate_bytes=8192,
            s3=dataclasses.replace(s3.options, max_attempts=2),
        )
        await asyncio.wait_for(capture(s), 60)
        await server.run_workload(600, batch=100)

        uploaded = asyncio.Event()
        real_publish, real_commit = S3Landing.publish, CheckpointStore.commit

        def publish(self: S3Landing, staged: Path, name: str) -> str:
            changes = any(isinstance(e, Mutation) for e in iter_capture(staged))
            uri = real_publish(self, staged, name)
            if changes:
                uploaded.set()
            return uri

        def dying(self: CheckpointStore, *args: Any, **kwargs: Any) -> None:
            if uploaded.is_set():
                raise Killed("after the upload, before the checkpoint")
            real_commit(self, *args, **kwargs)

        with monkeypatch.context() as patch:
            patch.setattr(S3Landing, "publish", publish)
            patch.setattr(CheckpointStore, "commit", dying)
            with pytest.raises(Killed):
                await asyncio.wait_for(capture(s), 60)
        await asyncio.wait_for(capture(s), 60)
        server.write_truth(out)
    return landing


def test_bronze_ingests_the_s3_landing_and_silver_equals_the_truth(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = f"s3cap{uuid.uuid4().hex[:6]}"
    with s3_server() as s3:
        landing = asyncio.run(_capture_with_a_replay(s3, tmp_path, bucket, monkeypatch))
        app = AppConfig(
            landing=landing,
            warehouse=str(spark_warehouse),
            buckets=[BucketConfig(name=bucket)],
            spark=SparkConfig(conf=s3.spark_conf),
        )
        try:
            first = ingest_bucket(spark, app, app.buckets[0])
            apply_bucket(spark, app, app.buckets[0])
            assert_equal_to_truth(spark, bucket, SimpleNamespace(out=tmp_path))  # type: ignore[arg-type]
            log = BucketTables(bucket).ingest_log
            logged = {r["file"] for r in spark.table(log).select("file").collect()}
            assert len(logged) == first.files and first.errors == 0
            assert all(f.startswith(f"{landing}/") for f in logged), sorted(logged)[:2]
            again = ingest_bucket(spark, app, app.buckets[0])  # nothing new: nothing read
            assert again.files == 0
        finally:
            drop_all(spark, bucket)
