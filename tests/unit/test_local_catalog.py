"""The embedded catalog's guard (:mod:`pipelines.catalog.embedded`), without Spark: a catalog
whose creation was killed is set aside, a complete one is left alone, a second process on the
same warehouse is refused by name, and Derby's failures become errors that say what to do."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipelines.catalog import embedded as local_catalog
from pipelines.errors import CatalogError


@pytest.fixture
def warehouse(tmp_path: Path) -> Path:
    yield tmp_path / "warehouse"
    local_catalog.release(tmp_path / "warehouse")


def test_a_catalog_without_service_properties_is_set_aside(warehouse: Path) -> None:
    """What a kill between Derby's first file and its service.properties leaves."""
    broken = warehouse / "metastore_db"
    (broken / "seg0").mkdir(parents=True)
    (broken / "log").mkdir()
    aside = local_catalog.open_local_catalog(warehouse)
    assert aside is not None and aside.name.startswith("metastore_db.incomplete-")
    assert (aside / "seg0").is_dir() and not broken.exists()
    assert local_catalog.open_local_catalog(warehouse) is None  # nothing left to set aside


def test_a_complete_catalog_is_left_alone(warehouse: Path) -> None:
    complete = warehouse / "metastore_db"
    complete.mkdir(parents=True)
    (complete / "service.properties").write_text("derby")
    assert local_catalog.open_local_catalog(warehouse) is None
    assert (complete / "service.properties").exists()


def test_a_second_process_on_the_warehouse_is_refused_by_name(warehouse: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, time
                from pathlib import Path
                from pipelines.catalog import embedded as local_catalog
                local_catalog.open_local_catalog(Path({str(warehouse)!r}))
                print("held", flush=True)
                sys.stdin.read()
                """
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        (warehouse / "metastore_db").mkdir()  # incomplete, but the holder may be creating it
        with pytest.raises(CatalogError, match=f"in use by process {holder.pid} since"):
            local_catalog.open_local_catalog(warehouse)
        assert (warehouse / "metastore_db").is_dir()  # not set aside under the holder
    finally:
        holder.communicate("", timeout=30)
    assert local_catalog.open_local_catalog(warehouse) is not None  # released: ours now


def test_derby_failures_say_what_to_do(tmp_path: Path) -> None:
    busy = local_catalog.explain_open_failure(
        tmp_path,
        RuntimeError(
            "Unable to instantiate SessionHiveMetaStoreClient\n"
            "Caused by: ERROR XSDB6: Another instance of Derby may have already booted "
            "the database /w/metastore_db."
        ),
    )
    assert "another process has it open" in str(busy) and "ERROR XSDB6" in str(busy)
    damaged = local_catalog.explain_open_failure(
        tmp_path, RuntimeError("java.sql.SQLException: ERROR XSLAN: Database ... is damaged")
    )
    assert f"move {tmp_path / 'metastore_db'} away" in str(damaged)
    assert "ERROR XSLAN" in str(damaged)
