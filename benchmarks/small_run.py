"""A small incremental run: what an hourly run of a quiet bucket costs (``make bench
ARGS=small-run``).

The test producer serves a bucket (``mixed`` scenario, 64 vbuckets, one data node) from a
background thread for the whole benchmark; the capture agent captures it ``--until now``
into one new capture file per "hour". The initial load is captured, ingested, applied and
checked first (set-up, reported but not the goal). Then each hour ~3,000 live changes are
captured into one file of about as many frames, which is ingested, applied and checked
into the existing tables:

- the first hour in a FRESH process: Python, Spark start, ingest, apply, check, all timed
  (a local warehouse's Derby metastore admits one Spark process at a time, so the parent,
  which serves and captures, never starts Spark itself);
- then ``--rounds`` more hours in that same process, its session warm.

The ingest hands what it wrote to the apply in memory, as ``dcp-cdc run`` does; the
memories last as long as the process (as follow mode's do).

Goals on 2 cores: warm ingest + apply <= 5 s; fresh process all in <= 45 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from benchmarks.common import Case, report

DATA = Path(__file__).resolve().parent / ".data" / "small_run"
BUCKET = "hourly"
HOUR1 = DATA.with_name("small_run.hour1")
_RESULT = "SMALL-RUN-RESULT "


# --- the worker: a Spark process that runs a round per line read -------------------------------


def worker(work: Path) -> None:
    """Read a line per round from stdin; answer each with one ``_RESULT`` line of timings."""
    started = time.perf_counter()
    from dcp_cdc.config import AppConfig, BucketConfig
    from pipelines.bronze.job import ingest_bucket
    from pipelines.bronze.memory import IngestMemory
    from pipelines.lake.spark_session import build_spark_session
    from pipelines.quality.job import check_bucket
    from pipelines.silver.job import apply_bucket
    from pipelines.silver.memory import ApplyMemory

    config = AppConfig(
        landing=str(work / "landing"),
        warehouse=str(work / "warehouse"),
        buckets=[BucketConfig(name=BUCKET)],
    )
    bucket = config.buckets[0]
    imported = time.perf_counter()
    spark = build_spark_session("dcp-cdc-bench-small-run", config.warehouse, master="local[2]")
    spark_started = time.perf_counter()
    first = {"python": imported - started, "spark start": spark_started - imported}
    profile = os.environ.get("SMALL_RUN_PROFILE")  # a folder: a pyinstrument page per step
    # what ingest wrote, kept for the apply, as dcp-cdc run does (and follow mode, whose
    # memory lives as long as the process: so do these, round after round)
    kept = IngestMemory()
    recalled = ApplyMemory(ingest=kept)
    rounds = 0

    def step(name: str, fn: Any) -> Any:
        t = time.perf_counter()
        if not profile:
            result = fn()
        else:
            from pyinstrument import Profiler

            with Profiler(interval=0.005) as profiler:
                result = fn()
            Path(profile).mkdir(parents=True, exist_ok=True)
            page = Path(profile) / f"round{rounds}-{name}.txt"
            page.write_text(profiler.output_text(unicode=False, show_all=False))
        steps[name] = time.perf_counter() - t
        return result

    try:
        for line in sys.stdin:
            if line.strip() == "quit":
                break
            rounds += 1
            steps: dict[str, Any] = dict(first)
            first = {}
            ingested = step("ingest", lambda: ingest_bucket(spark, config, bucket, memory=kept))
            applied = step("apply", lambda: apply_bucket(spark, config, bucket, memory=recalled))
            quality = step("check", lambda: check_bucket(spark, config, bucket))
            facts = {
                "frames": ingested.frames,
                "changes": applied.changes,
                "tables": len(applied.tables),
                "quality_passed": quality.passed,
                "failed": quality.failed_errors,
            }
            print(_RESULT + json.dumps({"steps": steps, "facts": facts}), flush=True)
    finally:
        spark.stop()


class Worker:
    """The parent's handle on a worker process."""

    def __init__(self, work: Path) -> None:
        self.started = time.perf_counter()
        env = os.environ | {"PYTHONPATH": str(Path.cwd())}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.small_run", "--worker", str(work)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )

    def round(self) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith(_RESULT):
                result: dict[str, Any] = json.loads(line[len(_RESULT) :])
                return result
            sys.stdout.write(line)
        raise RuntimeError(f"the worker ended ({self.proc.wait()}) without a result")

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("quit\n")
        self.proc.stdin.close()
        if self.proc.wait(timeout=120):
            raise RuntimeError(f"the worker failed ({self.proc.returncode})")


# --- the parent: the producer and the agent ---------------------------------------------------


class Bucket:
    """The test producer on a loop of its own thread, and the capture agent's settings."""

    def __init__(self, work: Path, docs: int) -> None:
        from dcp_cdc.simulator import SimConfig

        self.sim = SimConfig(scenario="mixed", seed=1, bucket=BUCKET, vbuckets=64, docs=docs, ops=0)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.landing = work / "landing"
        self.server: Any = None
        self.settings: Any = None
        self.workloads = 0

    def _run(self, coro: Any) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout=600)

    def start(self) -> None:
        from dcp_cdc.agent.settings import CaptureSettings
        from dcp_cdc.config.capture import CAPTURE_DIR
        from dcp_cdc.simulator.server import ProducerServer

        user, password = "dcp-cdc-bench", secrets.token_urlsafe(18)

        async def start() -> Any:
            server = ProducerServer(self.sim, nodes=1, users={user: password})
            await server.start()
            return server

        self.server = self._run(start())
        self.settings = CaptureSettings(
            connection_string=self.server.connection_string,
            bucket=BUCKET,
            username=user,
            password=password,
            landing=self.landing,
            staging=self.landing / CAPTURE_DIR,
            state_dir=self.landing / CAPTURE_DIR,
            rotate_bytes=1 << 30,
            rotate_seconds=3600,
        )

    def workload(self, ops: int) -> None:
        self._run(self.server.run_workload(ops, batch=500, manifest=self.workloads == 0))
        self.workloads += 1

    def capture(self) -> tuple[int, int]:
        """Capture up to now; the new files and their bytes."""
        from dcp_cdc.agent.driver import capture

        summary = self._run(capture(self.settings, mode="until-now"))
        return len(summary.files), summary.bytes_captured

    def stop(self) -> None:
        self._run(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.small_run", description=__doc__)
    parser.add_argument("--docs", type=int, default=3000, help="documents of the initial load")
    parser.add_argument("--ops", type=int, default=3000, help="live changes per hour")
    parser.add_argument("--rounds", type=int, default=3, help="warm hours after the fresh one")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return
    work = DATA
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    bucket = Bucket(work, args.docs)
    rows: list[tuple[str, dict[str, Any], dict[str, Any]]] = []
    try:
        bucket.start()
        files, nbytes = bucket.capture()
        print(f"  initial load captured: {files} file(s), {nbytes:,} bytes", flush=True)
        setup = Worker(work)
        rows.append(("set-up: initial load (fresh)", *_split(setup.round())))
        setup.close()

        bucket.workload(args.ops)
        files, nbytes = bucket.capture()
        print(f"  hour 1 captured: {files} file(s), {nbytes:,} bytes", flush=True)
        # kept for profiling: ``--worker`` on a copy of it runs hour 1 again
        shutil.rmtree(HOUR1, ignore_errors=True)
        shutil.copytree(work, HOUR1)
        hourly = Worker(work)
        result = hourly.round()
        all_in = time.perf_counter() - hourly.started
        steps, facts = _split(result)
        facts["all in"] = all_in
        rows.append(("hour 1: fresh process", steps, facts))
        for hour in range(2, args.rounds + 2):
            bucket.workload(args.ops)
            files, nbytes = bucket.capture()
            print(f"  hour {hour} captured: {files} file(s), {nbytes:,} bytes", flush=True)
            rows.append((f"hour {hour}: warm session", *_split(hourly.round())))
        hourly.close()
    finally:
        bucket.stop()
    _report(rows, vars(args) | {"vbuckets": 64, "nodes": 1})


def _split(result: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    return result["steps"], result["facts"]


def _report(rows: list[tuple[str, dict[str, Any], dict[str, Any]]], params: dict[str, Any]) -> None:
    names = ["python", "spark start", "ingest", "apply", "check"]
    print(f"\n  {'run':<30}" + "".join(f"{n:>13}" for n in names) + f"{'i+a':>8}{'all in':>9}")
    for label, steps, facts in rows:
        cells = "".join(f"{steps[n]:>13.1f}" if n in steps else f"{'':>13}" for n in names)
        all_in = facts.get("all in")
        print(
            f"  {label:<30}{cells}{steps['ingest'] + steps['apply']:>8.1f}"
            f"{'' if all_in is None else f'{all_in:.1f}':>9}"
            f"   {facts['frames']:,} frames, {facts['changes']:,} changes, "
            f"quality {'passed' if facts['quality_passed'] else facts['failed']}"
        )
    cases = []
    warm = [r for r in rows if "warm" in r[0]]
    fresh = next(r for r in rows if "fresh process" in r[0])
    frames = fresh[2]["frames"]
    cases.append(
        Case(
            "fresh: all in (process start → check)",
            frames,
            "frames",
            [fresh[2]["all in"]],
            baseline=True,
            extra=fresh[1] | fresh[2],
        )
    )
    for step in ("ingest", "apply", "check"):
        cases.append(Case(f"fresh: {step}", frames, "frames", [fresh[1][step]]))
    if warm:
        cases.append(
            Case(
                "warm: ingest + apply",
                frames,
                "frames",
                [r[1]["ingest"] + r[1]["apply"] for r in warm],
            )
        )
        for step in ("ingest", "apply", "check"):
            cases.append(Case(f"warm: {step}", frames, "frames", [r[1][step] for r in warm]))
    setup = rows[0]
    cases.append(
        Case(
            "set-up: ingest + apply + check",
            setup[2]["frames"],
            "frames",
            [sum(setup[1][s] for s in ("ingest", "apply", "check"))],
            extra=setup[1] | setup[2],
        )
    )
    report("small_run", cases, params=params)
    if not all(r[2]["quality_passed"] for r in rows):
        raise SystemExit("a quality check failed")


if __name__ == "__main__":
    main()
