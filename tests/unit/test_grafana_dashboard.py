"""The Grafana dashboard (``conf/grafana/dcp-cdc.json``) asks only for metrics the code
exports and docs/metrics.md lists: every metric name is read out of every PromQL expression
(panels and the bucket variable) and looked up in the three declarations (the capture agent's,
follow mode's, the batch runs'); ``promtool check rules`` parses every expression when
promtool is installed; and the panels the dashboard promises are there."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dcp_cdc.agent.metrics import METRICS as CAPTURE
from dcp_cdc.agent.metrics import MetricSpec
from pipelines.follow.metrics import METRICS as FOLLOW
from pipelines.observe.batch_metrics import METRICS as BATCH

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "conf" / "grafana" / "dcp-cdc.json"
PROMTOOL = shutil.which("promtool")

_SUFFIXES = {
    "counter": ("",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
}
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "group_left", "group_right", "inf", "nan"}


def exported() -> dict[str, MetricSpec]:
    """Every sample name the code exposes -> its metric."""
    return {
        spec.name + suffix: spec
        for spec in (*CAPTURE, *FOLLOW, *BATCH)
        for suffix in _SUFFIXES[spec.kind]
    }


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: what is left of its identifiers once
    strings, label matchers, ranges, grouping clauses, Grafana's variables, functions and
    keywords are taken out."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"\$\w+", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*", text):
        rest = text[match.end() :].lstrip()
        if rest.startswith("(") or match.group().lower() in _KEYWORDS:
            continue  # a function or an aggregation, or a keyword
        names.add(match.group())
    return names


def test_names_are_read_out_of_expressions() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (bucket, le) (rate(a_seconds_bucket{bucket=~"$b"}[1m])))'
        " / on (bucket) group_left sum without (x) (b_total offset 5m) > bool 0 and time() - c"
    )
    assert metric_names(expr) == {"a_seconds_bucket", "b_total", "c"}
    assert metric_names('{__name__=~"dcp_cdc_.*"}') == set()  # label_values' selector


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


def expressions() -> list[tuple[str, str]]:
    """(where, PromQL) of every query: the panels' targets and the template variables'."""
    board = dashboard()
    found = [
        (f"panel {panel['title']!r} {target['refId']}", target["expr"])
        for panel in board["panels"]
        for target in panel.get("targets", [])
    ]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"]
            inner = re.fullmatch(r"label_values\((.*),\s*\w+\)", query)
            assert inner, f"variable {variable['name']}: {query}"
            found.append((f"variable {variable['name']}", inner.group(1)))
    return found


def test_every_expression_names_exported_and_documented_metrics() -> None:
    known = exported()
    page = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    used: set[str] = set()
    for where, expr in expressions():
        names = metric_names(expr)
        unknown = names - known.keys()
        assert not unknown, f"{where} asks for {sorted(unknown)}, which no code exports: {expr}"
        for name in names:
            assert f"`{known[name].name}`" in page, f"{where}: {name} not in docs/metrics.md"
        used |= {known[name].name for name in names}
    # what the dashboard promises: lag per vbucket, frames/s, freshness, step seconds, merged
    # rows, quality, readiness, the batch runs
    for promised in [
        "dcp_cdc_capture_lag_seconds",
        "dcp_cdc_capture_lag_seqnos",
        "dcp_cdc_capture_received_frames_total",
        "dcp_cdc_capture_stalled_vbuckets",
        "dcp_cdc_follow_freshness_seconds",
        "dcp_cdc_follow_step_duration_seconds",
        "dcp_cdc_follow_merged_rows_total",
        "dcp_cdc_follow_quality_passed",
        "dcp_cdc_follow_ready",
        "dcp_cdc_batch_step_duration_seconds",
        "dcp_cdc_batch_merged_rows",
        "dcp_cdc_batch_last_success_timestamp_seconds",
    ]:
        assert promised in used, f"no panel shows {promised}"


def test_the_panels_use_the_datasource_variable_and_the_bucket_filter() -> None:
    board = dashboard()
    assert board["uid"] == "dcp-cdc" and board["title"]
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            for selector in re.findall(r"\b(dcp_cdc_\w+)(\{[^}]*\})?", target["expr"]):
                assert 'bucket=~"$bucket"' in selector[1], (panel["title"], target["expr"])


@pytest.mark.skipif(PROMTOOL is None, reason="needs promtool (Debian: apt-get install prometheus)")
def test_promtool_parses_every_expression(tmp_path: Path) -> None:
    """Each expression, Grafana's variables given values, as a recording rule: ``promtool
    check rules`` parses them all."""
    rules = [
        {
            "record": f"dcp_cdc:dashboard:{i}",
            "expr": expr.replace("$__rate_interval", "1m").replace("$bucket", ".*"),
        }
        for i, (_, expr) in enumerate(expressions())
    ]
    path = tmp_path / "dashboard.rules.json"  # JSON is YAML
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    assert PROMTOOL is not None
    checked = subprocess.run(
        [PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
