"""The leases on an on-demand metastore server and what its watchdog decides, without Java: a
server is served while a live process holds a lease, stopped when the holders are gone (ended
cleanly or killed with kill -9), and one ``dcp-cdc metastore start`` keeps is never stopped on
its own. The real server and its watchdog: ``tests/e2e/test_shared_catalog.py``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipelines.catalog import leases as metastore_leases
from pipelines.catalog import server as metastore_server
from pipelines.catalog.leases import Verdict, verdict
from pipelines.catalog.server import ServerRecord
from pipelines.catalog.watchdog import watch
from pipelines.errors import MetastoreError

ROOT = Path(__file__).resolve().parents[2]


def _record(*, on_demand: bool, pid: int = 4242) -> ServerRecord:
    return ServerRecord(
        pid=pid,
        host="127.0.0.1",
        port=1527,
        database="/w/metastore_db",
        started="2026-11-28T00:00:00Z",
        on_demand=on_demand,
    )


@pytest.mark.parametrize(
    ("record", "alive", "held", "pid", "expected"),
    [
        (_record(on_demand=True), {4242}, True, None, Verdict.SERVE),
        (_record(on_demand=True), {4242}, False, None, Verdict.STOP),
        (_record(on_demand=True), {4242}, False, 4242, Verdict.STOP),
        (_record(on_demand=False), {4242}, False, None, Verdict.KEEP),  # kept: never on its own
        (_record(on_demand=False), {4242}, True, 4242, Verdict.KEEP),
        (_record(on_demand=True), set(), False, None, Verdict.GONE),  # its process died
        (_record(on_demand=True), {4242}, False, 7, Verdict.GONE),  # another server now
        (None, set(), False, 4242, Verdict.GONE),  # stopped, record removed
        (None, set(), False, None, Verdict.GONE),
        # the watchdog's server runs, named by no record: its starter died while starting it
        (None, {4242}, True, 4242, Verdict.ORPHAN),
        (_record(on_demand=True, pid=7), {7, 4242}, True, 4242, Verdict.ORPHAN),
    ],
)
def test_the_verdict(
    record: ServerRecord | None, alive: set[int], held: bool, pid: int | None, expected: Verdict
) -> None:
    recorded = record.pid if record is not None else None
    on_demand = record is not None and record.on_demand
    decided = verdict(recorded, on_demand=on_demand, pid=pid, alive=alive.__contains__, held=held)
    assert decided is expected


HOLDER = """
import sys
from pathlib import Path
from pipelines.catalog import leases as metastore_leases
lease = metastore_leases.take(Path(sys.argv[1]))
print("held", flush=True)
sys.stdin.readline()
lease.release()
print("released", flush=True)
sys.stdin.readline()
"""


@pytest.fixture
def holders() -> Iterator[list[subprocess.Popen[str]]]:
    """Processes that hold a lease (on ``argv[1]``) until told, each ended afterwards."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()


def _hold(warehouse: Path, holders: list[subprocess.Popen[str]]) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(HOLDER), str(warehouse)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    holders.append(process)
    assert process.stdout is not None
    assert process.stdout.readline() == "held\n"
    return process


def _unheld(warehouse: Path) -> bool:
    with metastore_leases.unheld(warehouse) as free:
        return free


def test_a_lease_counts_while_its_holder_lives(
    tmp_path: Path, holders: list[subprocess.Popen[str]]
) -> None:
    assert _unheld(tmp_path)  # none ever held
    assert _unheld(tmp_path / "removed")  # a warehouse removed meanwhile holds none
    first, second = _hold(tmp_path, holders), _hold(tmp_path, holders)
    assert not _unheld(tmp_path)

    os.kill(first.pid, signal.SIGKILL)  # a killed holder's lease goes with it
    first.wait()
    assert not _unheld(tmp_path)  # the second still holds

    assert second.stdin is not None and second.stdout is not None
    second.stdin.write("\n")
    second.stdin.flush()
    assert second.stdout.readline() == "released\n"  # released while the process lives
    assert _unheld(tmp_path)


def test_no_lease_is_taken_while_a_probe_found_none(tmp_path: Path) -> None:
    with metastore_leases.unheld(tmp_path) as free:
        assert free
        with pytest.raises(MetastoreError, match="locked exclusively"):
            metastore_leases.take(tmp_path)
    metastore_leases.take(tmp_path).release()


@pytest.fixture
def stops(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The servers :func:`metastore_server.stop_if_unheld` stops (pids), every recorded pid
    passing for a live server, without Java."""
    stopped: list[int] = []

    def stop_recorded(
        warehouse: Path, record: ServerRecord, jars: Path, timeout: float, *, running: bool
    ) -> None:
        stopped.append(record.pid)
        metastore_server.record_path(warehouse).unlink()

    monkeypatch.setattr(metastore_server, "is_server_process", lambda pid: True)
    monkeypatch.setattr(metastore_server, "_stop_recorded", stop_recorded)
    monkeypatch.setattr(metastore_server, "_terminate", lambda pid, timeout: stopped.append(-pid))
    return stopped


def test_an_on_demand_server_is_stopped_once_no_holder_is_left(
    tmp_path: Path, stops: list[int], holders: list[subprocess.Popen[str]]
) -> None:
    metastore_server._write_record(tmp_path, _record(on_demand=True))
    holder = _hold(tmp_path, holders)
    assert metastore_server.stop_if_unheld(tmp_path, jars=tmp_path) is Verdict.SERVE
    assert stops == [] and metastore_server.read_record(tmp_path) is not None

    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert metastore_server.stop_if_unheld(tmp_path, jars=tmp_path, pid=4242) is Verdict.STOP
    assert stops == [4242] and metastore_server.read_record(tmp_path) is None
    assert metastore_server.stop_if_unheld(tmp_path, jars=tmp_path) is Verdict.GONE


def test_a_kept_server_stays_without_holders(tmp_path: Path, stops: list[int]) -> None:
    metastore_server._write_record(tmp_path, _record(on_demand=False))
    assert metastore_server.stop_if_unheld(tmp_path, jars=tmp_path) is Verdict.KEEP
    assert stops == [] and metastore_server.read_record(tmp_path) == _record(on_demand=False)


def test_a_record_without_the_flag_is_kept(tmp_path: Path) -> None:
    """A record written before servers were started on demand names a kept server."""
    metastore_server.record_path(tmp_path).write_text(
        '{"pid": 1, "host": "127.0.0.1", "port": 1, "database": "x", "started": "t"}'
    )
    record = metastore_server.read_record(tmp_path)
    assert record is not None and not record.on_demand


def test_the_watchdog_decides_each_round_until_the_server_is_not_served() -> None:
    decisions: list[Verdict | MetastoreError] = [
        Verdict.SERVE,
        MetastoreError("the start lock is busy"),  # left to the next round
        Verdict.SERVE,
        Verdict.STOP,
        Verdict.SERVE,  # never reached
    ]
    slept: list[float] = []

    def decide() -> Verdict:
        decided = decisions.pop(0)
        if isinstance(decided, MetastoreError):
            raise decided
        return decided

    assert watch(decide, interval=0.5, sleep=slept.append) is Verdict.STOP
    assert slept == [0.5] * 4 and decisions == [Verdict.SERVE]
    assert watch(lambda: Verdict.KEEP, sleep=slept.append) is Verdict.KEEP


def test_a_server_no_record_names_is_ended_by_its_watchdog(
    tmp_path: Path, stops: list[int], holders: list[subprocess.Popen[str]]
) -> None:
    """Its starter was killed before it wrote the record: no client can find the server."""
    _hold(tmp_path, holders)  # even held: the lease is no use without a record
    assert metastore_server.stop_if_unheld(tmp_path, jars=tmp_path, pid=4242) is Verdict.ORPHAN
    assert stops == [-4242]
    assert metastore_server.stop_if_unheld(tmp_path, jars=tmp_path) is Verdict.GONE  # no pid


def test_a_watchdog_never_makes_a_removed_warehouse_again(tmp_path: Path, stops: list[int]) -> None:
    """The demo removed the warehouse while the watchdog's round was under way: the round
    finds no record (its server, if it still runs, is an orphan) and makes no folder."""
    removed = tmp_path / "warehouse"
    assert metastore_server.stop_if_unheld(removed, jars=tmp_path, pid=4242) is Verdict.ORPHAN
    assert stops == [-4242] and not removed.exists()


def test_a_warehouse_is_vacated_of_its_unheld_server_only(
    tmp_path: Path, stops: list[int], holders: list[subprocess.Popen[str]]
) -> None:
    metastore_server._write_record(tmp_path, _record(on_demand=False))
    kept = pytest.raises(MetastoreError, match=r"\(derby://127\.0\.0\.1:1527, pid 4242\) serves")
    with kept, metastore_server.vacated(tmp_path, jars=tmp_path):
        raise AssertionError("a kept server's warehouse is not vacated")

    metastore_server._write_record(tmp_path, _record(on_demand=True))
    holder = _hold(tmp_path, holders)
    held = pytest.raises(MetastoreError, match="stop it first")
    with held, metastore_server.vacated(tmp_path, jars=tmp_path):
        raise AssertionError("a held server's warehouse is not vacated")
    assert stops == []

    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    with metastore_server.vacated(tmp_path, jars=tmp_path) as vacant:
        assert stops == [_record(on_demand=True).pid] and vacant == tmp_path.resolve()
        assert metastore_server.read_record(tmp_path) is None
    with metastore_server.vacated(tmp_path / "none", jars=tmp_path):
        assert not (tmp_path / "none").exists()
