"""``kill -9`` trials of follow mode: kill a follow run (its Spark driver, JVM and capture agent:
the whole process group) at a random instant while the cluster changes, restart it, and check
that silver equals the cluster's truth once the restarted run has caught up.

    python -m benchmarks.follow_kill_trials --trials 20 [--rate 300] [--seed 1]

The test producer (``python -m dcp_cdc.simulator.server``, 2 data nodes, ``--vbuckets`` 64,
the ``mixed`` scenario's initial load in ``--collections`` 4 beside ``_default``) runs in a process of its own for all trials, as in
:mod:`benchmarks.freshness`. Each trial:

1. a steady workload of ``--rate`` changes a second starts;
2. follow mode starts (:class:`pipelines.follow.loop.Follower` with its capture agent, in a
   process group of its own) and is killed with ``SIGKILL`` at a seeded random instant between
   ``--min-s`` and ``--max-s`` after its start: during Spark's start-up, an ingest, an apply,
   the wait between micro-batches or a compaction of the live layer (its thread runs beside
   the micro-batches: a trial says when the kill landed in one);
3. follow mode starts again; after its first micro-batch the workload halts, the restarted run
   takes what the agent still lands, is stopped with ``SIGTERM`` (its batch finishes), runs a
   last ingest and apply, and compares silver with the producer's truth at the halt: every
   live document at its seqno, nothing else.

The next trial goes on from there (the same landing, warehouse and agent checkpoint): kills
accumulate. Prints a line per trial and writes ``benchmarks/results/follow_kill_trials.json``.
Not part of ``make bench`` (about two minutes a trial on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, machine
from benchmarks.freshness import BUCKET, Producer

DATA = Path(__file__).resolve().parent / ".data" / "follow_kill_trials"
TRUTH_FILE = "truth_dir.txt"
"""Where the parent writes the truth's folder for the run it stops (the child compares)."""


def _child(work: Path) -> int:
    """Follow mode until SIGTERM, then a last ingest and apply and, when the parent wrote
    :data:`TRUTH_FILE`, silver compared with that truth (a ``TRUTH`` line)."""
    from benchmarks.freshness import Silver, _compare, _truth
    from dcp_cdc.agent.settings import CaptureSettings
    from dcp_cdc.config import AppConfig, BucketConfig
    from pipelines.bronze.job import ingest_bucket
    from pipelines.follow.loop import Follower
    from pipelines.lake.spark_session import session_for
    from pipelines.silver.job import apply_bucket

    info = json.loads((work / "ports.json").read_text())
    config = AppConfig(
        landing=str(work / "landing"),
        warehouse=str(work / "warehouse"),
        buckets=[BucketConfig(name=BUCKET)],
    )
    settings = CaptureSettings.into(
        work / "landing",
        connection_string=info["connection_string"],
        bucket=BUCKET,
        username="Administrator",  # the test producer's own user
        password="password",
        rotate_bytes=64 << 20,
        rotate_seconds=config.follow.rotate_seconds,
    )
    logging.basicConfig(  # each ingest's and apply's start and summary: where a kill hit
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    spark = session_for(config, "dcp-cdc-bench-follow-kill")
    print("STARTED", flush=True)
    Follower(spark, config, config.buckets, sys.stdout, stop, captures={BUCKET: settings}).run()
    truth = work / TRUTH_FILE
    if truth.exists():
        ingest_bucket(spark, config, config.buckets[0])
        apply_bucket(spark, config, config.buckets[0])
        found = Silver(spark, config).live_rows()  # as users query silver
        equal, detail = _compare(found, _truth(Path(truth.read_text().strip())))
        truth.unlink()
        print("TRUTH " + json.dumps({"equal": equal, "detail": detail}), flush=True)
    return 0


class Run:
    """One follow-mode process (group), its output kept."""

    def __init__(self, work: Path, log: Path) -> None:
        self.log = log.open("w", encoding="utf-8")
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.follow_kill_trials", "--child", str(work)],
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)
            self.log.write(line)
            self.log.flush()

    def batches(self) -> int:
        return sum(1 for x in self.lines if re.search(r": batch \d+", x))

    def wait_for_batches(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.batches() < n:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"follow mode did not reach {n} batches: see {self.log.name}")
            time.sleep(0.5)

    def kill(self) -> None:
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self._reader.join()
        self.log.close()

    def stop(self, timeout: float = 600) -> int:
        """SIGTERM to follow mode's own process (the JVM and the agent are its to stop)."""
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout)
        self._reader.join()
        self.log.close()
        return code


def _compacting(log: Path) -> bool:
    """Whether the run whose log (stderr) is ``log`` was compacting when it ended: a
    compaction it began had not ended (:func:`pipelines.silver.live.compact` logs both)."""
    began = ended = 0
    for n, line in enumerate(log.read_text(errors="replace").splitlines()):
        if "silver: compacting the pending rows" in line:
            began = n + 1
        elif "silver: compacted the pending rows" in line:
            ended = n + 1
    return began > ended


def trial(
    i: int, producer: Producer, work: Path, rate: int, kill_at: float, logs: Path
) -> dict[str, Any]:
    (work / TRUTH_FILE).unlink(missing_ok=True)  # a truth no run compared with is stale
    producer.ask(f"steady {rate}")
    killed = Run(work, logs / f"trial{i:02d}-killed.log")
    time.sleep(kill_at)
    before = killed.batches()
    phase = "start-up" if not any("STARTED" in x for x in killed.lines) else "follow"
    last = [x.strip() for x in killed.lines if re.search(r": batch \d+", x)]
    killed.kill()
    if phase == "follow" and _compacting(logs / f"trial{i:02d}-killed.log"):
        phase = "follow, during a compaction"
    restarted = Run(work, logs / f"trial{i:02d}-restarted.log")
    restarted.wait_for_batches(1, timeout=600)
    producer.ask("halt")
    truth_dir = Path(producer.ask("truth")).parent
    (work / TRUTH_FILE).write_text(str(truth_dir))
    time.sleep(5)  # the agent lands what the producer sent last (follow.rotate_seconds 1)
    restarted.wait_for_batches(restarted.batches() + 1, timeout=600)
    code = restarted.stop()
    found = [x for x in restarted.lines if x.startswith("TRUTH ")]
    result = json.loads(found[-1][len("TRUTH ") :]) if found else {"equal": False}
    return {
        "trial": i,
        "kill_at_s": round(kill_at, 1),
        "killed_in": phase,
        "batches_before_kill": before,
        "last_batch_line": last[-1][:160] if last else None,
        "restart_exit": code,
        "silver_equals_truth": bool(result.get("equal")) and code == 0,
        "detail": result.get("detail", "no TRUTH line: see the restarted run's log"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--rate", type=int, default=300, help="changes a second while killed")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--min-s", type=float, default=5.0, help="earliest kill after start")
    parser.add_argument("--max-s", type=float, default=100.0, help="latest kill after start")
    parser.add_argument("--vbuckets", type=int, default=64)
    parser.add_argument("--collections", type=int, default=4, help="beside _default")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)  # follow mode, here
    args = parser.parse_args(argv)
    if args.child is not None:
        return _child(args.child)
    work = DATA
    shutil.rmtree(work, ignore_errors=True)
    logs = work / "logs"
    logs.mkdir(parents=True)
    rng = random.Random(args.seed)
    producer = Producer(work, args.vbuckets, args.collections)
    results: list[dict[str, Any]] = []
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "follow_kill_trials.json"
    try:
        for i in range(1, args.trials + 1):
            r = trial(i, producer, work, args.rate, rng.uniform(args.min_s, args.max_s), logs)
            results.append(r)  # written after each trial: hours of trials keep what they found
            out.write_text(json.dumps({"machine": machine(), "trials": results}, indent=1) + "\n")
            verdict = "equal" if r["silver_equals_truth"] else "DIFFERS: " + r["detail"]
            print(
                f"trial {i:>2}: killed at {r['kill_at_s']:>5.1f} s ({r['killed_in']}, "
                f"{r['batches_before_kill']} batches done), restarted: {verdict}",
                flush=True,
            )
    finally:
        producer.close()
    ok = sum(r["silver_equals_truth"] for r in results)
    print(f"{ok} of {len(results)} trials equal to the truth; results in {out}")
    return 0 if ok == len(results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
