"""The initial-load benchmark at a tiny size: the producer's realistic documents, the agent,
ingest, apply and check, its result as the benchmark reports it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dcp_cdc.config import AppConfig

pytestmark = [pytest.mark.e2e, pytest.mark.long]
REPO = Path(__file__).resolve().parents[2]
PIPELINE = ("capture", "capture tail", "ingest", "apply", "check")


def test_the_initial_load_benchmark_at_a_tiny_size(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    args = ["--docs", "2000", "--vbuckets", "64", "--live-rate", "50"]
    args += ["--work", str(tmp_path / "work"), "--result", str(out)]
    command = [sys.executable, "-m", "benchmarks.initial_load", *args]
    done = subprocess.run(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1800, env=env
    )
    assert done.returncode == 0, done.stdout[-5000:]
    result = json.loads(out.read_text())
    assert result["silver_equals_truth"] and result["quality_passed"]
    assert (result["documents"], result["shape"]) == (2000, "realistic")
    # the default collection and three simulated ones, then the four of the bulk documents
    assert len(result["collections"]) == 8
    assert sum(result["collections"].values()) >= 2000 + 1000
    assert result["live_changes"] > 0 and result["frames"] > 3000
    stages = result["stages"]
    assert set(PIPELINE) <= set(stages)
    for name in ("capture", "capture tail"):
        assert stages[name]["cpu_s"]["agent"] > 0 and stages[name]["peak_rss_mb"]["agent"] > 10
    for name in ("ingest", "apply", "check"):
        assert stages[name]["seconds"] > 0
        assert stages[name]["peak_rss_mb"]["jvm"] > 100 and stages[name]["cpu_s"]["jvm"] > 0
    # so few bytes are below [ingest] on_driver_below_bytes: the driver decodes them, not the
    # decode tasks' Python workers
    landing = result["disk_bytes"]["landing"]
    assert 0 < landing < AppConfig.model_fields["ingest"].default.on_driver_below_bytes
    assert stages["ingest"]["cpu_s"]["driver"] > stages["ingest"]["cpu_s"]["workers"]
    assert all(result["disk_bytes"][layer] > 0 for layer in ("landing", "bronze", "silver"))
    assert "silver equals the truth: True" in done.stdout
