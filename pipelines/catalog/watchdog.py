"""The watchdog of an on-demand metastore server: ``python -m pipelines.catalog.watchdog
WAREHOUSE PID JARS``, started detached beside the server (:func:`pipelines.catalog.server.hold`).

Every second it applies :func:`pipelines.catalog.leases.verdict` to the server ``PID`` of
``WAREHOUSE`` under the start lock, and stops the server when no process holds a lease on it
any more: the case of a last holder killed, which cannot stop the server itself. It ends when
the server is gone (stopped by it, by a holder's clean exit or by ``dcp-cdc metastore stop``)
or kept (``dcp-cdc metastore start`` took it over). It starts with the server, before the
server's record is written: when the starter dies before writing it, no client can find the
server, and the watchdog ends it. Its lines go to the server's log.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pipelines.catalog.leases import Verdict
from pipelines.errors import MetastoreError

log = logging.getLogger(__name__)

INTERVAL_S = 1.0
LOCK_WAIT_S = 1.0
"""How long a round waits for the start lock before it leaves the decision to the next."""


def watch(
    decide: Callable[[], Verdict],
    *,
    interval: float = INTERVAL_S,
    sleep: Callable[[float], None] = time.sleep,
) -> Verdict:
    """Apply ``decide`` every ``interval`` seconds until the server is not served any more:
    stopped, gone or kept. A round that cannot take the start lock (:class:`MetastoreError`)
    leaves the decision to the next."""
    while True:
        sleep(interval)
        try:
            decided = decide()
        except MetastoreError as exc:  # the start lock is busy: a server starting or stopping
            log.debug("metastore watchdog: %s; deciding next round", exc)
            continue
        if decided is not Verdict.SERVE:
            return decided


def main(argv: Sequence[str] | None = None) -> int:
    from pipelines.catalog.server import is_server_process, stop_if_unheld

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 3 or not args[1].isdigit():
        print("usage: python -m pipelines.catalog.watchdog WAREHOUSE PID JARS", file=sys.stderr)
        return 2
    warehouse, pid, jars = Path(args[0]), int(args[1]), Path(args[2])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    def decide() -> Verdict:
        if not is_server_process(pid):  # ended: nothing to decide, no lock file to recreate
            return Verdict.GONE
        return stop_if_unheld(warehouse, jars=jars, pid=pid, timeout=LOCK_WAIT_S)

    log.info("metastore watchdog: watching pid %d for %s", pid, warehouse)
    decided = watch(decide)
    log.info("metastore watchdog: pid %d %s; watchdog ends", pid, _said[decided])
    return 0


_said = {
    Verdict.STOP: "held by no process any more: stopped",
    Verdict.GONE: "gone",
    Verdict.ORPHAN: "named by no record (its starter died while starting it): ended",
    Verdict.KEEP: "kept (dcp-cdc metastore start)",
    Verdict.SERVE: "serving",
}

if __name__ == "__main__":
    sys.exit(main())
