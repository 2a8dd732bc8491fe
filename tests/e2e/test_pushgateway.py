"""Batch runs' metrics through a real Pushgateway (Debian's ``prometheus-pushgateway``, which
``.ci/run`` installs), started on a free loopback port: what a run pushes is read back as
Prometheus would scrape it, a failure keeps the last success's figures beside its own time,
the groups of a bucket's verbs stay apart, a later run replaces an earlier one's tables, and
``promtool check metrics`` passes on what the gateway serves. The jobs themselves push in
``tests/spark/test_metrics_export.py``."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from dcp_cdc.config import PushgatewayConfig
from pipelines.observe.batch_metrics import RunMetrics, pushed, success_families
from pipelines.observe.batch_metrics import push as push_families
from pipelines.observe.freshness import PROBABILITIES, ChangeTimes
from tests.support import pushgateway as gateway
from tests.support.pushgateway import MISSING, PUSHGATEWAY, value

PROMTOOL = shutil.which("promtool")
TABLE, OTHER = "silver.b__inventory__hotel_all", "silver.b__inventory__route_all"

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(PUSHGATEWAY is None, reason=MISSING)]


def apply_run(tables: dict[str, int]) -> RunMetrics:
    # CAS times even over [1000, 1100], committed at 1200: freshness even over [100, 200]
    quantiles = tuple(1000.0 + 100 * p for p in PROBABILITIES)
    return RunMetrics(
        steps={"apply_walk": 1.5, "apply_merge": 2.5},
        merged=tables,
        change_times=ChangeTimes(100, quantiles, 100 * 1050.0, committed_at=1200.0),
    )


def test_runs_push_their_groups_and_a_failure_keeps_the_last_success(tmp_path: Path) -> None:
    with gateway.pushgateway(tmp_path) as url:
        settings = PushgatewayConfig(url=url)
        with pushed(settings, "apply", "b") as report:
            report(apply_run({TABLE: 42, OTHER: 3}))
        with pushed(settings, "ingest", "b") as report:
            report(RunMetrics(steps={"ingest": 4.0}, frames=1234, files=3))
        got = gateway.pushed(url)
        group = {"job": "dcp_cdc", "bucket": "b", "verb": "apply"}
        assert value(got, "dcp_cdc_batch_merged_rows", table=TABLE, **group) == 42
        assert value(got, "dcp_cdc_batch_merged_rows", table=OTHER, **group) == 3
        assert value(got, "dcp_cdc_batch_step_duration_seconds", step="apply_merge") == 2.5
        assert value(got, "dcp_cdc_batch_freshness_seconds", quantile="0.5") == pytest.approx(
            150.0, abs=0.01
        )
        assert value(got, "dcp_cdc_batch_freshness_seconds", quantile="0.95") == pytest.approx(
            195.0, abs=0.01
        )
        assert value(got, "dcp_cdc_batch_freshness_seconds_count", **group) == 100
        success = value(got, "dcp_cdc_batch_last_success_timestamp_seconds", **group)
        assert success is not None and value(got, "dcp_cdc_batch_duration_seconds", **group)
        ingest = {"job": "dcp_cdc", "bucket": "b", "verb": "ingest"}
        assert value(got, "dcp_cdc_batch_ingested_frames", **ingest) == 1234
        assert value(got, "dcp_cdc_batch_ingested_files", **ingest) == 3
        assert value(got, "dcp_cdc_batch_merged_rows", verb="ingest") is None
        assert value(got, "dcp_cdc_batch_quality_passed") is None

        with pytest.raises(RuntimeError, match="the MERGE failed"), pushed(settings, "apply", "b"):
            raise RuntimeError("the MERGE failed")
        got = gateway.pushed(url)
        failure = value(got, "dcp_cdc_batch_last_failure_timestamp_seconds", **group)
        assert failure is not None and failure >= success
        assert value(got, "dcp_cdc_batch_last_success_timestamp_seconds", **group) == success
        assert value(got, "dcp_cdc_batch_merged_rows", table=TABLE, **group) == 42

        # the next success replaces the group: a table it did not merge into, the failure
        with pushed(settings, "apply", "b") as report:
            report(apply_run({OTHER: 5}))
        with pushed(settings, "check", "b") as report:
            report(RunMetrics(steps={"check": 20.0}, quality_passed=False))
        got = gateway.pushed(url)
        assert value(got, "dcp_cdc_batch_merged_rows", table=TABLE) is None
        assert value(got, "dcp_cdc_batch_merged_rows", table=OTHER, **group) == 5
        assert value(got, "dcp_cdc_batch_last_failure_timestamp_seconds", **group) is None
        assert value(got, "dcp_cdc_batch_quality_passed", verb="check") == 0
        assert value(got, "dcp_cdc_batch_ingested_frames", **ingest) == 1234  # untouched

        # an apply that merged nothing: no table's series, a freshness of no changes
        with pushed(settings, "apply", "b") as report:
            report(RunMetrics(steps={"apply_tables": 0.1}, merged={}))
        got = gateway.pushed(url)
        assert value(got, "dcp_cdc_batch_merged_rows", verb="apply") is None
        assert value(got, "dcp_cdc_batch_freshness_seconds_count", **group) == 0
        assert value(got, "dcp_cdc_batch_freshness_seconds", quantile="0.5") is None

        if PROMTOOL is not None:
            checked = subprocess.run(
                [PROMTOOL, "check", "metrics"],
                input=gateway.exposition(url),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert checked.returncode == 0 and not checked.stdout, checked.stdout + checked.stderr


def test_a_push_that_fails_is_logged_and_the_run_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with gateway.pushgateway(tmp_path) as url:
        pass  # stopped: nothing listens there now
    settings = PushgatewayConfig(url=url, timeout_s=2)
    with pushed(settings, "ingest", "b") as report:
        report(RunMetrics(steps={"ingest": 1.0}, frames=1, files=1))
    assert f"the ingest run of bucket b could not push its metrics to {url}" in caplog.text
    families = success_families(RunMetrics(), 1.0, 2.0)
    unset = PushgatewayConfig()
    assert not push_families(unset, "ingest", "b", families, replace=True), "no URL: no push"
