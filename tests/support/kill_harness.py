"""Kill a job at any instant, run it again, and check what it left: shared by the kill-anywhere
tests (``tests/e2e/test_kill.py``) and ``benchmarks/kill_trials.py``.

Jobs run as ``python -m pipelines.app.cli VERB --config FILE`` in a process group of their own
(``kill -9`` of the group takes the JVM with it), over a warehouse of their own: its embedded
Derby catalog admits one JVM at a time, so every check here reads the Delta tables with
delta-rs (``deltalake``), without a JVM, after the jobs have exited.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dcp_cdc.simulator import SimulationResult, simulate
from pipelines.lake import faults
from pipelines.tables import BucketTables, all_rows
from tests.support import delta_rs

CLI = [sys.executable, "-m", "pipelines.app.cli"]
BUCKET = "kill-test"
SIMULATION = {"scenario": "mixed", "vbuckets": 4, "docs": 60, "ops": 240, "collections": 3}
"""Small, with everything the kills should meet: collections created, flushed and dropped,
rollbacks after a failover, two sessions, a malformed frame and a cut tail."""


@dataclass(frozen=True)
class Setup:
    workdir: Path
    config: Path
    warehouse: Path
    result: SimulationResult
    bucket: str = BUCKET


def prepare(workdir: Path, seed: int = 7) -> Setup:
    """A simulated capture and a configuration whose warehouse is ``workdir/warehouse``."""
    result = simulate(workdir / "sim", bucket=BUCKET, seed=seed, **SIMULATION)  # type: ignore[arg-type]
    warehouse = workdir / "warehouse"
    config = workdir / "dcp-cdc.toml"
    config.write_text(
        f'landing = "{result.out / "landing"}"\nwarehouse = "{warehouse}"\n\n'
        f'[[buckets]]\nname = "{BUCKET}"\n\n'
        '[spark]\nmaster = "local[2]"\nshuffle_partitions = 2\n',
        encoding="utf-8",
    )
    return Setup(workdir, config, warehouse, result)


# --- running and killing -------------------------------------------------------------------


@dataclass
class Run:
    verb: str
    process: subprocess.Popen[bytes]
    log: Path
    trace: Path
    started: float

    def wait(self, timeout: float = 900) -> int:
        return self.process.wait(timeout=timeout)

    def kill(self) -> float:
        """``kill -9`` of the job's process group; returns the instant (monotonic)."""
        at = time.monotonic()
        with contextlib.suppress(ProcessLookupError):  # it ended by itself
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=120)
        return at

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def points(self) -> list[tuple[float, str]]:
        """The fault points the run passed, with their instants (monotonic)."""
        if not self.trace.exists():
            return []
        out = []
        for line in self.trace.read_text(encoding="utf-8").splitlines():
            at, _, rest = line.partition(" ")
            out.append((float(at), rest.partition(" ")[2]))
        return out


def start(setup: Setup, verb: str, tag: str, kill_at: str | None = None) -> Run:
    """``dcp-cdc VERB`` over ``setup`` in a new process group; ``kill_at`` arms a fault point
    (:mod:`pipelines.lake.faults`). Every point it passes is traced to ``tag``'s trace file."""
    log = setup.workdir / f"{tag}.log"
    trace = setup.workdir / f"{tag}.trace"
    trace.unlink(missing_ok=True)
    env = {**os.environ, faults.TRACE_ENV: str(trace)}
    env.pop(faults.KILL_AT_ENV, None)
    if kill_at:
        env[faults.KILL_AT_ENV] = kill_at
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*CLI, verb, "--config", str(setup.config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    return Run(verb, process, log, trace, time.monotonic())


def run_to_end(setup: Setup, verb: str, tag: str, kill_at: str | None = None) -> Run:
    """Start ``verb`` and wait for it to end (by itself, or killed at ``kill_at``)."""
    run = start(setup, verb, tag, kill_at)
    run.wait()
    return run


def step_at(points: list[tuple[float, str]], instant: float) -> str:
    """The last fault point passed before ``instant``: the step a kill then hit."""
    passed = [name for at, name in points if at <= instant]
    return passed[-1] if passed else "start-up (no point yet)"


# --- reading the warehouse (delta-rs) ------------------------------------------------------


def table_path(setup: Setup, table: str) -> Path:
    db, _, name = table.partition(".")
    return setup.warehouse / f"{db}.db" / name


def _rows(path: Path, columns: list[str], version: int | None = None) -> list[dict[str, Any]]:
    return delta_rs.rows(path, columns, version)


def bronze_rows(setup: Setup) -> dict[str, list[tuple[Any, ...]]]:
    """Bronze's rows by table (events, quarantine), each frame by its place in its capture."""
    names = BucketTables(setup.bucket)
    place = ["session_id", "file_sequence", "offset"]
    events = _rows(table_path(setup, names.events), [*place, "op"])
    quarantine = _rows(table_path(setup, names.quarantine), place)
    return {
        "events": sorted(tuple(r[c] for c in [*place, "op"]) for r in events),
        "quarantine": sorted(tuple(r[c] for c in place) for r in quarantine),
    }


def bronze_problems(setup: Setup, reference: dict[str, list[tuple[Any, ...]]]) -> list[str]:
    """How bronze differs from ``reference`` (an uninterrupted run's :func:`bronze_rows`):
    every frame exactly once."""
    got = bronze_rows(setup)
    problems = []
    for kind, rows in got.items():
        dupes = len(rows) - len(set(rows))
        if dupes:
            problems.append(f"{kind}: {dupes} duplicate rows")
        if rows != reference[kind]:
            problems.append(f"{kind}: {len(rows)} rows, expected {len(reference[kind])}")
    return problems


def _registry(setup: Setup) -> list[dict[str, Any]]:
    path = table_path(setup, BucketTables(setup.bucket).registry)
    return _rows(path, ["collection_id", "table_name", "status", "flush_seqnos", "drop_seqnos"])


def _truth(setup: Setup) -> dict[tuple[int, str], dict[str, Any]]:
    docs = {}
    lines = (setup.result.out / "truth" / "documents.jsonl").read_text().splitlines()
    for line in lines:
        d = json.loads(line)
        key = d["key"] if "key" in d else base64.b64decode(d["key_b64"]).decode("utf-8", "replace")
        docs[(d["collection_id"], key)] = d
    return docs


SILVER_COLUMNS = ["key", "doc", "doc_binary", "_collection_id", "_vbucket", "_vb_uuid"]
SILVER_COLUMNS += ["_seqno", "_rev_seqno", "_expiry", "_flags", "_deleted"]


def silver_problems(setup: Setup) -> list[str]:
    """How silver's live rows, as the views show them (the live layer overlaid), differ from
    the simulator's truth (keys, bodies, seqnos)."""
    live: dict[tuple[int, str], dict[str, Any]] = {}
    problems = []
    shown = delta_rs.silver_tables(setup.warehouse / "silver.db", SILVER_COLUMNS)
    for reg in _registry(setup):
        if reg["status"] == "retired":
            continue
        for r in shown.get(table_path(setup, all_rows(reg["table_name"])).name, []):
            if not r["_deleted"]:
                ident = (r["_collection_id"], r["key"])
                if ident in live:
                    problems.append(f"{ident}: two rows")
                live[ident] = r
    truth = _truth(setup)
    if set(live) != set(truth):
        missing, extra = sorted(set(truth) - set(live)), sorted(set(live) - set(truth))
        problems.append(f"silver: {len(missing)} missing {missing[:3]}, {len(extra)} extra")
    for ident in sorted(set(live) & set(truth)):
        d, row = truth[ident], live[ident]
        body = (
            (row["doc"], d["value"])
            if d["is_json"]
            else (row["doc_binary"], base64.b64decode(d["value_b64"]))
        )
        want = (d["seqno"], d["rev_seqno"], d["expiry"], d["flags"], d["vbucket"])
        got = (row["_seqno"], row["_rev_seqno"], row["_expiry"], row["_flags"], row["_vbucket"])
        if body[0] != body[1] or got != want:
            problems.append(f"{ident}: silver {got}, truth {want}")
    return problems[:20]


def _failover_logs(setup: Setup) -> dict[int, list[tuple[int, int]]]:
    rows = _rows(table_path(setup, BucketTables(setup.bucket).stream_state), ["vbucket", "state"])
    return {r["vbucket"]: json.loads(r["state"])["failover_log"] for r in rows}


def _on_history(log: list[tuple[int, int]], uuid: int | None, seqno: int) -> bool:
    """Whether ``(uuid, seqno)`` is on the surviving history of a vbucket (its failover log,
    newest branch first: a branch covers its start up to the next newer branch's start)."""
    for i, (branch, start) in enumerate(log):
        end = log[i - 1][1] if i > 0 else None
        if branch == uuid and start <= seqno and (end is None or seqno <= end):
            return True
    return False


def regressions(setup: Setup, since: dict[str, int] | None = None) -> list[str]:
    """Every published version of every silver ``_all`` table (from ``since[table]``, else
    from version 0) against the one before: a key may only move forward, unless its row was
    on a branch a rollback lost (not on the final failover log) or a flush or drop of its
    collection below which it was goes. Returns what moved back."""
    from deltalake import DeltaTable

    logs = _failover_logs(setup)
    found = []
    for reg in _registry(setup):
        table = all_rows(reg["table_name"])
        path = table_path(setup, table)
        if not (path / "_delta_log").is_dir():
            continue
        cuts: dict[int, int] = {}
        for seqnos in (reg["flush_seqnos"], reg["drop_seqnos"]):
            for vb, seqno in dict(seqnos or {}).items():
                cuts[vb] = max(cuts.get(vb, 0), seqno)
        latest = DeltaTable(str(path)).version()
        previous: dict[str, dict[str, Any]] | None = None
        for version in range((since or {}).get(table, 0), latest + 1):
            columns = ["key", "_vbucket", "_vb_uuid", "_seqno"]
            now = {r["key"]: r for r in _rows(path, columns, version)}
            for key, old in (previous or {}).items():
                new = now.get(key)
                if new is not None and new["_seqno"] >= old["_seqno"]:
                    continue
                if not _on_history(logs.get(old["_vbucket"], []), old["_vb_uuid"], old["_seqno"]):
                    continue  # a lost branch: rolled back
                if new is None and old["_seqno"] < cuts.get(old["_vbucket"], -1):
                    continue  # flushed or dropped
                found.append(
                    f"{table} v{version}: {key!r} went from seqno {old['_seqno']} to "
                    f"{new['_seqno'] if new else 'nothing'}"
                )
            previous = now
    return found[:20]
