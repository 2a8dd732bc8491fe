"""Follow mode end to end in the test session: the test producer (in a thread, a steady live
workload), the capture agent in follow mode's thread, micro-batches of ingest and apply.

A stop asked in the middle of a micro-batch (its events written, its log not yet committed)
lets that batch finish and starts no other; a restart carries on and, once the workload is
over and the lag is 0, silver equals the producer's truth.
"""

from __future__ import annotations

import asyncio
import io
import os
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from pyspark.sql import SparkSession

from dcp_cdc.agent.settings import CaptureSettings
from dcp_cdc.config import AppConfig, BucketConfig, FollowConfig, SilverConfig
from dcp_cdc.simulator import SimConfig
from dcp_cdc.simulator.server import ProducerServer
from pipelines.app.demo import LoopThread
from pipelines.bronze.store import read_log
from pipelines.follow.agent import captured_seqnos, follow_settings
from pipelines.follow.loop import Follower
from pipelines.follow.progress import Batch, BucketProgress
from pipelines.silver import live
from pipelines.silver.registry import read_registry
from pipelines.tables import BucketTables
from tests.support.capture_harness import PASSWORD, USER
from tests.support.silver_runs import drop_all
from tests.support.truth import assert_equal_to_truth


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("DCP_CDC_FOLLOW"),
    reason="make test-long (DCP_CDC_FOLLOW=1): five micro-batches, 3 minutes on 2 cores",
)
@pytest.mark.parametrize("live_layer", [False, True], ids=["merges", "live-layer"])
def test_a_stop_mid_batch_finishes_it_and_a_restart_catches_up_to_the_truth(
    spark: SparkSession, spark_warehouse: Path, tmp_path: Path, live_layer: bool
) -> None:
    """With the live layer, a compaction every second append runs in its own thread beside
    the micro-batches; the views equal the truth, and the tables too once compacted."""
    bucket = f"fol{uuid.uuid4().hex[:6]}"
    sim = SimConfig(scenario="mixed", seed=11, bucket=bucket, vbuckets=16, docs=300, ops=0)
    served: list[ProducerServer] = []
    workload_stop: list[asyncio.Event] = []
    started = threading.Event()

    async def serve(halt: asyncio.Event) -> None:
        async with ProducerServer(sim, nodes=2, users={USER: PASSWORD}) as server:
            served.append(server)
            workload_stop.append(asyncio.Event())
            started.set()
            await server.steady_workload(300, workload_stop[0])
            await halt.wait()

    producer = LoopThread("the test producer", serve)
    producer.start()
    try:
        assert started.wait(30)
        landing = tmp_path / "landing"
        config = AppConfig(
            landing=str(landing),
            warehouse=str(spark_warehouse),
            buckets=[BucketConfig(name=bucket)],
            follow=FollowConfig(interval_s=0.5, rotate_seconds=0.3, check_every_s=0),
            silver=SilverConfig(live_layer=live_layer, compact_files=2),
        )
        settings = CaptureSettings.into(
            landing,
            connection_string=served[0].connection_string,
            bucket=bucket,
            username=USER,
            password=PASSWORD,
            rotate_seconds=300,
        )
        captures = {bucket: follow_settings(settings, config)}
        assert captures[bucket].rotate_seconds == 0.3  # the agent's 300 s capped by follow

        # 1: a stop while a micro-batch after the first writes its events
        stop, out = threading.Event(), io.StringIO()
        follower = Follower(spark, config, config.buckets, out, stop, captures=captures)

        def hook(point: str) -> None:
            if point == "events" and follower.progress[bucket].batches >= 1:
                stop.set()

        follower.hook = hook
        assert follower.run() == 0
        text = out.getvalue()
        batches = follower.progress[bucket].batches
        assert batches >= 2 and stop.is_set(), text
        assert f"batch {batches}," in text and f"batch {batches + 1}," not in text, text
        assert f"stopped after {batches} micro-batches" in text
        assert not read_log(spark, BucketTables(bucket).ingest_log).open_plan
        assert follower.progress[bucket].applied  # the interrupted batch applied too

        # 2: the workload ends; a restart follows until silver reached every seqno
        producer.call(workload_stop[0].set)
        time.sleep(0.5)
        served[0].write_truth(tmp_path)
        high = {vb.vbid: vb.high_seqno for vb in served[0].sim.bucket.vbuckets}
        stop, out = threading.Event(), io.StringIO()

        def caught_up(batch: Batch, progress: BucketProgress) -> None:
            checkpoint = captures[bucket].checkpoint_path
            if captured_seqnos(checkpoint, bucket) == high and progress.lag() == (0, 0):
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
        truth = SimpleNamespace(out=tmp_path)
        assert_equal_to_truth(spark, bucket, truth)  # type: ignore[arg-type]
        if live_layer:
            assert follower._compacting or again._compacting, "a compaction ran beside"
            live.compact(spark, bucket, read_registry(spark, bucket))
            assert_equal_to_truth(spark, bucket, truth, compacted=True)  # type: ignore[arg-type]
    finally:
        producer.stop()
        drop_all(spark, bucket)
