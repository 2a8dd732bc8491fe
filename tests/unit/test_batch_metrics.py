"""What a batch run pushes, without a Pushgateway: each verb's families as Prometheus' text
format, and every metric in the docs. ``tests/e2e/test_pushgateway.py`` pushes to a real
one."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pipelines.observe.batch_metrics import METRICS, Families, RunMetrics, success_families

ROOT = Path(__file__).resolve().parents[2]


def exposed(run: RunMetrics) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Families(success_families(run, 12.5, 1_800_000_000.0)))
    text = generate_latest(registry).decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def test_each_verb_pushes_what_it_knows() -> None:
    ingest = exposed(RunMetrics(steps={"ingest": 12.0}, frames=5000, files=4))
    assert ingest == {
        "dcp_cdc_batch_duration_seconds": {(): 12.5},
        "dcp_cdc_batch_last_success_timestamp_seconds": {(): 1_800_000_000.0},
        "dcp_cdc_batch_step_duration_seconds": {(("step", "ingest"),): 12.0},
        "dcp_cdc_batch_ingested_frames": {(): 5000},
        "dcp_cdc_batch_ingested_files": {(): 4},
    }
    apply = exposed(RunMetrics(steps={"apply_merge": 3.0}, merged={"silver.t_all": 9}))
    assert apply["dcp_cdc_batch_merged_rows"] == {(("table", "silver.t_all"),): 9}
    assert apply["dcp_cdc_batch_freshness_seconds_count"] == {(): 0}, "no change dated"
    assert "dcp_cdc_batch_freshness_seconds" not in apply, "no quantile without changes"
    check = exposed(RunMetrics(steps={"check": 30.0}, quality_passed=True))
    assert check["dcp_cdc_batch_quality_passed"] == {(): 1}
    assert "dcp_cdc_batch_merged_rows" not in check and "dcp_cdc_batch_ingested_frames" not in check


def test_every_batch_metric_is_in_the_docs() -> None:
    page = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    missing = [spec.name for spec in METRICS if f"`{spec.name}`" not in page]
    assert not missing, f"docs/metrics.md does not list {missing}"
