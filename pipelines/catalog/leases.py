"""Who still uses a metastore server started on demand, and what its watchdog decides.

Follow mode and the Thrift server start a Derby network server for their warehouse when none
runs (:func:`pipelines.catalog.server.serving`); such a server is *on demand*: it ends when
no process uses it any more, however its users ended. A server that ``dcp-cdc metastore
start`` started (or took over) is *kept*: it runs until ``dcp-cdc metastore stop``.

A process that uses an on-demand server holds a lease on it: a shared ``flock`` on
``<warehouse>/metastore_db.server.holders``, for as long as it uses the server. The kernel
drops the lock when the process ends, kill -9 included, so the lease of a dead process
cannot linger and a recycled pid cannot pass for a holder. Whether anyone holds a lease is
probed with an exclusive lock: taking it means no one does. Leases are taken and probes made
under the warehouse's start lock (``.dcp-cdc-metastore.lock``), so a newcomer either holds its
lease before the server is judged unwanted, or finds the server stopped and starts another.

The server's watchdog (:mod:`pipelines.catalog.watchdog`) and a holder that ends cleanly
apply :func:`verdict`; the lock handling stays in the two context managers below.
"""

from __future__ import annotations

import contextlib
import enum
import fcntl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

from pipelines.catalog.embedded import METASTORE_DIR_NAME
from pipelines.errors import MetastoreError

HOLDERS_NAME = f"{METASTORE_DIR_NAME}.server.holders"


class Verdict(enum.Enum):
    """What becomes of a warehouse's recorded server."""

    SERVE = "serve"
    """On demand and held by a lease: it keeps serving."""
    STOP = "stop"
    """On demand and no lease held: it is stopped."""
    KEEP = "keep"
    """Kept (``dcp-cdc metastore start``): it runs until ``dcp-cdc metastore stop``."""
    GONE = "gone"
    """No live server recorded, or another one than the watchdog's: nothing to watch."""
    ORPHAN = "orphan"
    """The watchdog's server runs but no record names it: its starter died before writing
    the record (or the record was replaced), so no client can find it. It is ended."""


def verdict(
    recorded: int | None,
    *,
    on_demand: bool,
    pid: int | None,
    alive: Callable[[int], bool],
    held: bool,
) -> Verdict:
    """The fate of the warehouse's recorded server (``recorded``: its pid, None when none is
    recorded; ``on_demand`` as recorded; read under the start lock) and of ``pid``, the
    server a watchdog watches (None: whichever is recorded). ``alive`` tells whether a pid
    runs a server; ``held`` whether any lease is held."""
    named = recorded is not None and (pid is None or recorded == pid)
    if pid is not None and not named and alive(pid):
        return Verdict.ORPHAN
    if recorded is None or not named or not alive(recorded):
        return Verdict.GONE
    if not on_demand:
        return Verdict.KEEP
    return Verdict.SERVE if held else Verdict.STOP


def holders_path(warehouse: Path) -> Path:
    return warehouse / HOLDERS_NAME


class Lease:
    """A process's hold on its warehouse's on-demand server; released by :meth:`release` or
    by the process's end."""

    def __init__(self, handle: IO[str]) -> None:
        self._handle = handle

    def release(self) -> None:
        """Give the lease back (closing the file drops the lock, unless a child process
        shares it); idempotent."""
        self._handle.close()

    def fileno(self) -> int:
        """The lease's file descriptor: a child process given it (``pass_fds``) shares the
        lease, which then lasts as long as either process."""
        return self._handle.fileno()


def take(warehouse: Path) -> Lease:
    """A lease on ``warehouse``'s server. The caller holds the start lock, so no probe holds
    the exclusive lock meanwhile."""
    handle = open(holders_path(warehouse), "a", encoding="utf-8")  # noqa: SIM115 (the lease)
    try:
        fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise MetastoreError(
            f"cannot take a lease on the metastore server of {warehouse}: "
            f"{holders_path(warehouse)} is locked exclusively by a process that does not "
            "hold the start lock"
        ) from None
    return Lease(handle)


@contextlib.contextmanager
def unheld(warehouse: Path) -> Iterator[bool]:
    """Whether no process holds a lease on ``warehouse``'s server; while the block runs with
    True, none can take one (the exclusive lock is held). A warehouse removed meanwhile (the
    demo starts afresh) has no holder."""
    try:
        opened = open(holders_path(warehouse), "a", encoding="utf-8")  # noqa: SIM115
    except FileNotFoundError:
        yield True
        return
    with opened as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
