"""Fault points: named places in the jobs where a test may kill the process as ``kill -9`` would.

Every table creation, Delta commit and catalog change passes a point (:mod:`pipelines.lake.delta_io`
calls :func:`point` before and after each), named ``STEP:OBJECT``: ``database:bronze``,
``create:bronze.b_events`` / ``created:...``, ``commit:silver.b__s__c_all`` /
``committed:...``, ``catalog:silver.b__s__c`` / ``cataloged:...``. Two environment variables
drive them, and without them a point does nothing:

- ``DCP_CDC_KILL_AT=PATTERN[#N]``: at the ``N``-th point (default 1) whose name matches the
  shell pattern, the process sends SIGKILL to its process group (to itself alone when it does
  not lead one), the JVM included. ``create-committed:TABLE`` is a point inside a creation:
  the first Delta commit of the table is on disk, its catalog entry is not yet.
- ``DCP_CDC_FAULT_TRACE=FILE``: every point reached is appended to ``FILE`` (monotonic time,
  process id, name), so a kill at a random instant can be told which step it hit.

The kill-anywhere tests (``tests/e2e/test_kill.py``) and ``benchmarks/kill_trials.py`` use them.
"""

from __future__ import annotations

import fnmatch
import os
import signal
import threading
import time
from collections.abc import Callable

KILL_AT_ENV = "DCP_CDC_KILL_AT"
TRACE_ENV = "DCP_CDC_FAULT_TRACE"

_hits = 0
_lock = threading.Lock()


def armed(name: str) -> bool:
    """Whether ``$DCP_CDC_KILL_AT`` names ``name`` (any hit of it)."""
    pattern = os.environ.get(KILL_AT_ENV)
    if not pattern:
        return False
    return fnmatch.fnmatchcase(name, pattern.partition("#")[0])


def point(step: str, name: str) -> None:
    """Pass the fault point ``STEP:NAME``: trace it, and die here if it is the chosen one."""
    global _hits
    full = f"{step}:{name}"
    trace = os.environ.get(TRACE_ENV)
    if trace:
        with open(trace, "a", encoding="utf-8") as out:
            out.write(f"{time.monotonic():.6f} {os.getpid()} {full}\n")
    if not armed(full):
        return
    wanted = int(os.environ[KILL_AT_ENV].partition("#")[2] or 1)
    with _lock:
        _hits += 1
        if _hits == wanted:
            kill_now()


def kill_now() -> None:
    """SIGKILL the process group this process leads (the JVM with it), else this process."""
    if os.getpgid(0) == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def watch(step: str, name: str, reached: Callable[[], bool]) -> Callable[[], None]:
    """When ``STEP:NAME`` is armed, kill the process as soon as ``reached()`` turns true (a
    thread polls it every millisecond: for a state inside a call we cannot interrupt, such as
    a creation's first commit before its catalog entry). Returns the function that stops
    watching; a no-op when the point is not armed."""
    if not armed(f"{step}:{name}"):
        return lambda: None
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            if reached():
                point(step, name)
                return
            time.sleep(0.001)

    threading.Thread(target=poll, name=f"fault {step}:{name}", daemon=True).start()
    return stop.set
