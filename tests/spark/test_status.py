"""``dcp-cdc status`` on a real pipeline: the test producer (a child process, 2 nodes, 16
vbuckets) → the capture agent → bronze → silver → a quality check, then changes that reach
one stage at a time. Every number is checked against what is known: the producer's high
seqnos (its truth), the agent's checkpoint, the number of changes made."""

from __future__ import annotations

import io
import json
import re
import uuid
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from dcp_cdc.agent.driver import run as capture
from dcp_cdc.agent.settings import settings_from_config
from dcp_cdc.config import AppConfig, load_config
from pipelines.app import cli
from pipelines.bronze.job import ingest_bucket
from pipelines.quality.job import check_bucket
from pipelines.silver.job import apply_bucket
from pipelines.status.lag import BucketStatus
from pipelines.status.read import bucket_status
from pipelines.tables import BucketTables
from tests.support.capture_harness import (
    PASSWORD,
    PASSWORD_ENV,
    Producer,
    producer,
    write_config,
)
from tests.support.silver_runs import drop_all

VBUCKETS = 16


def _highs(prod: Producer) -> dict[int, int]:
    """The bucket's high seqno per vbucket now (the producer's truth)."""
    prod.control("truth")
    summary = json.loads((prod.truth_out / "truth" / "summary.json").read_text())
    return {v["vbucket"]: v["high_seqno"] for v in summary["vbuckets"]}


def _behind(status: BucketStatus) -> dict[str, tuple[str, int, int]]:
    """Each stage's lag: (against, seqnos, vbuckets)."""
    return {k: (v.against, v.seqnos, v.vbuckets) for k, v in status.lags().items()}


def _gains(before: dict[int, int], after: dict[int, int]) -> tuple[int, int]:
    """(seqnos gained, vbuckets that gained)."""
    gains = [after[vb] - before.get(vb, 0) for vb in after]
    return sum(gains), sum(1 for g in gains if g)


def test_status_follows_the_pipeline_stage_by_stage(
    spark: SparkSession,
    spark_warehouse: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = f"st{uuid.uuid4().hex[:6]}"
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    options = {"bucket": name, "nodes": 2, "vbuckets": VBUCKETS, "docs": 300, "ops": 0}
    try:
        with producer(tmp_path, scenario="basic", **options) as prod:
            path = write_config(
                tmp_path / "conf.toml",
                landing=tmp_path / "landing",
                warehouse=spark_warehouse,
                bucket=name,
                connection_string=prod.info["connection_string"],
            )
            config: AppConfig = load_config(path)
            (bucket,) = config.buckets

            # nothing yet: the cluster alone is known
            first = bucket_status(config, bucket)
            assert first.stage("cluster").positions == _highs(prod)
            assert [s.name for s in first.stages if not s.known] == ["capture", "bronze", "silver"]

            # the whole pipeline: every stage level with the cluster
            captured = capture(settings_from_config(config, bucket))
            ingest_bucket(spark, config, bucket)
            apply_bucket(spark, config, bucket)
            report = check_bucket(spark, config, bucket)
            highs = _highs(prod)
            status = bucket_status(config, bucket)
            assert status.stage("cluster").positions == highs
            assert status.stage("capture").positions == {
                vb: p.seqno for vb, p in captured.positions.items()
            }
            assert status.stage("capture").positions == highs
            assert status.stage("bronze").positions == highs
            assert status.stage("silver").positions == highs
            assert _behind(status) == {
                "capture": ("cluster", 0, 0),
                "bronze": ("capture", 0, 0),
                "silver": ("bronze", 0, 0),
            }
            assert all(s.moved_at is not None and s.note is None for s in status.stages)
            assert status.newest_change is not None
            quality = status.quality
            assert quality is not None and quality.run_id == report.run_id
            assert quality.passed and quality.expectations == len(report.outcomes) > 0
            assert Path(quality.report).is_file()

            # changes in the cluster: the capture is behind by exactly them
            prod.control("changes 30")
            changed = _highs(prod)
            gained, vbuckets = _gains(highs, changed)
            assert gained == 30
            status = bucket_status(config, bucket)
            assert _behind(status) == {
                "capture": ("cluster", gained, vbuckets),
                "bronze": ("capture", 0, 0),
                "silver": ("bronze", 0, 0),
            }

            # captured, not ingested: bronze is behind by exactly them
            capture(settings_from_config(config, bucket))
            status = bucket_status(config, bucket)
            assert _behind(status) == {
                "capture": ("cluster", 0, 0),
                "bronze": ("capture", gained, vbuckets),
                "silver": ("bronze", 0, 0),
            }

            # ingested, not applied: silver is behind by exactly them
            ingest_bucket(spark, config, bucket)
            out = io.StringIO()
            assert cli.main(["status", "--config", str(path), "--json"], out=out) == 0
            found = json.loads(out.getvalue())
            assert found["format"] == 1
            (shown,) = found["buckets"]
            assert shown["bucket"] == name
            assert [s["stage"] for s in shown["stages"]] == [
                "cluster",
                "capture",
                "bronze",
                "silver",
            ]
            assert [s["behind"] and s["behind"]["seqnos"] for s in shown["stages"]] == [
                None,
                0,
                0,
                gained,
            ]
            silver = shown["stages"][3]
            assert silver["behind"]["vbuckets"] == vbuckets
            assert sum(w["seqnos"] for w in silver["behind"]["worst"]) <= gained
            assert shown["end_to_end"]["seqnos"] == gained
            assert shown["quality"]["run_id"] == report.run_id and shown["quality"]["passed"]

        # the producer is gone: the cluster is a line of the report, the rest is there
        out = io.StringIO()
        assert cli.main(["status", "--config", str(path)], out=out) == 0
        text = out.getvalue()
        assert "  cluster: unreachable: " in text and "no seed node answered" in text
        assert re.search(rf"^  silver +{VBUCKETS} ", text, re.MULTILINE), text
        assert f"end to end: silver is {gained} seqnos behind the capture" in text
        out = io.StringIO()
        assert cli.main(["status", "--config", str(path), "--no-cluster"], out=out) == 0
        assert "  cluster: not asked (--no-cluster)\n" in out.getvalue()
    finally:
        drop_all(spark, name)
        spark.sql(f"DROP TABLE IF EXISTS {BucketTables(name).results}")
