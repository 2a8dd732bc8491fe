"""``dcp-cdc run`` end to end, as a newcomer runs it: its own process, JVM and warehouse."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


def test_run_simulates_ingests_and_applies(tmp_path: Path) -> None:
    cli = Path(sys.executable).with_name("dcp-cdc")
    done = subprocess.run(
        [str(cli), "run", "--workdir", str(tmp_path)], capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "1/3 simulated bucket 'travel-sample'" in out
    assert "bronze ingest of bucket 'travel-sample': run 1:" in out
    assert "2 quarantined" in out  # the simulator injects a malformed frame and a cut tail
    assert "silver apply of bucket 'travel-sample'" in out
    assert (tmp_path / "warehouse" / "metastore_db").is_dir()
    assert list((tmp_path / "landing").glob("*.dcpcap"))
