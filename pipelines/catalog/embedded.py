"""The embedded catalog of a local warehouse: Derby in ``<warehouse>/metastore_db``, owned by
one process at a time, and recoverable from a run killed while it was being created.

Derby creates the database folder first and writes its ``service.properties`` last (about
0.4 s later here); a process killed in between leaves a folder Derby refuses to boot ever
after (``ERROR XBM0A``). No table can be registered in such a folder, so nothing is lost by
setting it aside: :func:`open_local_catalog` renames it to ``metastore_db.incomplete-<time>``
and Spark creates the catalog again. That is only safe while no other process is creating the
same catalog, which the lock file ``<warehouse>/.dcp-cdc-catalog.lock`` ensures: a dcp-cdc
process holds it (an exclusive ``flock``) from before its Spark session opens the catalog
until it exits. A second process on the same warehouse gets :class:`CatalogError` at once,
naming the holder, instead of Derby's ``XSDB6`` trace when it first touches the catalog.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import logging
import os
from pathlib import Path
from typing import IO

from pipelines.errors import CatalogError

log = logging.getLogger(__name__)

METASTORE_DIR_NAME = "metastore_db"
LOCK_NAME = ".dcp-cdc-catalog.lock"
SERVICE_PROPERTIES = "service.properties"
"""What Derby writes last when it creates a database (it needs it to boot one)."""

_held: dict[Path, IO[str]] = {}
"""The lock files this process holds, by warehouse: kept open until the process exits."""


def open_local_catalog(warehouse: Path) -> Path | None:
    """Take ``warehouse``'s catalog lock for this process (once), and set aside a catalog
    whose creation was killed. Returns where it was set aside, if it was."""
    warehouse = warehouse.resolve()
    if warehouse not in _held:
        _held[warehouse] = _lock(warehouse)
    return _set_aside_incomplete(warehouse)


def release(warehouse: Path) -> None:
    """Give the lock back (tests; a process exiting releases it by itself)."""
    held = _held.pop(warehouse.resolve(), None)
    if held is not None:
        held.close()


def lock_for_server(warehouse: Path, holder: str) -> IO[str]:
    """Take ``warehouse``'s catalog lock for a metastore server about to open the catalog
    (:mod:`pipelines.catalog.server`), and set aside a catalog whose creation was killed.
    The caller hands the open file to the server process, which holds the lock while it runs,
    then closes its own copy."""
    handle = _lock(warehouse.resolve(), holder)
    try:
        _set_aside_incomplete(warehouse.resolve())
    except BaseException:
        handle.close()
        raise
    return handle


def _lock(warehouse: Path, holder: str | None = None) -> IO[str]:
    warehouse.mkdir(parents=True, exist_ok=True)
    path = warehouse / LOCK_NAME
    handle = open(path, "a+", encoding="utf-8")  # noqa: SIM115 (held until the process exits)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise CatalogError(
            f"the embedded catalog of warehouse {warehouse} is in use by {holder}: it admits "
            "one process at a time (Derby). Wait for that process or stop it; processes that "
            "must run at once share the catalog through a metastore server started before "
            "them (`dcp-cdc metastore start`; follow mode and the Thrift server start one), "
            "or a configured [spark] metastore."
        ) from None
    handle.seek(0)
    handle.truncate()
    since = f"since {dt.datetime.now(dt.UTC):%Y-%m-%dT%H:%M:%SZ}"
    handle.write(f"{holder or f'process {os.getpid()}'} {since}\n")
    handle.flush()
    return handle


def _set_aside_incomplete(warehouse: Path) -> Path | None:
    catalog = warehouse / METASTORE_DIR_NAME
    if not catalog.is_dir() or (catalog / SERVICE_PROPERTIES).exists():
        return None
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    aside = warehouse / f"{METASTORE_DIR_NAME}.incomplete-{stamp}"
    catalog.rename(aside)
    log.warning(
        "catalog: %s has no %s: its creation was interrupted (no table can be in it); "
        "set aside as %s and created again",
        catalog,
        SERVICE_PROPERTIES,
        aside.name,
    )
    return aside


def explain_open_failure(warehouse: Path, exc: BaseException) -> CatalogError:
    """A :class:`CatalogError` for a Spark failure to open the embedded catalog, with what to
    do; the Java trace is cut to its first Derby line."""
    text = str(exc)
    catalog = warehouse / METASTORE_DIR_NAME
    derby = next((line.strip() for line in text.splitlines() if "ERROR X" in line), "")
    if "XSDB6" in text:
        why = (
            "another process has it open (Derby admits one process): stop that process, or "
            "start a metastore server before the processes that share the catalog (`dcp-cdc "
            "metastore start`), or configure one ([spark] metastore)"
        )
    else:
        why = (
            "it is damaged. If no table was ever registered in it (a first run that was "
            f"killed), move {catalog} away and run again; otherwise restore it from a backup"
        )
    detail = f" ({derby})" if derby else f" ({type(exc).__name__}: {text.splitlines()[0][:300]})"
    return CatalogError(f"the embedded catalog {catalog} cannot be opened: {why}{detail}")
