"""Freshness of follow mode: the time from a change sent by the cluster to its row in silver.

``make bench ARGS=freshness`` runs, for each rate (changes a second), in a process of its own:
the test DCP producer (``dcp_cdc.simulator.server``, 2 data nodes on 127.0.0.1, 64 vbuckets)
making live changes at that rate, each tick's changes stamped with their send time and the
high seqnos they reached; follow mode (:class:`pipelines.follow.Follower`: the capture agent
and micro-batches of ingest and apply in one Spark session); and a probe reading silver every
``--probe-s``: per vbucket the highest seqno in the collection tables. A change is visible
once its vbucket's seqno in silver reaches it; its freshness is the probe's end minus its send
time (an upper bound: the probe's period and query time are in it). The probe reads the
``_all`` tables under the views, so that deletions count as visible too.

At the end the workload stops, a last micro-batch runs, and silver must equal the producer's
truth (every live key at its seqno). Reported: freshness p50/p95/max over the changes of the
measured period (after ``--warmup-s``), micro-batch seconds, and the RSS of the process and its
JVM sampled every 5 s (first, last, max of the measured period).
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
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, machine

DATA = Path(__file__).resolve().parent / ".data" / "freshness"
BUCKET = "fresh"


class Sent:
    """The ticks of the workload: (send time, high seqno per vbucket), appended by the
    producer's thread, read by the probe's."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.highs: list[list[int]] = []
        self.lock = threading.Lock()

    def __call__(self, at: float, highs: list[int]) -> None:
        with self.lock:
            self.times.append(at)
            self.highs.append(highs)


class Probe:
    """Reads silver every ``period`` s and turns what became visible into freshness samples
    (``latency``, ``changes``): each vbucket's ticks up to its visible seqno, once."""

    def __init__(self, spark: Any, sent: Sent, period: float) -> None:
        self.spark, self.sent, self.period = spark, sent, period
        self.samples: list[tuple[float, float, int]] = []  # (sent at, latency, changes)
        self.next_tick: dict[int, int] = {}
        self.base: list[int] | None = None
        self.queries: list[float] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def visible(self) -> dict[int, int]:
        from pipelines import tables
        from pipelines.silver.store import read_registry

        live = [r for r in read_registry(self.spark, BUCKET) if r["status"] != "retired"]
        names = [tables.all_rows(r["table_name"]) for r in live]
        names = [n for n in names if self.spark.catalog.tableExists(n)]
        if not names:
            return {}
        union = " UNION ALL ".join(f"SELECT _vbucket, _seqno FROM {n}" for n in names)
        rows = self.spark.sql(
            f"SELECT _vbucket, max(_seqno) AS s FROM ({union}) GROUP BY _vbucket"
        ).collect()
        return {r["_vbucket"]: r["s"] for r in rows}

    def once(self) -> None:
        started = time.perf_counter()
        seen = self.visible()
        now = time.time()
        self.queries.append(time.perf_counter() - started)
        with self.sent.lock:
            times, highs = self.sent.times, self.sent.highs
        if self.base is None:
            if not highs:
                return
            self.base = highs[0]  # the initial load: not part of the stream measured
            self.next_tick = {vb: 1 for vb in range(len(self.base))}
        for vb, top in seen.items():
            i = self.next_tick.get(vb, 1)
            while i < len(highs) and highs[i][vb] <= top:
                changes = highs[i][vb] - highs[i - 1][vb]
                if changes:
                    self.samples.append((times[i], now - times[i], changes))
                i += 1
            self.next_tick[vb] = i

    def run(self) -> None:
        try:
            while not self.stop.wait(self.period):
                self.once()
        except BaseException as exc:
            self.error = exc


def percentile(samples: list[tuple[float, int]], q: float) -> float:
    """The ``q`` quantile of latencies weighted by their change counts."""
    ordered = sorted(samples)
    total = sum(n for _, n in ordered)
    cumulative = 0
    for latency, n in ordered:
        cumulative += n
        if cumulative >= q * total:
            return latency
    return ordered[-1][0] if ordered else float("nan")


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def jvm_pid() -> int | None:
    import psutil

    for child in psutil.Process().children(recursive=True):
        if "java" in child.name():
            return int(child.pid)
    return None


def run_one(rate: float, seconds: float, warmup: float, probe_s: float) -> dict[str, Any]:
    from dcp_cdc.agent.driver import CaptureSettings
    from dcp_cdc.config import AppConfig, BucketConfig
    from dcp_cdc.simulator import SimConfig
    from dcp_cdc.simulator.server import ProducerServer
    from pipelines.bronze.job import ingest_bucket
    from pipelines.follow import Batch, BucketProgress, Follower, LoopThread
    from pipelines.silver.job import apply_bucket
    from pipelines.spark_session import session_for

    work = DATA / f"rate{int(rate)}"
    shutil.rmtree(work, ignore_errors=True)
    config = AppConfig(
        landing=str(work / "landing"),
        warehouse=str(work / "warehouse"),
        buckets=[BucketConfig(name=BUCKET)],
    )
    sim = SimConfig(scenario="mixed", seed=1, bucket=BUCKET, vbuckets=64, docs=2000, ops=0)
    user, password = "bench", secrets.token_urlsafe(12)
    sent = Sent()
    served: list[ProducerServer] = []
    workload_stop: list[asyncio.Event] = []
    workload_go: list[asyncio.Event] = []
    started = threading.Event()

    async def serve(halt: asyncio.Event) -> None:
        async with ProducerServer(sim, nodes=2, users={user: password}) as server:
            served.append(server)
            workload_stop.append(asyncio.Event())
            workload_go.append(asyncio.Event())
            started.set()
            await workload_go[0].wait()  # the initial load is in silver, its tables made
            await server.steady_workload(rate, workload_stop[0], sent=sent)
            await halt.wait()  # the agent is served until the end

    producer = LoopThread("the test producer", serve)
    producer.start()
    while not started.wait(0.1):
        producer.check()
    landing = work / "landing"
    settings = CaptureSettings.into(
        landing,
        connection_string=served[0].connection_string,
        bucket=BUCKET,
        username=user,
        password=password,
        rotate_bytes=64 << 20,
        rotate_seconds=config.follow.rotate_seconds,
    )
    spark = session_for(config, "dcp-cdc-bench-freshness")
    jvm = jvm_pid()
    stop = threading.Event()
    batches: list[dict[str, Any]] = []
    began = threading.Event()

    def on_batch(batch: Batch, progress: BucketProgress) -> None:
        if not began.is_set():  # the initial load: the workload starts now
            began.set()
            producer.call(workload_go[0].set)
            return
        batches.append(
            {"frames": batch.frames, "ingest_s": batch.ingest_s, "apply_s": batch.apply_s}
        )

    log = open(work / "follow.log", "w", encoding="utf-8")  # noqa: SIM115
    follower = Follower(
        spark,
        config,
        config.buckets,
        log,
        stop,
        captures={BUCKET: settings},
        on_batch=on_batch,
    )
    probe = Probe(spark, sent, probe_s)
    memory: list[tuple[float, float, float]] = []

    def watch() -> None:
        while not began.wait(1.0):
            if stop.is_set():
                return
        nonlocal t0
        t0 = time.time()
        probe_thread = threading.Thread(target=probe.run, daemon=True)
        probe_thread.start()
        while not stop.wait(5.0):
            memory.append((time.time() - t0, rss_mb(os.getpid()), rss_mb(jvm) if jvm else 0.0))
            if time.time() - t0 >= seconds:
                producer.call(workload_stop[0].set)
                time.sleep(3 * config.follow.rotate_seconds + 2 * config.follow.interval_s)
                probe.stop.set()
                probe_thread.join()
                stop.set()
        probe.stop.set()

    t0 = time.time()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    follower.run()  # until the watcher stops it; the agent's last files land
    watcher.join()
    if probe.error is not None:
        raise probe.error
    ingest_bucket(spark, config, config.buckets[0])
    apply_bucket(spark, config, config.buckets[0])
    probe.once()
    server = served[0]
    truth_dir = server.write_truth(work).parent
    producer.stop()
    equal, detail = _compare(spark, truth_dir)
    measured = [(lat, n) for at, lat, n in probe.samples if at - t0 >= warmup]
    never = sum(
        sent.highs[-1][vb] - sent.highs[probe.next_tick.get(vb, 1) - 1][vb] for vb in range(64)
    )
    tail = [m for m in memory if m[0] >= warmup]
    result = {
        "rate": rate,
        "seconds": seconds,
        "warmup_s": warmup,
        "changes_sent": sum(sent.highs[-1]) - sum(sent.highs[0]),
        "changes_measured": sum(n for _, n in measured),
        "changes_never_seen": never,
        "freshness_p50_s": percentile(measured, 0.5),
        "freshness_p95_s": percentile(measured, 0.95),
        "freshness_max_s": max((lat for lat, _ in measured), default=float("nan")),
        "batches": len(batches),
        "batch_s_median": _median([b["ingest_s"] + b["apply_s"] for b in batches]),
        "ingest_s_median": _median([b["ingest_s"] for b in batches]),
        "apply_s_median": _median([b["apply_s"] for b in batches]),
        "frames_per_batch_median": _median([b["frames"] for b in batches]),
        "probe_query_s_median": _median(probe.queries),
        "rss_python_mb": [round(tail[0][1]), round(tail[-1][1]), round(max(m[1] for m in tail))]
        if tail
        else [],
        "rss_jvm_mb": [round(tail[0][2]), round(tail[-1][2]), round(max(m[2] for m in tail))]
        if tail
        else [],
        "silver_equals_truth": equal,
        "truth_detail": detail,
    }
    return result


def _median(values: list[float]) -> float:
    import statistics

    return statistics.median(values) if values else float("nan")


def _compare(spark: Any, truth_dir: Path) -> tuple[bool, str]:
    """Every live document of the truth in silver at its seqno, and nothing else."""
    import base64

    from pipelines import tables
    from pipelines.silver.store import read_registry

    truth = {}
    for line in (truth_dir / "documents.jsonl").read_text().splitlines():
        d = json.loads(line)
        key = d["key"] if "key" in d else base64.b64decode(d["key_b64"]).decode("utf-8", "replace")
        truth[(d["collection_id"], key)] = d["seqno"]
    silver = {}
    for reg in read_registry(spark, BUCKET):
        if reg["status"] == "retired":
            continue
        for r in (
            spark.table(tables.all_rows(reg["table_name"]))
            .where("NOT _deleted")
            .select("_collection_id", "key", "_seqno")
            .collect()
        ):
            silver[(r["_collection_id"], r["key"])] = r["_seqno"]
    if silver == truth:
        return True, f"{len(truth)} live documents"
    missing = sorted(set(truth) - set(silver))[:3]
    extra = sorted(set(silver) - set(truth))[:3]
    wrong = [k for k in truth if k in silver and silver[k] != truth[k]][:3]
    return False, f"missing {missing}, extra {extra}, other seqno {wrong}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="1000,5000", help="changes a second, comma-separated")
    parser.add_argument("--seconds", type=float, default=600.0, help="how long each rate runs")
    parser.add_argument("--warmup-s", type=float, default=60.0)
    parser.add_argument("--probe-s", type=float, default=1.0)
    parser.add_argument("--one", type=float, help=argparse.SUPPRESS)  # a rate, in this process
    args = parser.parse_args(argv)
    if args.one is not None:
        result = run_one(args.one, args.seconds, args.warmup_s, args.probe_s)
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    results = []
    for rate in [float(r) for r in args.rates.split(",")]:
        print(f"-- {rate:g} changes/s for {args.seconds:g} s", flush=True)
        command = [sys.executable, "-m", "benchmarks.freshness", "--one", str(rate)]
        command += ["--seconds", str(args.seconds), "--warmup-s", str(args.warmup_s)]
        done = subprocess.run(
            [*command, "--probe-s", str(args.probe_s)],
            capture_output=True,
            text=True,
            check=False,
        )
        lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
        if done.returncode or not lines:
            print(done.stdout[-3000:] + done.stderr[-5000:], file=sys.stderr)
            return done.returncode or 1
        results.append(json.loads(lines[-1][len("RESULT ") :]))
    print(
        f"{'rate/s':>8} {'p50 s':>7} {'p95 s':>7} {'max s':>7} {'batch s':>8} {'batches':>8} "
        f"{'py RSS MB (first/last/max)':>28} {'JVM RSS MB':>18} truth"
    )
    for r in results:
        print(
            f"{r['rate']:>8g} {r['freshness_p50_s']:>7.1f} {r['freshness_p95_s']:>7.1f} "
            f"{r['freshness_max_s']:>7.1f} {r['batch_s_median']:>8.1f} {r['batches']:>8} "
            f"{'/'.join(map(str, r['rss_python_mb'])):>28} "
            f"{'/'.join(map(str, r['rss_jvm_mb'])):>18} "
            f"{'equal' if r['silver_equals_truth'] else 'DIFFERS: ' + r['truth_detail']}"
        )
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "freshness.json"
    out.write_text(json.dumps({"machine": machine(), "results": results}, indent=1) + "\n")
    print(f"results in {out}")
    return 0 if all(r["silver_equals_truth"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
