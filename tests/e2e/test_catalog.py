"""A first run killed (``kill -9`` of its process group) while Spark creates the warehouse's
embedded catalog, then the run again: it must succeed with no manual step.

Derby makes ``metastore_db`` first and writes its ``service.properties`` about 0.4 s later; a
process killed in between used to wedge the warehouse for good (``ERROR XBM0A`` at every later
start). The kill is aimed from outside: the test watches the warehouse every millisecond and
kills the job the moment the folder exists without that file.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.support import kill_harness as kh

pytestmark = pytest.mark.e2e


def test_a_run_killed_while_the_catalog_is_created_leaves_nothing_to_repair(
    tmp_path: Path,
) -> None:
    setup = kh.prepare(tmp_path)
    catalog = setup.warehouse / "metastore_db"
    run = kh.start(setup, "ingest", "killed")
    deadline = time.monotonic() + 300
    while not (catalog.is_dir() and not (catalog / "service.properties").exists()):
        assert run.process.poll() is None, run.output()[-3000:]
        assert time.monotonic() < deadline, "the catalog was never being created"
        time.sleep(0.001)
    os.killpg(run.process.pid, signal.SIGKILL)
    run.process.wait(timeout=120)
    assert run.process.returncode == -signal.SIGKILL
    assert catalog.is_dir() and not (catalog / "service.properties").exists()

    again = kh.run_to_end(setup, "ingest", "again")
    assert again.process.returncode == 0, again.output()[-3000:]
    assert "its creation was interrupted" in again.output()
    assert (catalog / "service.properties").is_file()
    assert [p.name for p in setup.warehouse.glob("metastore_db.incomplete-*")]
    bronze = kh.bronze_rows(setup)
    assert len(bronze["events"]) == len(set(bronze["events"])) == setup.result.frames
