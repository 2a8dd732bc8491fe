"""What a quality run found, as values: outcomes, open snapshots, the report and its page.

No Spark and no Great Expectations here: :func:`outcome_from_result` reads a validation
result as GE serializes it (``to_json_dict()``), :func:`render_summary` writes the one-page
HTML summary, and :func:`screenshot` / :func:`dump_dom` open it in a headless Chromium.
"""

from __future__ import annotations

import html
import json
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dcp_cdc.errors import DcpError
from pipelines.errors import BrowserError
from pipelines.quality.suites import SUITES, Check

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")


@dataclass(frozen=True, slots=True)
class ExpectationOutcome:
    """One expectation's result in one run."""

    suite: str
    name: str
    severity: str
    description: str
    expectation_type: str
    success: bool
    observed: str
    unexpected_count: int | None = None
    element_count: int | None = None
    examples: tuple[Mapping[str, Any], ...] = ()

    @property
    def key(self) -> str:
        return f"{self.suite}.{self.name}"


@dataclass(frozen=True, slots=True)
class OpenSnapshot:
    """The last snapshot of a stream that did not complete (docs/protocol/dcp.md §6.3).

    ``resumed``: a later stream of the vbucket exists, so this one was abandoned and the
    vbucket resumed from its last consistent point; otherwise silver waits on it now.
    """

    vbucket: int
    session_id: str
    stream_no: int
    start: int | None  # None for an OSO backfill without its end marker
    end: int | None
    last_seqno: int | None  # the last item received in it
    missing_from: int | None
    resumed: bool

    @property
    def missing(self) -> str:
        upto = "its end marker" if self.end is None else str(self.end)
        return f"{self.missing_from}..{upto}"

    @property
    def range(self) -> str:
        return "OSO backfill" if self.start is None else f"[{self.start}, {self.end}]"


@dataclass
class QualityReport:
    bucket: str
    run_id: str
    checked_at: str
    outcomes: list[ExpectationOutcome] = field(default_factory=list)
    open_snapshots: list[OpenSnapshot] = field(default_factory=list)
    """The last snapshot of each vbucket's latest stream, where it is not complete."""
    resumed_snapshots: list[OpenSnapshot] = field(default_factory=list)
    """Unfinished last snapshots of earlier streams, resumed by a later stream."""
    counts: dict[str, int] = field(default_factory=dict)
    report_path: str = ""
    data_docs_path: str = ""
    results_table: str = ""
    screenshot_path: str | None = None
    seconds: float = 0.0
    full_because: str | None = None
    """Why the check read all of bronze (None: it started from the last check's state)."""

    @property
    def failed_errors(self) -> list[str]:
        """``suite.expectation`` of every failed expectation of severity ``error``."""
        return [o.key for o in self.outcomes if not o.success and o.severity == "error"]

    @property
    def failed_warnings(self) -> list[str]:
        return [o.key for o in self.outcomes if not o.success and o.severity != "error"]

    @property
    def passed(self) -> bool:
        return not self.failed_errors

    def outcome(self, key: str) -> ExpectationOutcome:
        for o in self.outcomes:
            if o.key == key:
                return o
        raise KeyError(key)

    def render(self) -> str:
        ok = sum(1 for o in self.outcomes if o.success)
        status = "passed" if self.passed else f"FAILED ({len(self.failed_errors)} errors)"
        lines = [
            f"quality check of bucket {self.bucket!r}: {status}, {ok}/{len(self.outcomes)} "
            f"expectations met, {len(self.failed_warnings)} warnings, run {self.run_id}, "
            f"{self.seconds:.1f} s"
        ]
        for o in self.outcomes:
            if not o.success:
                first = f"; e.g. {_example_text(o.examples[0])}" if o.examples else ""
                lines.append(f"  {o.severity.upper():<5} {o.key}: {o.observed}{first}")
        for s in self.open_snapshots:
            lines.append(
                f"  open snapshot: vb {s.vbucket} {s.range} received up to {s.last_seqno}, "
                f"missing {s.missing} (session {s.session_id})"
            )
        read = "since the last check" if self.full_because is None else "all of bronze"
        why = "" if self.full_because is None else f" ({self.full_because})"
        lines.append(f"  bronze read: {read}{why}")
        lines.append(f"  report: {self.report_path}")
        lines.append(f"  data docs: {self.data_docs_path}")
        lines.append(f"  results: {self.results_table}")
        return "\n".join(lines)


# --- Great Expectations results -----------------------------------------------------------


def outcome_from_result(
    check: Check,
    result: Mapping[str, Any],
    *,
    entity: str,
    max_examples: int,
    rows: Sequence[Mapping[str, Any]] = (),
) -> ExpectationOutcome:
    """An outcome from one GE expectation result (``ExpectationValidationResult``, JSON form).

    Column-map and column-pair expectations report failing rows (their ``where`` label, the
    check's detail and the values read); an aggregate expectation (a column sum) reports its
    observed value, and its examples come from ``rows`` of the metric frame where the column
    is not zero.
    """
    if result.get("exception_info", {}).get("raised_exception"):
        message = result["exception_info"].get("exception_message")
        raise DcpError(f"{check.key}: Great Expectations raised while validating: {message}")
    res = result.get("result") or {}
    success = bool(result["success"])
    examples: list[Mapping[str, Any]] = []
    if "unexpected_count" in res:
        unexpected = int(res["unexpected_count"])
        total = int(res.get("element_count") or 0) - int(res.get("missing_count") or 0)
        if total:
            observed = f"{unexpected} of {total} {entity}{'' if total == 1 else 's'}"
        else:
            observed = f"no {entity} to check"
        keep = ("where", *(c for c in (check.detail,) if c), *check.columns)
        for row in res.get("partial_unexpected_index_list") or []:
            examples.append({k: row.get(k) for k in keep if row.get(k) is not None})
        return ExpectationOutcome(
            check.suite,
            check.name,
            check.severity,
            check.description,
            _type_name(check),
            success,
            observed,
            unexpected,
            total,
            tuple(examples[:max_examples]),
        )
    value = res.get("observed_value")
    bound = check.kwargs.get("max_value")
    observed = _number(value) + ("" if bound is None else f" (at most {bound})")
    if not success and check.columns:
        column = check.columns[0]
        for row in rows:
            if row.get(column):
                keep = ("where", *(c for c in (check.detail,) if c), column)
                examples.append({k: row[k] for k in keep if row.get(k) is not None})
    return ExpectationOutcome(
        check.suite,
        check.name,
        check.severity,
        check.description,
        _type_name(check),
        success,
        observed,
        None,
        None,
        tuple(examples[:max_examples]),
    )


def _type_name(check: Check) -> str:
    """``ExpectColumnSumToBeBetween`` → ``expect_column_sum_to_be_between`` (GE's type)."""
    out: list[str] = []
    for ch in check.expectation:
        if ch.isupper() and out:
            out.append("_")
        out.append(ch.lower())
    return "".join(out)


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return "none" if value is None else str(value)


def _example_text(example: Mapping[str, Any]) -> str:
    """``where: detail`` when the example has a detail text, else ``where: column=value``."""
    where = example.get("where", "")
    details = [str(v) for k, v in example.items() if k.endswith("_detail")]
    rest = "; ".join(details) or ", ".join(f"{k}={v}" for k, v in example.items() if k != "where")
    return f"{where}: {rest}" if rest else str(where)


def result_rows(report: QualityReport) -> list[dict[str, Any]]:
    """The rows one run appends to ``quality.<bucket>_results`` (``checked_at`` as text)."""
    return [
        {
            "run_id": report.run_id,
            "bucket": report.bucket,
            "suite": o.suite,
            "expectation": o.name,
            "expectation_type": o.expectation_type,
            "severity": o.severity,
            "success": o.success,
            "observed_value": o.observed,
            "unexpected_count": o.unexpected_count,
            "element_count": o.element_count,
            "examples": json.dumps(list(o.examples), default=str, ensure_ascii=False),
            "checked_at": report.checked_at,
        }
        for o in report.outcomes
    ]


# --- the one-page summary -----------------------------------------------------------------

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#1d232a;max-width:1200px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px}
.meta{color:#5b6570} .badge{display:inline-block;padding:3px 10px;border-radius:12px;
font-weight:600;color:#fff} .passed{background:#1f883d} .failed{background:#cf222e}
.warn{background:#bf8700} table{border-collapse:collapse;width:100%;margin:6px 0}
th,td{text-align:left;padding:5px 8px;border-bottom:1px solid #d8dee4;vertical-align:top}
th{background:#f6f8fa;font-weight:600} tr.fail-error td.status{color:#cf222e;font-weight:700}
tr.fail-warn td.status{color:#9a6700;font-weight:700} tr.pass td.status{color:#1f883d}
.examples{margin:2px 0 0;padding-left:18px;color:#3d4650;font-size:13px}
.box{border:2px solid #cf222e;border-radius:6px;padding:8px 14px;background:#fff5f5}
.box.ok{border-color:#1f883d;background:#f3fbf5} .box.warn{border-color:#bf8700;
background:#fff8e5} code{font-size:12px}
.counts td:first-child{width:45%}
"""


def render_summary(report: QualityReport, *, data_docs_href: str = "data_docs/index.html") -> str:
    """The one-page HTML summary: overall status, failing expectations first, each suite's
    expectations, open snapshots per vbucket, and counts. Self-contained (inline CSS)."""
    e = html.escape
    errors, warnings = report.failed_errors, report.failed_warnings
    if errors:
        badge = f'<span class="badge failed" id="status">FAILED: {len(errors)} error(s)</span>'
    elif warnings:
        badge = (
            f'<span class="badge warn" id="status">PASSED with {len(warnings)} warning(s)</span>'
        )
    else:
        badge = '<span class="badge passed" id="status">PASSED</span>'
    out: list[str] = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>Data quality: {e(report.bucket)}</title><style>{_CSS}</style></head><body>",
        f"<h1>Data quality of bucket <code>{e(report.bucket)}</code> {badge}</h1>",
        f'<div class="meta">run <code>{e(report.run_id)}</code> at {e(report.checked_at)} · '
        f"results in <code>{e(report.results_table)}</code> · "
        f'<a href="{e(data_docs_href)}">Great Expectations Data Docs</a></div>',
    ]
    failing = [o for o in report.outcomes if not o.success]
    out.append("<h2>Failing expectations</h2>")
    if failing:
        tone = "" if errors else " warn"
        out.append(f'<div class="box{tone}" id="failing"><ul>')
        for o in failing:
            out.append(
                f'<li data-expectation="{e(o.key)}"><b>{e(o.key)}</b> '
                f"({e(o.severity)}): {e(o.observed)}{_examples_html(o)}</li>"
            )
        out.append("</ul></div>")
    else:
        out.append('<div class="box ok" id="failing">None: every expectation is met.</div>')
    out.append("<h2>Suites</h2>")
    for suite in SUITES:
        mine = [o for o in report.outcomes if o.suite == suite.name]
        bad = [o for o in mine if not o.success]
        state = (
            "passed"
            if not bad
            else ("failed" if any(o.severity == "error" for o in bad) else "warn")
        )
        label = {"passed": "pass", "failed": "FAIL", "warn": "warnings"}[state]
        out.append(
            f'<section id="suite-{e(suite.name)}"><h3>{e(suite.name)} '
            f'<span class="badge {state}">{label}</span></h3>'
            f'<div class="meta">{e(suite.description)}</div>'
            "<table><tr><th>expectation</th><th>severity</th><th>status</th>"
            "<th>observed</th><th>what it checks</th></tr>"
        )
        for o in mine:
            css = "pass" if o.success else f"fail-{'error' if o.severity == 'error' else 'warn'}"
            status = "pass" if o.success else "FAIL"
            out.append(
                f'<tr class="{css}" data-expectation="{e(o.key)}"><td><code>{e(o.name)}</code></td>'
                f'<td>{e(o.severity)}</td><td class="status">{status}</td>'
                f"<td>{e(o.observed)}{_examples_html(o)}</td><td>{e(o.description)}</td></tr>"
            )
        out.append("</table></section>")
    out.append("<h2>Open snapshots per vbucket</h2>")
    snapshots = [*report.open_snapshots, *report.resumed_snapshots]
    if snapshots:
        out.append(
            '<table id="open-snapshots"><tr><th>vbucket</th><th>snapshot</th>'
            "<th>received up to</th><th>missing</th><th>session · stream</th><th>state</th></tr>"
        )
        for s in snapshots:
            state = "resumed by a later stream" if s.resumed else "open: silver waits for it"
            out.append(
                f'<tr data-vbucket="{s.vbucket}"><td>{s.vbucket}</td><td>{e(s.range)}</td>'
                f"<td>{'nothing' if s.last_seqno is None else s.last_seqno}</td>"
                f"<td>{e(s.missing)}</td><td>{e(s.session_id)} · {s.stream_no}</td>"
                f"<td>{state}</td></tr>"
            )
        out.append("</table>")
    else:
        out.append(
            '<p id="open-snapshots">None: the last snapshot of every stream is complete.</p>'
        )
    out.append('<h2>Counts</h2><table class="counts" id="counts">')
    for name, value in report.counts.items():
        out.append(f"<tr><td>{e(name.replace('_', ' '))}</td><td>{value:,}</td></tr>")
    out.append("</table></body></html>")
    return "\n".join(out)


def _examples_html(outcome: ExpectationOutcome) -> str:
    if not outcome.examples:
        return ""
    items = "".join(f"<li>{html.escape(_example_text(x))}</li>" for x in outcome.examples[:5])
    more = len(outcome.examples) - 5
    if more > 0:
        items += f"<li>… {more} more in the results table</li>"
    return f'<ul class="examples">{items}</ul>'


# --- a real browser -------------------------------------------------------------------------


def find_chromium() -> str | None:
    """The path of a Chromium (or Chrome) binary on PATH, if any."""
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def _chromium(args: list[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
    binary = find_chromium()
    if binary is None:
        raise BrowserError(f"no Chromium found on PATH (looked for {', '.join(CHROMIUM_NAMES)})")
    # --no-sandbox: CI runs as root, where Chromium refuses its sandbox.
    command = [
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        "--disable-dev-shm-usage",
        *args,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise BrowserError(f"{binary} exited {done.returncode}: {done.stderr.strip()[-800:]}")
    return done


def screenshot(
    page: str | Path,
    png: str | Path,
    *,
    width: int = 1280,
    height: int = 1600,
    timeout: float = 120,
) -> Path:
    """Open ``page`` in headless Chromium and save a PNG of it to ``png``."""
    target = Path(png).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)
    _chromium(
        [
            f"--screenshot={target}",
            f"--window-size={width},{height}",
            Path(page).resolve().as_uri(),
        ],
        timeout=timeout,
    )
    if not target.is_file() or target.stat().st_size == 0:
        raise BrowserError(f"Chromium wrote no screenshot to {target}")
    return target


def dump_dom(page: str | Path, *, timeout: float = 120) -> str:
    """The DOM of ``page`` after Chromium rendered it (``--dump-dom``)."""
    return _chromium(["--dump-dom", Path(page).resolve().as_uri()], timeout=timeout).stdout
