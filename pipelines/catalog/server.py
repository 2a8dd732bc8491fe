"""The Derby network server that lets several processes share a local warehouse's catalog.

Embedded Derby (the default catalog, :mod:`pipelines.catalog.embedded`) admits one process at a
time. Run by ``dcp-cdc metastore start`` (or by follow mode and the Thrift server, for as long
as any of them runs), a network server opens ``<warehouse>/metastore_db`` in a JVM of its own and
serves it on a loopback port; every Spark session of the warehouse then reaches the catalog
through Derby's client driver (:mod:`pipelines.catalog.settings`), as many processes as need it.

The server is ``org.apache.derby.drda.NetworkServerControl`` on the Derby that pyspark ships
(``derby``, ``derbyshared``, ``derbytools`` in ``pyspark/jars``) plus ``derbynet`` from the
project's jars (``make setup``). It is started detached (a session of its own: Ctrl-C on the
terminal that started it does not reach it) and recorded beside the database, in
``<warehouse>/metastore_db.server.json`` (pid, host, port, database, whether on demand), with
its output in ``metastore_db.server.log``. One that ``dcp-cdc metastore start`` starts (or
finds running) is kept until ``dcp-cdc metastore stop``; one a long-running command starts
(:func:`serving`) is on demand: the processes using it hold leases, and it stops when the
last lease goes, by a clean exit or by its watchdog when the last holder was killed
(:mod:`pipelines.catalog.leases`, :mod:`pipelines.catalog.watchdog`). It holds the
warehouse's catalog lock while it runs, so an embedded session cannot open the database under
it. Starting and stopping take ``<warehouse>/.dcp-cdc-metastore.lock``: two processes
starting at once get one server.

The server checks no password, so it listens on loopback only: any user of this machine who
reaches the port can read and change the catalog (not the tables' files).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import fcntl
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pipelines
from dcp_cdc.config import is_loopback
from pipelines.catalog import leases as metastore_leases
from pipelines.catalog.embedded import METASTORE_DIR_NAME, lock_for_server
from pipelines.catalog.leases import Lease, Verdict
from pipelines.errors import MetastoreError

log = logging.getLogger(__name__)

SERVER_CLASS = "org.apache.derby.drda.NetworkServerControl"
CLIENT_DRIVER = "org.apache.derby.jdbc.ClientDriver"
"""The JDBC driver a Spark session reaches the server with (in ``derbytools``, which loads the
client itself from ``derbyclient``)."""
DEFAULT_HOST = "127.0.0.1"
RECORD_NAME = f"{METASTORE_DIR_NAME}.server.json"
LOG_NAME = f"{METASTORE_DIR_NAME}.server.log"
START_LOCK_NAME = ".dcp-cdc-metastore.lock"
SPARK_DERBY_JARS = ("derby", "derbyshared", "derbytools")
"""The Derby jars pyspark ships (``pyspark/jars``); ``derbynet`` comes from the project's."""
SERVER_HEAP = "-Xmx256m"
"""A catalog of a few hundred tables needs little: the server stays small beside Spark."""

_children: dict[int, subprocess.Popen[bytes]] = {}
"""Servers this process started, by pid: reaped when stopped (no zombie left behind)."""
_holding: list[Lease] = []
"""The leases this process holds while :func:`serving` blocks run."""


@dataclass(frozen=True, slots=True)
class ServerRecord:
    """A running server as recorded beside its database."""

    pid: int
    host: str
    port: int
    database: str
    """The database's absolute path, as clients name it in their URL."""
    started: str
    on_demand: bool = False
    """Started by a long-running command: it stops when no process holds a lease on it.
    False: kept until ``dcp-cdc metastore stop``."""

    @property
    def address(self) -> str:
        """``derby://HOST:PORT`` (the form of ``[spark] metastore``)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"derby://{host}:{self.port}"


def record_path(warehouse: Path) -> Path:
    return warehouse / RECORD_NAME


def read_record(warehouse: Path) -> ServerRecord | None:
    """The server recorded for ``warehouse``, live or not; None when none is (or the record
    is unreadable: a server writes it whole, by rename)."""
    try:
        raw = json.loads(record_path(warehouse).read_text(encoding="utf-8"))
        return ServerRecord(
            pid=int(raw["pid"]),
            host=str(raw["host"]),
            port=int(raw["port"]),
            database=str(raw["database"]),
            started=str(raw["started"]),
            on_demand=raw.get("on_demand") is True,
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def unreachable(host: str, port: int, timeout: float = 2.0) -> str | None:
    """Why nothing accepts a TCP connection at ``host:port`` (``connection refused`` at once,
    ``no answer within N s`` after ``timeout``, or the socket's error), None when something
    does."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except ConnectionRefusedError:
        return "connection refused"
    except OSError as exc:
        return exc.strerror or type(exc).__name__


def answers(host: str, port: int, timeout: float = 2.0) -> bool:
    """True when something accepts a TCP connection at ``host:port`` within ``timeout``."""
    return unreachable(host, port, timeout) is None


def is_server_process(pid: int) -> bool:
    """True when ``pid`` runs a Derby network server (not a recycled pid, not a zombie)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return SERVER_CLASS.encode() in cmdline


def live_server(warehouse: Path) -> ServerRecord | None:
    """The server recorded for ``warehouse`` if it still runs and accepts connections."""
    record = read_record(warehouse.resolve())
    if record is None or not is_server_process(record.pid):
        return None
    return record if answers(record.host, record.port) else None


def server_classpath(jars: Path) -> list[Path]:
    """The server's class path: pyspark's Derby and ``derbynet`` from ``jars``, the project's
    jars folder (:func:`pipelines.lake.spark_session.delta_jars_dir`)."""
    import pyspark

    spark_jars = Path(pyspark.__file__).resolve().parent / "jars"
    found: list[Path] = []
    for folder, name in [(spark_jars, n) for n in SPARK_DERBY_JARS] + [(jars, "derbynet")]:
        candidates = sorted(folder.glob(f"{name}-[0-9]*.jar"))
        if not candidates:
            raise MetastoreError(
                f"the metastore server needs {name}-<version>.jar in {folder}, found none"
                + (
                    ": run `make setup` (build-support/jars resolves it from Maven Central)"
                    if name == "derbynet"
                    else ""
                )
            )
        found.append(candidates[-1])
    return found


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists():
        raise MetastoreError(
            "the metastore server needs Java (17): none on PATH and JAVA_HOME names none"
        )
    return java


def _control(jars: Path, *arguments: str, timeout: float = 60.0) -> bool:
    """``NetworkServerControl ARGUMENTS`` (``ping``, ``shutdown``) run to its end: True on
    exit status 0."""
    classpath = os.pathsep.join(str(jar) for jar in server_classpath(jars))
    try:
        done = subprocess.run(
            [_java(), "-cp", classpath, SERVER_CLASS, *arguments],
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def ping(record: ServerRecord, jars: Path) -> bool:
    """True when a Derby network server answers Derby's own ping at ``record``'s address."""
    return _control(jars, "ping", "-h", record.host, "-p", str(record.port))


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.bind((host, 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def _start_lock(warehouse: Path, timeout: float, *, create: bool = True) -> Iterator[bool]:
    """The lock that settles two processes starting (or stopping) one warehouse's server;
    yields whether it is held. Without ``create``, a warehouse that does not exist yields
    False, unlocked (a stop never makes the folder again that the demo has just removed)."""
    if create:
        warehouse.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        try:
            handle = stack.enter_context(open(warehouse / START_LOCK_NAME, "a", encoding="utf-8"))
        except FileNotFoundError:
            if create:
                raise
            handle = None
        if handle is None:
            yield False
            return
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise MetastoreError(
                        f"another process has been starting or stopping the metastore server "
                        f"of {warehouse} for over {timeout:g} s ({warehouse / START_LOCK_NAME})"
                    ) from None
                time.sleep(0.1)
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def start(
    warehouse: Path,
    *,
    port: int | None = None,
    host: str = DEFAULT_HOST,
    jars: Path,
    database: Path | None = None,
    timeout: float = 60.0,
) -> tuple[ServerRecord, bool]:
    """The kept server of ``warehouse`` (``dcp-cdc metastore start``): the one that runs
    (an on-demand one is kept from now on), else one started now on ``port`` (None: a free
    port). Returns it and whether this call started it. ``warehouse`` is the folder of the
    server's record, lock and log; ``database`` the catalog it serves, by default
    ``<warehouse>/metastore_db`` (another path for a warehouse on object storage, whose
    catalog lives on a local disk: ``[spark] metastore = "derby://HOST:PORT/ABS/PATH"``)."""
    _check_host(host)
    warehouse = warehouse.resolve()
    served = database.resolve() if database is not None else warehouse / METASTORE_DIR_NAME
    with _start_lock(warehouse, timeout):
        running = _running(warehouse, served, port)
        if running is not None:
            if running.on_demand:
                running = dataclasses.replace(running, on_demand=False)
                _write_record(warehouse, running)
                log.info("metastore: %s (pid %d) is kept from now on", running.address, running.pid)
            return running, False
        record = _launch(warehouse, served, host, port, jars, timeout, on_demand=False)
    log.info("metastore: started %s (pid %d) for %s", record.address, record.pid, record.database)
    return record, True


def _check_host(host: str) -> None:
    if not is_loopback(host):
        raise MetastoreError(
            f"the metastore server listens on loopback only (it checks no password), got "
            f"host {host!r}; across machines use a Hive metastore ([spark] metastore = "
            '"thrift://HOST:9083")'
        )


def _running(warehouse: Path, served: Path, port: int | None) -> ServerRecord | None:
    """The live server of ``warehouse`` when it serves ``served`` (on ``port``, if given);
    :class:`MetastoreError` when it serves another database or listens elsewhere."""
    running = live_server(warehouse)
    if running is not None and running.database != str(served):
        raise MetastoreError(
            f"the metastore server recorded in {record_path(warehouse)} serves "
            f"{running.database}, not {served}: stop it first (`dcp-cdc metastore stop`)"
        )
    if running is not None and port is not None and running.port != port:
        raise MetastoreError(
            f"the metastore server of {warehouse} already runs on {running.address} "
            f"(pid {running.pid}), not on port {port}: stop it first "
            "(`dcp-cdc metastore stop`)"
        )
    return running


def hold(warehouse: Path, *, jars: Path, timeout: float = 60.0) -> tuple[ServerRecord, Lease]:
    """A lease on ``warehouse``'s server: the one that runs, else one started now on demand
    (on a free loopback port, with its watchdog). The lease is taken before the server is
    started and under the start lock, so the server is never unheld in between."""
    warehouse = warehouse.resolve()
    served = warehouse / METASTORE_DIR_NAME
    with _start_lock(warehouse, timeout):
        running = _running(warehouse, served, None)
        lease = metastore_leases.take(warehouse)
        if running is not None:
            return running, lease
        try:
            record = _launch(warehouse, served, DEFAULT_HOST, None, jars, timeout, on_demand=True)
        except BaseException:
            lease.release()
            raise
    log.info(
        "metastore: started %s (pid %d) for %s, on demand",
        record.address,
        record.pid,
        record.database,
    )
    return record, lease


def _start_watchdog(warehouse: Path, pid: int, jars: Path) -> None:
    """The detached process that stops the on-demand server ``pid`` once no lease is held, or
    once it is found unrecorded (its starter died while starting it)
    (:mod:`pipelines.catalog.watchdog`), running this process's ``pipelines``."""
    source = str(Path(pipelines.__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([source, path] if path else [source])}
    command = [sys.executable, "-m", "pipelines.catalog.watchdog"]
    with open(warehouse / LOG_NAME, "ab") as output:
        subprocess.Popen(
            [*command, str(warehouse), str(pid), str(jars)],
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=warehouse,
            env=env,
        )


def _launch(
    warehouse: Path,
    database: Path,
    host: str,
    port: int | None,
    jars: Path,
    timeout: float,
    *,
    on_demand: bool,
) -> ServerRecord:
    """A new server process on ``warehouse``'s catalog, recorded once it accepts connections."""
    chosen = port if port is not None else _free_port(host)
    if answers(host, chosen, timeout=0.5):
        raise MetastoreError(
            f"port {chosen} on {host} is taken by another program: choose another (--port, "
            "or the port of [spark] metastore)"
        )
    classpath = os.pathsep.join(str(jar) for jar in server_classpath(jars))
    command = [
        _java(),
        SERVER_HEAP,
        "-Duser.timezone=UTC",
        f"-Dderby.system.home={warehouse}",
        "-cp",
        classpath,
        SERVER_CLASS,
        "start",
        "-h",
        host,
        "-p",
        str(chosen),
    ]
    lock = lock_for_server(warehouse, f"the metastore server on {host}:{chosen}")
    try:
        with open(warehouse / LOG_NAME, "ab") as output:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                pass_fds=(lock.fileno(),),  # the server holds the catalog lock while it runs
                start_new_session=True,
                cwd=warehouse,
            )
    finally:
        lock.close()
    _children[process.pid] = process
    if on_demand:  # now: a starter killed before the record is written leaves no server
        _start_watchdog(warehouse, process.pid, jars)
    deadline = time.monotonic() + timeout
    while not answers(host, chosen, timeout=0.5):
        if process.poll() is not None or time.monotonic() > deadline:
            _end(process)
            raise MetastoreError(
                f"the metastore server for {warehouse} did not come up on {host}:{chosen} "
                f"within {timeout:g} s (exit status {process.returncode}); its output, in "
                f"{warehouse / LOG_NAME}, ends with: {_tail(warehouse / LOG_NAME)}"
            )
        time.sleep(0.1)
    time.sleep(0.2)
    if process.poll() is not None:  # what answers is another program that took the port
        _end(process)
        raise MetastoreError(
            f"the metastore server for {warehouse} could not listen on {host}:{chosen} "
            f"(exit status {process.returncode}); its output, in {warehouse / LOG_NAME}, "
            f"ends with: {_tail(warehouse / LOG_NAME)}"
        )
    record = ServerRecord(
        pid=process.pid,
        host=host,
        port=chosen,
        database=str(database),
        started=f"{dt.datetime.now(dt.UTC):%Y-%m-%dT%H:%M:%SZ}",
        on_demand=on_demand,
    )
    _write_record(warehouse, record)
    return record


def _write_record(warehouse: Path, record: ServerRecord) -> None:
    """The record, written whole: a reader sees the old one or the new one."""
    path = record_path(warehouse)
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w", encoding="utf-8") as handle:
        json.dump(dataclasses.asdict(record), handle)
        handle.flush()
        os.fsync(handle.fileno())
    partial.replace(path)


def _tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return "(no output)"
    return " | ".join(text[-lines:]) or "(no output)"


def stop(warehouse: Path, *, jars: Path, timeout: float = 30.0) -> ServerRecord | None:
    """Stop the server recorded for ``warehouse`` (Derby's shutdown, which closes the database
    cleanly; SIGTERM, then SIGKILL, if it does not end within ``timeout``) and remove its
    record. Returns the record of the server that ran, None when none was."""
    warehouse = warehouse.resolve()
    with _start_lock(warehouse, timeout):
        record = read_record(warehouse)
        if record is None:
            return None
        running = is_server_process(record.pid)
        _stop_recorded(warehouse, record, jars, timeout, running=running)
    return record if running else None


def stop_if_unheld(
    warehouse: Path, *, jars: Path, pid: int | None = None, timeout: float = 30.0
) -> Verdict:
    """Stop ``warehouse``'s server when it is on demand and no process holds a lease on it
    (:func:`pipelines.catalog.leases.verdict`); with ``pid`` (a watchdog's), only that
    server, which is ended by signals when no record names it. Returns the verdict.
    :class:`MetastoreError` when another process keeps the start lock ``timeout`` seconds."""
    warehouse = warehouse.resolve()
    with _start_lock(warehouse, timeout, create=False) as present:
        if present:
            decided = _decide(warehouse, jars, pid, timeout)
        else:  # the warehouse was removed: no record, no holder
            decided = metastore_leases.verdict(
                None, on_demand=False, pid=pid, alive=is_server_process, held=False
            )
    if decided is Verdict.ORPHAN and pid is not None:
        log.warning("metastore: pid %d serves no record (its starter died): ending it", pid)
        _terminate(pid, timeout)
    return decided


def _decide(warehouse: Path, jars: Path, pid: int | None, timeout: float) -> Verdict:
    """:func:`pipelines.catalog.leases.verdict` on ``warehouse``'s recorded server (and
    ``pid``); the recorded server is stopped when the verdict is STOP (the caller holds the
    start lock)."""
    record = read_record(warehouse)
    with metastore_leases.unheld(warehouse) as free:
        decided = metastore_leases.verdict(
            record.pid if record is not None else None,
            on_demand=record is not None and record.on_demand,
            pid=pid,
            alive=is_server_process,
            held=not free,
        )
        if decided is Verdict.STOP and record is not None:
            _stop_recorded(warehouse, record, jars, timeout, running=True)
    return decided


@contextlib.contextmanager
def vacated(warehouse: Path, *, jars: Path, timeout: float = 30.0) -> Iterator[Path]:
    """A block during which no metastore server serves ``warehouse`` and none can start
    (the start lock is held): for removing it. An on-demand server no process holds (a
    killed holder's, which its watchdog may be stopping at this very moment) is stopped
    first; a server that is kept or held is a :class:`MetastoreError` that names it."""
    warehouse = warehouse.resolve()
    if not warehouse.is_dir():
        yield warehouse
        return
    with _start_lock(warehouse, timeout):
        if _decide(warehouse, jars, None, timeout) in (Verdict.SERVE, Verdict.KEEP):
            record = read_record(warehouse)
            assert record is not None  # SERVE and KEEP are verdicts on a recorded server
            raise MetastoreError(
                f"a metastore server ({record.address}, pid {record.pid}) serves "
                f"{warehouse}, which is to be removed (a demo starts afresh): stop it first "
                "(`dcp-cdc metastore stop`)"
            )
        yield warehouse


def _stop_recorded(
    warehouse: Path, record: ServerRecord, jars: Path, timeout: float, *, running: bool
) -> None:
    """Stop ``record``'s server if ``running`` and remove the record (the caller holds the
    start lock)."""
    if running:
        _control(jars, "shutdown", "-h", record.host, "-p", str(record.port))
        if not _ended(record.pid, timeout):
            log.warning("metastore: pid %d ignored shutdown; terminating it", record.pid)
            _terminate(record.pid, timeout)
    record_path(warehouse).unlink(missing_ok=True)
    if running:
        log.info("metastore: stopped %s (pid %d)", record.address, record.pid)


def _terminate(pid: int, timeout: float) -> None:
    """End the server ``pid``: SIGTERM, then SIGKILL if it does not end within ``timeout``."""
    _signal(pid, signal.SIGTERM)
    if not _ended(pid, timeout):
        _signal(pid, signal.SIGKILL)
        _ended(pid, timeout)


def _signal(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def _ended(pid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` for ``pid`` to end (reaping it if this process started it)."""
    child = _children.get(pid)
    if child is not None:
        try:
            child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        del _children[pid]
        return True
    deadline = time.monotonic() + timeout
    while is_server_process(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _end(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()
    _children.pop(process.pid, None)


@contextlib.contextmanager
def serving(warehouse: Path, *, jars: Path) -> Iterator[ServerRecord]:
    """A server for ``warehouse`` while the block runs (a long-running command's, so that
    other processes share the catalog meanwhile), held by a lease: the one that runs, else
    one started now on demand. At the end the lease is given back, and an on-demand server
    that no process holds any more is stopped; one this process leaves behind by dying is
    stopped by its watchdog."""
    record, lease = hold(warehouse, jars=jars)
    _holding.append(lease)
    try:
        yield record
    finally:
        _holding.remove(lease)
        lease.release()
        stop_if_unheld(warehouse, jars=jars)


def lease_fds() -> tuple[int, ...]:
    """The file descriptors of the leases this process holds (:func:`serving`), for a child
    process that uses the server too (``pass_fds``): the server then lasts as long as the
    child, also when this process is killed."""
    return tuple(lease.fileno() for lease in _holding)
