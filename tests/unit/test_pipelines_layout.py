"""The shape of ``pipelines``: modules point one way, each concern has one home, and the job
modules import without Spark (the command line imports them to declare flags and print help)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("dcp_cdc", "pipelines")
JOB_MODULES = [
    "pipelines.bronze.job",
    "pipelines.silver.job",
    "pipelines.quality.job",
    "pipelines.maintenance",
    "pipelines.catalog",
]
HEAVY = ("pyspark", "delta", "great_expectations")
ERROR_MODULES = {"dcp_cdc.errors", "pipelines.errors"}


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _imports(path: Path, known: set[str]) -> set[str]:
    """The project modules ``path`` imports, at top level or inside functions."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        out |= {n for n in names if n in known}
    return out


def test_pipelines_modules_import_each_other_without_a_circle() -> None:
    modules = {n: p for n, p in _modules().items() if n.split(".")[0] == "pipelines"}
    graph = {name: _imports(path, set(modules)) - {name} for name, path in modules.items()}
    done: set[str] = set()

    def visit(name: str, trail: list[str]) -> None:
        if name in trail:
            cycle = [*trail[trail.index(name) :], name]
            pytest.fail(f"import circle: {' -> '.join(cycle)}")
        if name in done:
            return
        for other in sorted(graph[name]):
            visit(other, [*trail, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


def test_silver_modules_point_one_way() -> None:
    modules = _modules()
    imports = {
        name: _imports(modules[name], set(modules))
        for name in ("pipelines.silver.transforms", "pipelines.silver.store")
    }
    assert not imports["pipelines.silver.transforms"] & {
        "pipelines.silver.store",
        "pipelines.silver.job",
    }
    assert "pipelines.silver.job" not in imports["pipelines.silver.store"]


def test_every_error_class_lives_in_one_of_the_two_error_modules() -> None:
    misplaced = []
    for name, path in _modules().items():
        if name in ERROR_MODULES:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.name.endswith("Error"):
                misplaced.append(f"{name}.{node.name}")
    assert misplaced == []


def test_the_pipeline_errors_are_dcp_errors() -> None:
    from dcp_cdc.errors import DcpError
    from pipelines import errors

    classes = [v for v in vars(errors).values() if isinstance(v, type) and v is not DcpError]
    assert classes and all(issubclass(c, DcpError) for c in classes)


def test_job_modules_import_without_spark_delta_or_great_expectations() -> None:
    script = (
        "import importlib, json, sys\n"
        f"for m in {JOB_MODULES!r}: importlib.import_module(m)\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert json.loads(done.stdout) == []


def test_table_names_come_from_one_module() -> None:
    from pipelines.tables import BucketTables, all_rows, view_of

    names = BucketTables("travel-sample")
    assert names.bronze == {
        "events": "bronze.travel_sample_a8560dff_events",
        "quarantine": "bronze.travel_sample_a8560dff_quarantine",
        "ingest_log": "bronze.travel_sample_a8560dff_ingest_log",
    }
    assert names.silver_support == (
        "silver.travel_sample_a8560dff__collections",
        "silver.travel_sample_a8560dff__stream_state",
        "silver.travel_sample_a8560dff__tombstone_purges",
    )
    assert names.collection("inventory", "Airline") == (
        "silver.travel_sample_a8560dff__inventory__airline_23a92764"
    )
    assert names.collection_all("inventory", "route") == (
        "silver.travel_sample_a8560dff__inventory__route_all"
    )
    assert view_of(all_rows("silver.b__s__c")) == "silver.b__s__c"
    assert names.results == "quality.travel_sample_a8560dff_results"
