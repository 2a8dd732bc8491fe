"""A catalog several processes share: ``dcp-cdc metastore`` runs a real Derby network server
on a warehouse (started and stopped here, on 127.0.0.1), and two Spark processes use the
catalog at once through it. A server started on demand (what follow mode and the Thrift server
do) ends when its last holder goes, killed or not; one ``dcp-cdc metastore start`` started or
took over stays. Then the issue's own case, behind ``DCP_CDC_FOLLOW=1`` (``make
test-long``): ``dcp-cdc sql`` from a second process answers while ``dcp-cdc run --follow``
runs on the local default, which starts the server and stops it when it exits.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pipelines.catalog import server as metastore_server
from pipelines.catalog import watchdog as metastore_watchdog
from pipelines.catalog.embedded import open_local_catalog, release
from pipelines.errors import CatalogError
from pipelines.lake.spark_session import delta_jars_dir
from tests.support.ports import free_port

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DCP_CDC_CONFIG"}
    return {**env, "PYTHONPATH": str(ROOT), "DCP_CDC_LOG_LEVEL": "WARNING", **extra}


def _cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipelines.app.cli", *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _accepts(port: int) -> bool:
    return metastore_server.answers("127.0.0.1", port, timeout=1)


@pytest.fixture
def warehouse(tmp_path: Path) -> Iterator[Path]:
    """A warehouse whose server, if a test leaves one, is stopped afterwards."""
    folder = tmp_path / "warehouse"
    yield folder
    metastore_server.stop(folder, jars=delta_jars_dir())


def test_start_status_stop(tmp_path: Path, warehouse: Path) -> None:
    flags = ("--warehouse", str(warehouse))
    assert _cli("metastore", "status", *flags, cwd=tmp_path).returncode == 1  # none yet

    started = _cli("metastore", "start", *flags, cwd=tmp_path, timeout=120)
    assert started.returncode == 0, started.stderr
    record = metastore_server.read_record(warehouse)
    assert record is not None and record.host == "127.0.0.1"
    assert record.database == str(warehouse.resolve() / "metastore_db")
    assert started.stdout.startswith(f"started metastore server {record.address} (pid ")
    assert _accepts(record.port)
    # it holds the catalog: an embedded session cannot open the database under it
    with pytest.raises(
        CatalogError, match=f"in use by the metastore server on 127.0.0.1:{record.port}"
    ):
        open_local_catalog(warehouse)

    status = _cli("metastore", "status", *flags, cwd=tmp_path)
    assert status.returncode == 0 and status.stdout.startswith("running: ")
    again = _cli("metastore", "start", *flags, cwd=tmp_path)
    assert again.stdout.startswith("already running: ") and f"(pid {record.pid})" in again.stdout

    stopped = _cli("metastore", "stop", *flags, cwd=tmp_path, timeout=120)
    assert stopped.returncode == 0 and f"(pid {record.pid})" in stopped.stdout
    assert not _accepts(record.port)
    assert (
        not Path(f"/proc/{record.pid}").exists()
        or b"Derby" not in Path(f"/proc/{record.pid}/cmdline").read_bytes()
    )
    assert metastore_server.read_record(warehouse) is None
    assert _cli("metastore", "status", *flags, cwd=tmp_path).returncode == 1
    open_local_catalog(warehouse)  # the catalog lock went with the server
    release(warehouse)


def test_two_processes_starting_at_once_get_one_server(tmp_path: Path, warehouse: Path) -> None:
    flags = ("--warehouse", str(warehouse))
    both = [
        subprocess.Popen(
            [sys.executable, "-m", "pipelines.app.cli", "metastore", "start", *flags],
            cwd=tmp_path,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [process.communicate(timeout=120) for process in both]
    assert [process.returncode for process in both] == [0, 0], outputs
    record = metastore_server.read_record(warehouse)
    assert record is not None
    said = sorted(out.split(" metastore server")[0] for out, _ in outputs)
    assert said == ["already running:", "started"], outputs
    assert all(f"{record.address} (pid {record.pid})" in out for out, _ in outputs)


def test_a_warehouse_on_object_storage_is_served_from_the_path_its_setting_names(
    tmp_path: Path,
) -> None:
    """A warehouse on S3 has no local folder for its catalog: ``[spark] metastore`` names the
    Derby database's path, and the server runs there, recorded beside it."""
    port = free_port()
    database = tmp_path / "catalog" / "metastore_db"
    config = tmp_path / "c.toml"
    config.write_text(
        'landing = "s3a://lake/landing"\nwarehouse = "s3a://lake/warehouse"\n'
        '[[buckets]]\nname = "b"\n'
        f'[spark]\nmetastore = "derby://127.0.0.1:{port}{database}"\n',
        encoding="utf-8",
    )
    try:
        started = _cli("metastore", "start", "--config", str(config), cwd=tmp_path, timeout=120)
        assert started.returncode == 0, started.stderr
        assert started.stdout.startswith(f"started metastore server derby://127.0.0.1:{port} ")
        assert started.stdout.rstrip().endswith(f"for {database}")
        record = metastore_server.read_record(database.parent)
        assert record is not None and record.port == port and record.database == str(database)
        assert _accepts(port)
        status = _cli("metastore", "status", "--config", str(config), cwd=tmp_path)
        assert status.returncode == 0 and status.stdout.startswith("running: "), status.stdout
    finally:
        stopped = _cli("metastore", "stop", "--config", str(config), cwd=tmp_path)
    assert stopped.returncode == 0 and stopped.stdout.startswith("stopped "), stopped.stdout
    assert not _accepts(port)

    # without a path the catalog has no place: typed errors that name the setting
    text = config.read_text(encoding="utf-8")
    config.write_text(text.replace(str(database), ""), encoding="utf-8")
    refused = _cli("metastore", "start", "--config", str(config), cwd=tmp_path)
    assert refused.returncode == 2, refused.stdout
    assert "spark.metastore" in refused.stderr and "/ABSOLUTE/PATH" in refused.stderr
    config.write_text(text.split("[spark]")[0], encoding="utf-8")
    refused = _cli("metastore", "start", "--config", str(config), cwd=tmp_path)
    assert refused.returncode == 2, refused.stdout
    assert "warehouse 's3a://lake/warehouse' is not a local path" in refused.stderr
    assert "derby://127.0.0.1:PORT/ABSOLUTE/PATH" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_a_server_killed_is_reported_and_cleared(tmp_path: Path, warehouse: Path) -> None:
    record, started = metastore_server.start(warehouse, jars=delta_jars_dir())
    assert started
    os.kill(record.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while metastore_server.live_server(warehouse) is not None:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    status = _cli("metastore", "status", "--warehouse", str(warehouse), cwd=tmp_path)
    assert status.returncode == 1 and status.stdout.startswith("not answering: "), status.stdout
    assert metastore_server.stop(warehouse, jars=delta_jars_dir()) is None
    assert metastore_server.read_record(warehouse) is None


def test_a_port_taken_by_another_program_is_refused(warehouse: Path) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        with pytest.raises(
            metastore_server.MetastoreError, match=f"port {port} on 127.0.0.1 is taken"
        ):
            metastore_server.start(warehouse, port=port, jars=delta_jars_dir())
    with pytest.raises(metastore_server.MetastoreError, match="listens on loopback only"):
        metastore_server.start(warehouse, host="0.0.0.0", jars=delta_jars_dir())


def test_the_demo_does_not_wipe_a_served_warehouse(tmp_path: Path) -> None:
    from pipelines.app.demo import fresh_workdir

    warehouse = tmp_path / "work" / "warehouse"
    record, _ = metastore_server.start(warehouse, jars=delta_jars_dir())
    try:
        with pytest.raises(metastore_server.MetastoreError, match=f"pid {record.pid}\\) serves"):
            fresh_workdir(tmp_path / "work")
        assert metastore_server.live_server(warehouse) == record
    finally:
        metastore_server.stop(warehouse, jars=delta_jars_dir())
    fresh_workdir(tmp_path / "work")  # stopped: the demo starts afresh
    assert not warehouse.exists()


def test_the_demo_starts_afresh_over_a_killed_demos_server(tmp_path: Path) -> None:
    """A demo killed with kill -9 and started again at once: the server it started on demand,
    held by no one, is stopped first instead of refusing the start."""
    from pipelines.app.demo import fresh_workdir

    warehouse = tmp_path / "work" / "warehouse"
    killed = Holder(warehouse)
    killed.kill()
    fresh_workdir(tmp_path / "work")
    assert not warehouse.exists() and not metastore_server.is_server_process(killed.pid)


SERVED = """
import subprocess, sys
from pathlib import Path
from pipelines.catalog.server import lease_fds, serving
from pipelines.lake.spark_session import delta_jars_dir
with serving(Path(sys.argv[1]), jars=delta_jars_dir()) as record:
    child = None
    if sys.argv[2:]:  # no pipe of the test's: it waits for this process's output to end
        quiet = subprocess.DEVNULL
        child = subprocess.Popen(
            ["sleep", "600"], pass_fds=lease_fds(), stdin=quiet, stdout=quiet, stderr=quiet
        )
    print(record.pid, record.port, child.pid if child else 0, flush=True)
    sys.stdin.readline()
print("done", flush=True)
"""


class Holder:
    """A process that holds ``warehouse``'s server the way follow mode does
    (:func:`metastore_server.serving`) until it is told to end, or killed."""

    def __init__(self, warehouse: Path, *, wait: bool = True, child: bool = False) -> None:
        """``child``: with a child process that shares the lease (as the Thrift server's JVM
        does), its pid in ``self.child``."""
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVED, str(warehouse), *(["child"] if child else [])],
            env=_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        if wait:
            self.started()

    def started(self) -> None:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.process.wait()
            raise AssertionError(self.process.stderr.read()[-3000:])  # type: ignore[union-attr]
        self.pid, self.port, self.child = (int(n) for n in line.split())

    def end(self) -> None:
        out, err = self.process.communicate("\n", timeout=120)
        assert self.process.returncode == 0 and out.strip() == "done", err[-3000:]

    def kill(self) -> None:
        self.process.kill()
        self.process.communicate()


def _watchdogs(warehouse: Path) -> list[int]:
    """The pids of the watchdogs running for ``warehouse``."""
    return _running(b"pipelines.catalog.watchdog", str(warehouse).encode())


def _servers(warehouse: Path) -> list[int]:
    """The pids of the Derby servers running on ``warehouse``."""
    return _running(
        metastore_server.SERVER_CLASS.encode(), f"-Dderby.system.home={warehouse}".encode()
    )


def _running(*words: bytes) -> list[int]:
    """The pids of the processes with each of ``words`` among their arguments."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if all(word in argv for word in words):
            found.append(int(entry.name))
    return found


def _until(condition: Callable[[], bool], what: str, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"not within {within:g} s: {what}"
        time.sleep(0.1)


def test_an_on_demand_server_ends_when_its_last_holder_is_killed(
    tmp_path: Path, warehouse: Path
) -> None:
    first = Holder(warehouse)
    second = Holder(warehouse, child=True)
    try:
        assert (second.pid, second.port) == (first.pid, first.port)  # reused, not another
        status = _cli("metastore", "status", "--warehouse", str(warehouse), cwd=tmp_path)
        assert "on demand: it stops when no process uses it" in status.stdout, status.stdout
        assert len(_watchdogs(warehouse.resolve())) == 1

        first.kill()  # the starter, killed: the other holder keeps the server
        time.sleep(3 * metastore_watchdog.INTERVAL_S)
        record = metastore_server.live_server(warehouse)
        assert record is not None and record.pid == first.pid and record.on_demand

        second.kill()  # the last holder, killed; its child shares its lease
        time.sleep(3 * metastore_watchdog.INTERVAL_S)
        assert metastore_server.live_server(warehouse) == record
        os.kill(second.child, signal.SIGKILL)  # the last lease gone: the watchdog stops it
        _until(lambda: metastore_server.read_record(warehouse) is None, "the record removed")
        _until(lambda: not _accepts(first.port), "the port free")
        _until(lambda: not metastore_server.is_server_process(first.pid), "the server ended")
        _until(lambda: not _watchdogs(warehouse.resolve()), "the watchdog ended")
    finally:
        for holder in (first, second):
            if holder.process.poll() is None:
                holder.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(second.child, signal.SIGKILL)


def test_a_server_whose_starter_was_killed_while_starting_it_ends(warehouse: Path) -> None:
    """Killed after the server's process started and before its record was written: no
    client can find that server, and its watchdog ends it; the next holder starts another."""
    starter = Holder(warehouse, wait=False)
    try:
        _until(lambda: bool(_servers(warehouse.resolve())), "the server's process started")
        assert metastore_server.read_record(warehouse) is None  # not answering yet
        starter.kill()
        _until(lambda: not _servers(warehouse.resolve()), "the unrecorded server ended")
        _until(lambda: not _watchdogs(warehouse.resolve()), "the watchdog ended")
        assert metastore_server.read_record(warehouse) is None
    finally:
        if starter.process.poll() is None:
            starter.kill()
    after = Holder(warehouse)  # the catalog lock went with the server
    after.end()
    _until(lambda: not _servers(warehouse.resolve()), "the next server ended with its holder")


def test_a_kept_server_outlives_its_holders(tmp_path: Path, warehouse: Path) -> None:
    """``dcp-cdc metastore start`` on a server started on demand keeps it: its holders end,
    the server stays; a holder that reused a kept server ends, the server stays."""
    flags = ("--warehouse", str(warehouse))
    starter = Holder(warehouse)
    kept = _cli("metastore", "start", *flags, cwd=tmp_path, timeout=120)
    assert kept.returncode == 0, kept.stderr
    assert kept.stdout.startswith(
        f"already running: metastore server derby://127.0.0.1:{starter.port}"
    )
    assert "kept from now on" in kept.stdout
    starter.end()
    _until(lambda: not _watchdogs(warehouse.resolve()), "the watchdog ended")

    user = Holder(warehouse)  # follow mode on a kept server
    assert user.pid == starter.pid
    user.end()
    time.sleep(2 * metastore_watchdog.INTERVAL_S)
    record = metastore_server.live_server(warehouse)
    assert record is not None and record.pid == starter.pid and not record.on_demand
    status = _cli("metastore", "status", *flags, cwd=tmp_path)
    assert status.returncode == 0 and ", kept) for " in status.stdout, status.stdout


HOLDER = """
import sys
from pathlib import Path
from pipelines.lake.spark_session import build_spark_session
spark = build_spark_session("holder", Path(sys.argv[1]), master="local[1]", shuffle_partitions=1)
print(spark.conf.get("spark.hadoop.javax.jdo.option.ConnectionURL"), flush=True)
spark.sql("CREATE TABLE default.held_by_one (n INT) USING delta")
spark.sql("INSERT INTO default.held_by_one VALUES (7)")
print("ready", flush=True)
sys.stdin.readline()  # the session stays open until the test says
print(sorted(r.tableName for r in spark.sql("SHOW TABLES IN default").collect()), flush=True)
print(spark.sql("SELECT n FROM default.made_by_two").collect()[0].n, flush=True)
"""


@pytest.mark.slow
def test_two_spark_processes_share_the_catalog_through_the_server(
    tmp_path: Path, warehouse: Path
) -> None:
    record, _ = metastore_server.start(warehouse, jars=delta_jars_dir())
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(warehouse)],
        cwd=tmp_path,
        env=_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        url = holder.stdout.readline().strip()
        assert url == f"jdbc:derby://127.0.0.1:{record.port}/{record.database};create=true"
        assert holder.stdout.readline().strip() == "ready", holder.stderr.read()[-3000:]

        # a second Spark process while the first holds its session: it reads the first's
        # table and registers one of its own, which the first then reads
        query = (
            "CREATE TABLE default.made_by_two USING delta "
            "AS SELECT n + 1 AS n FROM default.held_by_one"
        )
        second = _cli("sql", "--warehouse", str(warehouse), query, cwd=tmp_path)
        assert second.returncode == 0, second.stderr[-3000:]

        assert not (tmp_path / "derby.log").exists()  # a client writes none where it runs
        out, err = holder.communicate("\n", timeout=120)
        assert holder.returncode == 0, err[-3000:]
        assert out.splitlines() == ["['held_by_one', 'made_by_two']", "8"]  # the first sees it
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


class Follow:
    """``dcp-cdc run --follow`` on the local default (no configuration: the demo bucket in
    ``./work``), in a child process, its output collected line by line."""

    def __init__(self, cwd: Path) -> None:
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pipelines.app.cli", "run", "--follow", "--rate", "50"],
            cwd=cwd,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    def wait_for(self, pattern: str, timeout: float = 600) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, line in enumerate(self.lines):
                if re.search(pattern, line):
                    return i
            assert self.process.poll() is None, "".join(self.lines)[-4000:]
            time.sleep(0.2)
        raise AssertionError(f"no line matching {pattern!r}:\n" + "".join(self.lines)[-4000:])


@pytest.mark.slow
@pytest.mark.skipif(
    not os.environ.get("DCP_CDC_FOLLOW"),
    reason="make test-long (DCP_CDC_FOLLOW=1): follow mode and a second Spark process",
)
def test_sql_answers_while_follow_runs_on_the_local_default(tmp_path: Path) -> None:
    warehouse = tmp_path / "work" / "warehouse"
    follow = Follow(tmp_path)
    try:
        follow.wait_for(r"travel-sample: batch 1,")
        record = metastore_server.live_server(warehouse)
        assert record is not None, "follow mode started no metastore server"
        assert f"catalog: metastore server {record.address} (pid {record.pid})" in "".join(
            follow.lines
        )

        tables = _cli("sql", "SHOW TABLES IN silver", cwd=tmp_path)
        assert tables.returncode == 0, tables.stderr[-3000:]
        assert "travel_sample_" in tables.stdout and "XSDB6" not in tables.stderr
        rows = _cli("tables", cwd=tmp_path)
        assert rows.returncode == 0 and "bronze" in rows.stdout, rows.stderr[-3000:]

        follow.process.send_signal(signal.SIGTERM)
        assert follow.process.wait(timeout=240) == 0, "".join(follow.lines)[-4000:]
    finally:
        if follow.process.poll() is None:
            follow.process.kill()
            follow.process.wait()
    # it started the server, so it stopped it
    assert metastore_server.read_record(warehouse) is None
    assert not metastore_server.answers("127.0.0.1", record.port, timeout=1)
