"""Great Expectations over hand-made metric frames, no Spark: every check gets its result, a
failing row fails its check, and the Data Docs site is GE's own, its templates compiled
once per process (pipelines/quality/data_docs.py)."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from dcp_cdc.config import QualityConfig
from pipelines.quality.suites import SUITES, Check, checks

pytestmark = pytest.mark.slow  # Great Expectations' import alone takes seconds

RUN_TIME = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
_VOLATILE = (
    (re.compile(r"\?d=\d{8}T\d{6}\.\d{6}Z"), ""),  # when a link was rendered
    (re.compile(r">\d{8}T\d{6}\.\d{6}Z<"), "><"),  # when a suite was validated
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "<uuid>"),
)


def _value(check: Check, column: str, failing: bool) -> Any:
    """A column's value that meets ``check`` (or, ``failing``, does not)."""
    if "value_set" in check.kwargs:
        good = check.kwargs["value_set"][0]
        return (not good if isinstance(good, bool) else 1) if failing else good
    if check.expectation.endswith("SumToBeBetween"):
        return 0
    if column == check.kwargs.get("column_B"):
        return 10
    return 5 if failing else 10  # column A: at least B, equal to B


def _frames(all_checks: tuple[Check, ...], failing: str) -> dict[str, pd.DataFrame]:
    """Two rows per suite that meet every check but ``failing``, whose second row breaks it."""
    frames = {}
    for suite in SUITES:
        rows: list[dict[str, Any]] = [{"where": f"{suite.entity} {i}"} for i in range(2)]
        for c in all_checks:
            if c.suite != suite.name:
                continue
            for i, row in enumerate(rows):
                for column in c.columns:
                    row.setdefault(column, _value(c, column, c.key == failing and i == 1))
                if c.detail:
                    row[c.detail] = "what is wrong" if c.key == failing and i == 1 else None
        frames[suite.name] = pd.DataFrame(rows)
    return frames


def _site(folder: Path) -> dict[str, str]:
    pages = {}
    for page in sorted(p for p in folder.rglob("*") if p.is_file()):
        text = page.read_bytes().decode("utf-8", errors="replace")
        for pattern, replacement in _VOLATILE:
            text = pattern.sub(replacement, text)
        pages[page.relative_to(folder).as_posix()] = text
    return pages


def _without_ids(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The results but for the expectations' ids (new ones each run)."""
    return {
        key: {**r, "expectation_config": {**r["expectation_config"], "id": None}}
        for key, r in results.items()
    }


def test_validation_and_data_docs_compile_the_templates_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import jinja2

    from pipelines.quality import data_docs
    from pipelines.quality.validate import validate

    all_checks = checks(QualityConfig())
    failing = "snapshot_completeness.no_duplicate_seqno"
    frames = _frames(all_checks, failing)

    def run(folder: str) -> dict[str, dict[str, Any]]:
        return validate(
            frames,
            all_checks,
            docs_dir=tmp_path / folder,
            run_name="run-1",
            run_time=RUN_TIME,
            max_examples=3,
        )

    compiled: list[str | None] = []
    compile_template = jinja2.Environment.compile

    def counting(self: jinja2.Environment, source: Any, name: Any = None, *a: Any, **k: Any) -> Any:
        compiled.append(name)
        return compile_template(self, source, name, *a, **k)

    monkeypatch.setattr(jinja2.Environment, "compile", counting)
    data_docs.COMPILED.clear()
    first = run("first")
    assert compiled and len(data_docs.COMPILED) == len(set(compiled))
    assert set(first) == {c.key for c in all_checks}
    assert [k for k, r in first.items() if not r["success"]] == [failing]

    compiled.clear()
    second = run("second")
    assert compiled == []  # every template's code came from the process's cache
    assert _without_ids(second) == _without_ids(first)
    site = _site(tmp_path / "second")
    assert "index.html" in site and len(site) > 20
    assert site == _site(tmp_path / "first")

    # GE's default views render the same pages
    monkeypatch.setattr(data_docs, "views", dict)
    assert _without_ids(run("default")) == _without_ids(first)
    assert _site(tmp_path / "default") == site
