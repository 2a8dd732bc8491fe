"""Kill-anywhere: ``kill -9`` of a job's process group at a named step (a fault
point of :mod:`pipelines.lake.faults`), then the job again: it succeeds with no manual step, bronze
holds every frame once, silver equals the truth and no published version moved a key back.

Each case starts fresh JVMs for the killed run and the one after (over a minute each), so
they run in ``make test-long`` (``DCP_CDC_KILL_ALL=1``): every targeted step of both jobs.
``make test`` keeps the in-process cases (``tests/spark/test_kill_resume.py``: a creation
killed between its first commit and its catalog entry, a re-run after a killed apply).
Random instants: ``benchmarks/kill_trials.py``.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.support import kill_harness as kh

EVERY_STEP = os.environ.get("DCP_CDC_KILL_ALL") == "1"
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not EVERY_STEP, reason="make test-long (DCP_CDC_KILL_ALL=1)"),
]

INGEST_STEPS = [
    "create-committed:*_events",  # the step the issue found wedged
    "databased:bronze",
    "create-committed:*_ingest_log",
    "commit:*_events",
    "committed:*_events",
]
APPLY_STEPS = [
    "create-committed:silver.*_all",
    "cataloged:silver.*",
    "committed:silver.*_all#2",
    "commit:silver.*__stream_state",
]


def _killed_then_again(setup: kh.Setup, verb: str, step: str) -> None:
    killed = kh.run_to_end(setup, verb, f"{verb}-killed", kill_at=step)
    assert killed.process.returncode == -signal.SIGKILL, killed.output()[-3000:]
    assert kh.step_at(killed.points(), float("inf")).startswith(step.split("*")[0])
    again = kh.run_to_end(setup, verb, f"{verb}-again")
    assert again.process.returncode == 0, again.output()[-3000:]


@pytest.mark.parametrize("step", INGEST_STEPS)
def test_ingest_killed_at_a_step_then_run_again(tmp_path: Path, step: str) -> None:
    setup = kh.prepare(tmp_path)
    _killed_then_again(setup, "ingest", step)
    bronze = kh.bronze_rows(setup)
    assert len(bronze["events"]) == len(set(bronze["events"])) == setup.result.frames
    assert len(bronze["quarantine"]) == len(set(bronze["quarantine"])) == 1  # the injected one


@pytest.mark.parametrize("step", APPLY_STEPS)
def test_apply_killed_at_a_step_then_run_again(tmp_path: Path, step: str) -> None:
    setup = kh.prepare(tmp_path)
    assert kh.run_to_end(setup, "ingest", "ingest").process.returncode == 0
    _killed_then_again(setup, "apply", step)
    assert kh.silver_problems(setup) == []
    assert kh.regressions(setup) == []
