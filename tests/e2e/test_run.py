"""``dcp-cdc run`` end to end, as a newcomer runs it (its own process, JVM and warehouse),
then the same warehouse served over JDBC by the Spark Thrift server and queried with beeline."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
# the command of the code under test (the venv's dcp-cdc script runs what is installed)
CLI = [sys.executable, "-m", "pipelines.cli"]
PROMPT = re.compile(r"^\d+: jdbc:hive2://\S+> ")


@dataclass(frozen=True)
class Demo:
    workdir: Path
    stdout: str


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    workdir = tmp_path_factory.mktemp("demo")
    cwd = tmp_path_factory.mktemp("cwd")
    done = subprocess.run(
        [*CLI, "run", "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=cwd,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert list(cwd.iterdir()) == [], "the run wrote into its working directory"
    return Demo(workdir, done.stdout)


def test_run_simulates_ingests_applies_checks_and_summarizes(demo: Demo) -> None:
    out = demo.stdout
    assert "[1/5] simulating bucket 'travel-sample' (mixed scenario, seed 1) ... done" in out
    assert "bronze ingest of bucket 'travel-sample': run 1:" in out
    assert "2 quarantined" in out  # the simulator injects a malformed frame and a cut tail
    assert "silver apply of bucket 'travel-sample'" in out
    assert "Events in bronze.travel_sample_a8560dff_events by type:" in out
    assert "Documents in silver by collection:" in out
    assert "Open snapshots:" in out
    assert "Quality" in out and ".html" in out
    # each step is one line in a log (no terminal redraws), and the hints name this warehouse
    assert out.count("[1/5]") == 1, out
    warehouse = (demo.workdir / "warehouse").resolve()
    assert (
        f'sql --warehouse {warehouse} "SELECT op, count(*) AS n FROM '
        "bronze.travel_sample_a8560dff_events"
    ) in out, out
    assert (demo.workdir / "warehouse" / "metastore_db").is_dir()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def thrift_server(demo: Demo) -> Iterator[int]:
    """``dcp-cdc thrift-server`` over the demo's warehouse (its Derby catalog: no other JVM
    may hold it), until the test ends."""
    port = _free_port()
    log = (demo.workdir / "thrift-server.log").open("w")
    server = subprocess.Popen(
        [
            *CLI,
            "thrift-server",
            "--warehouse",
            str(demo.workdir / "warehouse"),
            "--port",
            str(port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, (demo.workdir / "thrift-server.log").read_text()[-3000:]
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "the Thrift server did not listen in 300 s"
            time.sleep(2)
        yield port
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
        log.close()


def test_beeline_queries_silver_over_jdbc(demo: Demo, thrift_server: int) -> None:
    """One JDBC query through beeline returns what delta-rs reads from the same table: the
    catalog the run wrote outlives its process, and another Spark process (the Thrift server)
    finds its tables."""
    from deltalake import DeltaTable

    from pipelines.cli import _spark_script

    tables = sorted((demo.workdir / "warehouse" / "silver.db").glob("*_all"))
    table = next(t for t in tables if DeltaTable(str(t)).to_pyarrow_table().num_rows)
    rows = DeltaTable(str(table)).to_pyarrow_table(columns=["key", "_deleted"]).to_pylist()
    expected = sorted(r["key"] for r in rows if not r["_deleted"])[:5]
    query = f"SELECT key FROM silver.{table.name} WHERE NOT _deleted ORDER BY key LIMIT 5"
    done = subprocess.run(
        [
            _spark_script("beeline"),
            "-u",
            f"jdbc:hive2://127.0.0.1:{thrift_server}/",
            "-n",
            "dcp",
            "--silent=true",
            "--outputformat=csv2",
            "-e",
            query,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    # beeline echoes its prompt before the first line of output when it is not on a terminal
    lines = [PROMPT.sub("", line) for line in done.stdout.splitlines() if line.strip()]
    assert lines == ["key", *expected]
