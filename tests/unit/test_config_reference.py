"""docs/configuration.md's reference is the one generated from the pydantic models; the README
shows a real ``make run``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dcp_cdc.config.reference import REFERENCE_MARKERS, reference_markdown, with_reference
from dcp_cdc.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def test_configuration_reference_is_up_to_date() -> None:
    page = (REPO / "docs" / "configuration.md").read_text(encoding="utf-8")
    start, end = REFERENCE_MARKERS
    assert start in page and end in page, "docs/configuration.md lost its reference's markers"
    copy = page.split(start, 1)[1].split(end, 1)[0]
    assert copy == reference_markdown(), (
        "docs/configuration.md's reference is stale: run "
        "`.venv/bin/python -m dcp_cdc.config.reference --update docs/configuration.md`"
    )


def test_reference_names_every_section_and_setting() -> None:
    text = reference_markdown()
    for line in (
        "| `landing` | string | required |",
        "| `[[buckets]] name` | string |",
        "`[airflow]` — ",
        '| `schedule` | string | `"@hourly"` |',
        "| `vacuum_retention_hours` | integer (≥ 0) | `168` |",
        "| `chunk_bytes` | integer (65536 – 1073741824) | `67108864` (64 MiB) |",
    ):
        assert line in text


def test_update_rewrites_only_between_the_markers() -> None:
    start, end = REFERENCE_MARKERS
    text = f"# T\n{start}old\n{end}\nafter\n"
    assert with_reference(text) == f"# T\n{start}{reference_markdown()}{end}\nafter\n"
    with pytest.raises(ConfigError, match="markers"):
        with_reference("no markers")


def test_readme_has_no_unfilled_placeholders() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert re.search(r"@@[A-Z_]+@@", readme) is None
    # the make run block shows a real run: its five steps and a verdict
    assert all(f"[{n}/5]" in readme for n in range(1, 6)) and "Quality: PASSED" in readme
