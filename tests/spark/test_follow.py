"""Follow mode end to end in the test session: the test producer (a child process with a live
workload), the capture agent in follow mode's thread, micro-batches of ingest and apply.

A stop asked in the middle of a micro-batch (its events written, its log not yet committed)
lets that batch finish and starts no other; a restart carries on and, once the workload is
over and the lag is 0, silver equals the producer's truth.
"""

from __future__ import annotations

import io
import json
import threading
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyspark.sql import SparkSession

from dcp_cdc.config import FollowConfig, load_config
from pipelines.bronze.job import read_log
from pipelines.follow import Batch, BucketProgress, Follower, captured_seqnos, captures_of
from pipelines.tables import BucketTables
from tests.capture_harness import PASSWORD, PASSWORD_ENV, producer, write_config
from tests.spark.test_silver import _drop_all, assert_equal_to_truth


@pytest.mark.slow
def test_a_stop_mid_batch_finishes_it_and_a_restart_catches_up_to_the_truth(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    bucket = f"fol{uuid.uuid4().hex[:6]}"
    with producer(
        tmp_path,
        bucket=bucket,
        nodes=2,
        vbuckets=16,
        docs=300,
        ops=3000,
        batch=20,
        pause=0.05,
        seed=11,
    ) as prod:
        path = write_config(
            tmp_path / "conf" / "follow.toml",
            landing=tmp_path / "landing",
            warehouse=spark_warehouse,
            bucket=bucket,
            connection_string=prod.info["connection_string"],
        )
        config = load_config(path).model_copy(
            update={"follow": FollowConfig(interval_s=0.5, rotate_seconds=0.3, check_every_s=0)}
        )
        captures = captures_of(config, config.buckets)
        assert captures[bucket].rotate_seconds == 0.3  # the agent's 300 s capped by follow
        try:
            # 1: a stop while the second micro-batch writes its events
            stop, out = threading.Event(), io.StringIO()
            follower = Follower(spark, config, config.buckets, out, stop, captures=captures)

            def hook(point: str) -> None:
                if point == "events" and follower.progress[bucket].batches == 1:
                    stop.set()

            follower.hook = hook
            assert follower.run() == 0
            text = out.getvalue()
            assert stop.is_set() and "batch 2," in text and "batch 3," not in text, text
            assert "stopped after 2 micro-batches" in text
            assert not read_log(spark, BucketTables(bucket).ingest_log).open_plan
            first = follower.progress[bucket]
            assert first.frames > 0 and first.applied

            # 2: a restart, until the workload is over and silver reached every captured seqno
            prod.wait_workload()
            summary = json.loads((prod.truth_out / "truth" / "summary.json").read_text())
            high = {v["vbucket"]: v["high_seqno"] for v in summary["vbuckets"]}
            stop, out = threading.Event(), io.StringIO()

            def caught_up(batch: Batch, progress: BucketProgress) -> None:
                if captured_seqnos(
                    captures[bucket].checkpoint_path, bucket
                ) == high and progress.lag() == (0, 0):
                    stop.set()

            again = Follower(
                spark, config, config.buckets, out, stop, captures=captures, on_batch=caught_up
            )
            watchdog = threading.Timer(240, stop.set)
            watchdog.start()
            try:
                assert again.run() == 0
            finally:
                watchdog.cancel()
            text = out.getvalue()
            assert "lag 0 seqnos in 0 vbuckets" in text, text[-2000:]
            assert again.progress[bucket].applied == high
            assert_equal_to_truth(spark, bucket, SimpleNamespace(out=prod.truth_out))  # type: ignore[arg-type]
        finally:
            _drop_all(spark, bucket)
