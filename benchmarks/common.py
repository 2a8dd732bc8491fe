"""What every benchmark shares: timing over several runs, machine facts, the results file.

Each benchmark prints a table and writes ``benchmarks/results/<name>.json`` holding, per
measured case, the input size, the median of its runs, min and max, and its ratio to the
baseline case of the same benchmark, next to the facts of the machine it ran on.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
_PACKAGES = ("pyspark", "delta-spark", "pyarrow", "numpy", "cramjam", "deltalake")


@dataclass
class Case:
    """One measured thing: ``items`` units of work (frames, events, changes) per run."""

    name: str
    items: int
    unit: str
    seconds: list[float]
    nbytes: int = 0
    baseline: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def rate(self) -> float:
        return self.items / self.median if self.median else float("inf")


class Stages(dict[str, float]):
    """Seconds per stage of one run, each printed as it ends: ``t = stages.end("ingest", t)``."""

    def __init__(self, width: int = 12) -> None:
        super().__init__()
        self.width = width

    def end(self, name: str, started: float) -> float:
        """Record ``name`` as having run since ``started``; returns now (the next start)."""
        now = time.perf_counter()
        self[name] = now - started
        print(f"  {name:<{self.width}}{self[name]:8.1f} s", flush=True)
        return now


def timed(fn: Callable[[], Any], runs: int) -> tuple[list[float], Any]:
    """Wall seconds of ``runs`` calls of ``fn``, and the last call's result."""
    seconds = []
    result = None
    for _ in range(runs):
        started = time.perf_counter()
        result = fn()
        seconds.append(time.perf_counter() - started)
    return seconds, result


def machine() -> dict[str, Any]:
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    versions = {}
    for name in _PACKAGES:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    return {
        "cores": os.cpu_count(),
        "memory_gib": round(pages / 2**30, 1),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": versions,
    }


def report(name: str, cases: Sequence[Case], *, params: dict[str, Any] | None = None) -> Path:
    """Print the table and write ``benchmarks/results/<name>.json``; returns its path."""
    base = next((c for c in cases if c.baseline), None)
    rows = []
    print(f"\n{name}" + (f"  {params}" if params else ""))
    print(
        f"  {'case':<34}{'items':>12}{'median s':>10}{'min s':>9}{'max s':>9}"
        f"{'rate/s':>14}{'MB/s':>9}{'× base':>8}"
    )
    for c in cases:
        ratio = (base.median / c.median) if base and c.median else None
        mbps = c.nbytes / 1e6 / c.median if c.nbytes and c.median else None
        print(
            f"  {c.name:<34}{c.items:>12,}{c.median:>10.3f}{min(c.seconds):>9.3f}"
            f"{max(c.seconds):>9.3f}{c.rate:>14,.0f}"
            f"{'' if mbps is None else f'{mbps:.1f}':>9}"
            f"{'' if ratio is None else f'{ratio:.2f}':>8}"
        )
        row = asdict(c) | {
            "median_s": c.median,
            "min_s": min(c.seconds),
            "max_s": max(c.seconds),
            "rate_per_s": c.rate,
            "mb_per_s": mbps,
            "ratio_to_baseline": ratio,
        }
        rows.append(row)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{name}.json"
    doc = {
        "benchmark": name,
        "params": params or {},
        "cases": rows,
        "machine": machine(),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"  -> {out.relative_to(Path.cwd()) if out.is_relative_to(Path.cwd()) else out}")
    return out
