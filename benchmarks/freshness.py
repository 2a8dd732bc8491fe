"""Freshness of follow mode: the time from a change sent by the cluster to its row in silver.

``make bench ARGS=freshness`` runs, for each rate (changes a second), in a process of its own:
follow mode (:class:`pipelines.follow.loop.Follower`: micro-batches of ingest and apply in one
Spark session, the capture agent in its child process) and a probe; the test DCP producer
(``python -m dcp_cdc.simulator.server``, 2 data nodes on 127.0.0.1, 64 vbuckets) runs in a
process of its own too, so that its work is not the measured process's. Its control port
starts a steady workload once the initial load is in silver (``steady RATE``): every 20 ms
the changes due, and a line in its ticks file with the send time and the high seqno of every
vbucket.

The probe costs nothing between micro-batches and little at them: it watches the Delta log of
silver's stream state, which apply commits after every MERGE of the batch. For each new
version it reads the ``_all`` tables under the views (so that deletions count too) as of the
newest version each had by then, per vbucket the highest seqno, with delta-rs (the
``deltalake`` package) rather than Spark, so that its queries do not take the batches' cores. A change is visible once its vbucket's seqno in
silver reaches it; its freshness is the commit time of the newest of those table versions
(the moment silver showed it) minus its send time.

At the end the workload halts, a last micro-batch runs, and silver must equal the producer's
truth (every live key at its seqno). Reported: freshness p50/p95/max over the changes of the
measured period (after ``--warmup-s``), micro-batch seconds, and the RSS of the follow process,
its JVM, the agent's process and the producer's, sampled every 5 s (first, last, max of the
measured period).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.common import RESULTS, machine

DATA = Path(__file__).resolve().parent / ".data" / "freshness"
BUCKET = "fresh"
VBUCKETS = 64


class Ticks:
    """The producer's ticks (send time, high seqno per vbucket), read from its ticks file as
    they are appended."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.times: list[float] = []
        self.highs: list[list[int]] = []
        self._offset = 0
        self._partial = b""

    def read(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as f:
            f.seek(self._offset)
            data = f.read()
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        for line in lines:
            at, highs = json.loads(line)
            self.times.append(at)
            self.highs.append(highs)


def _versions(table: Path) -> list[tuple[int, float]]:
    """A Delta table's versions and their commit times (the commit file's mtime)."""
    found = []
    for commit in (table / "_delta_log").glob("*.json"):
        if commit.stem.isdigit():
            found.append((int(commit.stem), commit.stat().st_mtime))
    return sorted(found)


class Probe:
    """Turns each stream-state commit of silver into freshness samples (``latency``,
    ``changes``): each vbucket's ticks up to the seqno silver shows, once."""

    def __init__(self, silver: Path, ticks: Ticks, period: float) -> None:
        self.silver, self.ticks, self.period = silver, ticks, period
        self.samples: list[tuple[float, float, int]] = []  # (sent at, latency, changes)
        self.next_tick: dict[int, int] = {}
        self.base: list[int] | None = None
        self.state_version = -1
        self.queries: list[float] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def visible(self) -> tuple[float, dict[int, int]] | None:
        """When silver's newest applied state became visible, and its seqno per vbucket."""
        state = _versions(self.silver / f"{BUCKET}__stream_state")
        if not state or state[-1][0] == self.state_version:
            return None
        self.state_version, state_at = state[-1]
        chosen = []
        tables = [*self.silver.glob(f"{BUCKET}__*_all"), self.silver / f"{BUCKET}__pending"]
        for table in sorted(t for t in tables if t.exists()):  # the live layer's too
            before = [(v, t) for v, t in _versions(table) if t <= state_at]
            if before:
                chosen.append((table, *before[-1]))
        if not chosen:
            return None
        import pyarrow as pa
        from deltalake import DeltaTable, QueryBuilder

        started = time.perf_counter()
        tops: dict[int, int] = {}
        for t, v, _ in chosen:  # delta-rs's SQL reader: silver has deletion vectors
            query = QueryBuilder().register("t", DeltaTable(str(t), version=v))
            result = query.execute("SELECT _vbucket, max(_seqno) AS s FROM t GROUP BY _vbucket")
            for r in pa.table(result.read_all()).to_pylist():
                tops[r["_vbucket"]] = max(tops.get(r["_vbucket"], 0), r["s"])
        self.queries.append(time.perf_counter() - started)
        return max(at for _, _, at in chosen), tops

    def once(self) -> None:
        seen = self.visible()
        self.ticks.read()
        times, highs = self.ticks.times, self.ticks.highs
        if seen is None or not highs:
            return
        at, tops = seen
        if self.base is None:
            self.base = highs[0]  # the initial load: not part of the stream measured
            self.next_tick = {vb: 1 for vb in range(len(self.base))}
        for vb, top in tops.items():
            i = self.next_tick.get(vb, 1)
            while i < len(highs) and highs[i][vb] <= top:
                changes = highs[i][vb] - highs[i - 1][vb]
                if changes:
                    self.samples.append((times[i], at - times[i], changes))
                i += 1
            self.next_tick[vb] = i

    def run(self) -> None:
        try:
            while not self.stop.wait(self.period):
                self.once()
        except BaseException as exc:
            self.error = exc


class Producer:
    """The test producer in a process of its own, driven through its control port."""

    def __init__(self, work: Path) -> None:
        self.work = work
        ports = work / "ports.json"
        self.ticks = work / "ticks.jsonl"
        command = [sys.executable, "-m", "dcp_cdc.simulator.server", "--nodes", "2"]
        command += ["--vbuckets", str(VBUCKETS), "--scenario", "mixed", "--seed", "1"]
        command += ["--docs", "2000", "--ops", "0", "--bucket", BUCKET]
        command += ["--port-file", str(ports), "--truth-out", str(work / "producer")]
        command += ["--ticks-out", str(self.ticks)]
        self.log = (work / "producer.log").open("w", encoding="utf-8")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while not ports.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the test producer did not start: see {self.log.name}")
            time.sleep(0.1)
        self.info = json.loads(ports.read_text())
        self._control = socket.create_connection(("127.0.0.1", self.info["control_port"]))
        self._io = self._control.makefile("rw", encoding="utf-8")
        self._lock = threading.Lock()

    def ask(self, line: str) -> str:
        with self._lock:
            self._io.write(line + "\n")
            self._io.flush()
            answer = self._io.readline().strip()
        if not answer.startswith("ok"):
            raise RuntimeError(f"the test producer answered {line!r} with {answer!r}")
        return answer[3:]

    def close(self) -> None:
        self._control.close()
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(60)
        self.log.close()


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


def _pid_of(match: str) -> int | None:
    """A child process of this one whose command line has ``match`` (the JVM, the agent)."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            if match in " ".join(child.cmdline()):
                return int(child.pid)
        except psutil.Error:
            continue
    return None


def run_one(
    rate: float, seconds: float, warmup: float, probe_s: float, *, live_layer: bool = False
) -> dict[str, Any]:
    from dcp_cdc.agent.settings import CaptureSettings
    from dcp_cdc.config import AppConfig, BucketConfig, SilverConfig
    from pipelines.spark_session import session_for

    work = DATA / f"rate{int(rate)}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    logging.basicConfig(  # the runs' summaries, each step's seconds among them
        filename=work / "pipeline.log",
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    config = AppConfig(
        landing=str(work / "landing"),
        warehouse=str(work / "warehouse"),
        buckets=[BucketConfig(name=BUCKET)],
        silver=SilverConfig(live_layer=live_layer),
    )
    producer = Producer(work)
    try:
        settings = CaptureSettings.into(
            work / "landing",
            connection_string=producer.info["connection_string"],
            bucket=BUCKET,
            username="Administrator",  # the test producer's own user
            password="password",
            rotate_bytes=64 << 20,
            rotate_seconds=config.follow.rotate_seconds,
        )
        spark = session_for(config, "dcp-cdc-bench-freshness")
        jvm = _pid_of("org.apache.spark.deploy.SparkSubmit")
        return _measure(spark, config, settings, producer, jvm, rate, seconds, warmup, probe_s)
    finally:
        producer.close()


def _measure(
    spark: Any,
    config: Any,
    settings: Any,
    producer: Producer,
    jvm: int | None,
    rate: float,
    seconds: float,
    warmup: float,
    probe_s: float,
) -> dict[str, Any]:
    from pipelines.bronze.job import ingest_bucket
    from pipelines.follow.loop import Follower
    from pipelines.follow.progress import Batch, BucketProgress
    from pipelines.silver.job import apply_bucket

    stop = threading.Event()
    batches: list[dict[str, Any]] = []
    began = threading.Event()

    def on_batch(batch: Batch, progress: BucketProgress) -> None:
        if not began.is_set():  # the initial load is in silver: the workload starts now
            producer.ask(f"steady {int(rate)}")
            began.set()
            return
        batches.append(
            {"frames": batch.frames, "ingest_s": batch.ingest_s, "apply_s": batch.apply_s}
        )

    log = open(producer.work / "follow.log", "w", encoding="utf-8")  # noqa: SIM115
    follower = Follower(
        spark,
        config,
        config.buckets,
        log,
        stop,
        captures={BUCKET: settings},
        on_batch=on_batch,
    )
    ticks = Ticks(producer.ticks)
    probe = Probe(Path(config.warehouse) / "silver.db", ticks, probe_s)
    memory: list[tuple[float, ...]] = []
    t0 = time.time()

    def watch() -> None:
        while not began.wait(1.0):
            if stop.is_set():
                return
        nonlocal t0
        t0 = time.time()
        agent = _pid_of("spawn_main")
        probe_thread = threading.Thread(target=probe.run, daemon=True)
        probe_thread.start()
        pids = (os.getpid(), jvm, agent, producer.process.pid)
        while not stop.wait(5.0):
            memory.append((time.time() - t0, *(rss_mb(p) if p else 0.0 for p in pids)))
            if time.time() - t0 >= seconds:
                producer.ask("halt")
                time.sleep(3 * config.follow.rotate_seconds + 2 * config.follow.interval_s)
                probe.stop.set()
                probe_thread.join()
                stop.set()
        probe.stop.set()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    follower.run()  # until the watcher stops it; the agent's last files land
    watcher.join()
    if probe.error is not None:
        raise probe.error
    ingest_bucket(spark, config, config.buckets[0])
    apply_bucket(spark, config, config.buckets[0])
    probe.once()
    truth_dir = Path(producer.ask("truth")).parent
    equal, detail = _compare(spark, truth_dir)
    measured = [(lat, n) for at, lat, n in probe.samples if at - t0 >= warmup]
    highs = ticks.highs
    never = sum(highs[-1][vb] - highs[probe.next_tick.get(vb, 1) - 1][vb] for vb in range(VBUCKETS))
    tail = [m for m in memory if m[0] >= warmup]

    def rss(i: int) -> list[int]:
        return [round(tail[0][i]), round(tail[-1][i]), round(max(m[i] for m in tail))]

    return {
        "rate": rate,
        "seconds": seconds,
        "warmup_s": warmup,
        "changes_sent": sum(highs[-1]) - sum(highs[0]),
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
        "rss_python_mb": rss(1) if tail else [],
        "rss_jvm_mb": rss(2) if tail else [],
        "rss_agent_mb": rss(3) if tail else [],
        "rss_producer_mb": rss(4) if tail else [],
        "silver_equals_truth": equal,
        "truth_detail": detail,
    }


def _median(values: list[float]) -> float:
    import statistics

    return statistics.median(values) if values else float("nan")


def _compare(spark: Any, truth_dir: Path) -> tuple[bool, str]:
    """Every live document of the truth in silver at its seqno, and nothing else."""
    import base64

    from pipelines.silver.live import current_rows
    from pipelines.silver.registry import read_registry

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
            current_rows(spark, BUCKET, reg["table_name"], reg["collection_id"])
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
    parser.add_argument("--probe-s", type=float, default=0.2, help="how often the probe looks")
    parser.add_argument(
        "--live-layer",
        action="store_true",
        help="apply through the live layer ([silver] live_layer)",
    )
    parser.add_argument("--one", type=float, help=argparse.SUPPRESS)  # a rate, in this process
    args = parser.parse_args(argv)
    if args.one is not None:
        result = run_one(
            args.one, args.seconds, args.warmup_s, args.probe_s, live_layer=args.live_layer
        )
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    results = []
    for rate in [float(r) for r in args.rates.split(",")]:
        print(f"-- {rate:g} changes/s for {args.seconds:g} s", flush=True)
        command = [sys.executable, "-m", "benchmarks.freshness", "--one", str(rate)]
        command += ["--seconds", str(args.seconds), "--warmup-s", str(args.warmup_s)]
        command += ["--live-layer"] if args.live_layer else []
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
