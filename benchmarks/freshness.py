"""Freshness of follow mode: the time from a change sent by the cluster to its row in silver.

``make bench ARGS=freshness`` runs, for each rate (changes a second), in a process of its own:
follow mode (:class:`pipelines.follow.loop.Follower`: micro-batches of ingest and apply in one
Spark session, the capture agent in its child process) and a probe; the test DCP producer
(``python -m dcp_cdc.simulator.server``, 2 data nodes on 127.0.0.1; ``--vbuckets``, default
1,024 as Couchbase's, and ``--collections`` user collections beside ``_default``, default 4)
runs in a process of its own too, so that its work is not the measured process's. Its control port
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
its JVM, the agent's process and the producer's, and the machine's load average, sampled every
5 s (first, last, max of the measured period).

``--peer`` runs each rate a second time, after ours, with the same producer settings and
durations: the agent and follow mode's ingest fill bronze as before, its apply switched off,
and a peer applies bronze instead, Delta's upsert-from-streaming pattern (Structured Streaming
from the events table, ``foreachBatch`` MERGE per collection: :mod:`benchmarks.freshness_peer`),
probed and checked against the truth the same way. Both print in one table and go into one
results file, with our p95 over the peer's.
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
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from benchmarks import eventlog
from benchmarks.common import RESULTS, machine

DATA = Path(__file__).resolve().parent / ".data" / "freshness"
BUCKET = "fresh"
VBUCKETS = 1024
"""Couchbase's default on Linux."""
COLLECTIONS = 4


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
    ``changes``): each vbucket's ticks up to the seqno silver shows, once. Another side
    (the peer) says what ends its batches (:meth:`batches`) and which tables show its rows
    (:meth:`tables`): they need ``_vbucket`` and ``_seqno`` columns."""

    def __init__(self, silver: Path, ticks: Ticks, period: float) -> None:
        self.silver, self.ticks, self.period = silver, ticks, period
        self.samples: list[tuple[float, float, int]] = []  # (sent at, latency, changes)
        self.next_tick: dict[int, int] = {}
        self.base: list[int] | None = None
        self.state_version = -1
        self.queries: list[float] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def batches(self) -> list[tuple[int, float]]:
        """The commits that end a batch, (version, time): silver's stream state's (an apply
        commits it after every MERGE of the batch)."""
        return _versions(self.silver / f"{BUCKET}__stream_state")

    def tables(self) -> list[Path]:
        """The tables whose rows show what a batch applied: the ``_all`` tables and the
        live layer's pending table."""
        return [*self.silver.glob(f"{BUCKET}__*_all"), self.silver / f"{BUCKET}__pending"]

    def visible(self) -> tuple[float, dict[int, int]] | None:
        """When the newest batch became visible, and its seqno per vbucket."""
        state = self.batches()
        if not state or state[-1][0] == self.state_version:
            return None
        self.state_version, state_at = state[-1]
        chosen = []
        for table in sorted(t for t in self.tables() if t.exists()):
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

    def __init__(self, work: Path, vbuckets: int, collections: int) -> None:
        self.work = work
        ports = work / "ports.json"
        self.ticks = work / "ticks.jsonl"
        command = [sys.executable, "-m", "dcp_cdc.simulator.server", "--nodes", "2"]
        command += ["--vbuckets", str(vbuckets), "--collections", str(collections)]
        command += ["--scenario", "mixed", "--seed", "1"]
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


class Side(ABC):
    """What turns bronze into the tables measured: ours (:class:`Silver`, follow mode's
    ingest and apply) or the peer (:class:`benchmarks.freshness_peer.Peer`), in the Spark
    session ``spark`` with the configuration ``config``."""

    name: str

    def __init__(self, spark: Any, config: Any) -> None:
        self.spark, self.config = spark, config

    @abstractmethod
    def loop(self) -> type[Any]:
        """The class of this side's follow-mode loop: :class:`pipelines.follow.loop.Follower`
        or one of its subclasses."""

    def follower(
        self,
        captures: dict[str, Any],
        stop: threading.Event,
        out: TextIO,
        on_batch: Callable[[Any, Any], None],
    ) -> Any:
        """The follow-mode loop of this side (a :meth:`loop`) over the configuration's
        buckets."""
        return self.loop()(
            self.spark,
            self.config,
            self.config.buckets,
            out,
            stop,
            captures=captures,
            on_batch=on_batch,
        )

    def started(self) -> None:
        """Called at the first micro-batch, before the workload starts."""
        return None

    @abstractmethod
    def probe(self, ticks: Ticks, period: float) -> Probe: ...

    @abstractmethod
    def finish(self) -> None:
        """After the workload halted and follow mode stopped: the last changes applied."""

    @abstractmethod
    def live_rows(self) -> dict[tuple[int, str], int]:
        """(collection id, key) -> seqno of every live document the side's tables show."""

    @abstractmethod
    def figures(self, batches: list[dict[str, Any]]) -> dict[str, Any]:
        """The side's batch figures; ``batches``: follow mode's micro-batches after the
        first (frames, ingest and apply seconds)."""

    def close(self) -> None:
        return None


class Silver(Side):
    """Our side: follow mode, each micro-batch an ingest and an apply."""

    name = "ours"

    def loop(self) -> type[Any]:
        from pipelines.follow.loop import Follower

        return Follower

    def probe(self, ticks: Ticks, period: float) -> Probe:
        return Probe(Path(self.config.warehouse) / "silver.db", ticks, period)

    def finish(self) -> None:
        from pipelines.bronze.job import ingest_bucket
        from pipelines.silver.job import apply_bucket

        ingest_bucket(self.spark, self.config, self.config.buckets[0])
        apply_bucket(self.spark, self.config, self.config.buckets[0])

    def live_rows(self) -> dict[tuple[int, str], int]:
        from pipelines.silver.live import current_rows
        from pipelines.silver.registry import read_registry

        silver = {}
        for reg in read_registry(self.spark, BUCKET):
            if reg["status"] == "retired":
                continue
            for r in (
                current_rows(self.spark, BUCKET, reg["table_name"], reg["collection_id"])
                .where("NOT _deleted")
                .select("_collection_id", "key", "_seqno")
                .collect()
            ):
                silver[(r["_collection_id"], r["key"])] = r["_seqno"]
        return silver

    def figures(self, batches: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "batches": len(batches),
            "batch_s_median": median([b["ingest_s"] + b["apply_s"] for b in batches]),
            "ingest_s_median": median([b["ingest_s"] for b in batches]),
            "apply_s_median": median([b["apply_s"] for b in batches]),
            "frames_per_batch_median": median([b["frames"] for b in batches]),
        }


def run_one(
    rate: float,
    seconds: float,
    warmup: float,
    probe_s: float,
    *,
    live_layer: bool = True,
    peer: bool = False,
    vbuckets: int = VBUCKETS,
    collections: int = COLLECTIONS,
    event_log: bool = False,
) -> dict[str, Any]:
    """One rate, ours or (``peer``) the peer's side, with a producer and Spark of its own."""
    from dcp_cdc.agent.settings import CaptureSettings
    from dcp_cdc.config import AppConfig, BucketConfig, SilverConfig, SparkConfig
    from pipelines.lake.spark_session import session_for

    work = DATA / f"rate{int(rate)}-{vbuckets}vb-{collections}c{'-peer' if peer else ''}"
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
        spark=SparkConfig(conf=eventlog.conf(work / "spark-events") if event_log else {}),
    )
    producer = Producer(work, vbuckets, collections)
    side: Side | None = None
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
        if peer:
            from benchmarks.freshness_peer import Peer

            side = Peer(spark, config, work)
        else:
            side = Silver(spark, config)
        figures = _measure(side, config, settings, producer, jvm, rate, seconds, warmup, probe_s)
        return {"side": side.name, "vbuckets": vbuckets, "collections": collections} | figures
    finally:
        if side is not None:
            side.close()
        producer.close()


def _measure(
    side: Side,
    config: Any,
    settings: Any,
    producer: Producer,
    jvm: int | None,
    rate: float,
    seconds: float,
    warmup: float,
    probe_s: float,
) -> dict[str, Any]:
    from pipelines.follow.progress import Batch, BucketProgress

    stop = threading.Event()
    batches: list[dict[str, Any]] = []
    began = threading.Event()

    def on_batch(batch: Batch, progress: BucketProgress) -> None:
        if not began.is_set():  # the initial load is in: the workload starts now
            side.started()
            producer.ask(f"steady {int(rate)}")
            began.set()
            return
        batches.append(
            {"frames": batch.frames, "ingest_s": batch.ingest_s, "apply_s": batch.apply_s}
        )

    log = open(producer.work / "follow.log", "w", encoding="utf-8")  # noqa: SIM115
    follower = side.follower({BUCKET: settings}, stop, log, on_batch)
    ticks = Ticks(producer.ticks)
    probe = side.probe(ticks, probe_s)
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
            sample = (rss_mb(p) if p else 0.0 for p in pids)
            memory.append((time.time() - t0, *sample, os.getloadavg()[0]))
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
    side.finish()
    probe.once()
    truth_dir = Path(producer.ask("truth")).parent
    equal, detail = _compare(side.live_rows(), _truth(truth_dir))
    measured = [(lat, n) for at, lat, n in probe.samples if at - t0 >= warmup]
    highs = ticks.highs
    never = sum(
        highs[-1][vb] - highs[probe.next_tick.get(vb, 1) - 1][vb] for vb in range(len(highs[-1]))
    )
    tail = [m for m in memory if m[0] >= warmup]

    def spread(i: int, digits: int | None = None) -> list[float]:  # first, last, max
        values = (tail[0][i], tail[-1][i], max(m[i] for m in tail)) if tail else ()
        return [round(v, digits) for v in values]

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
        **side.figures(batches),
        "probe_query_s_median": median(probe.queries),
        "rss_python_mb": spread(1),
        "rss_jvm_mb": spread(2),
        "rss_agent_mb": spread(3),
        "rss_producer_mb": spread(4),
        "load_average_1m": spread(5, 1),
        "equals_truth": equal,
        "truth_detail": detail,
    }


def median(values: list[float]) -> float:
    import statistics

    return statistics.median(values) if values else float("nan")


def _truth(truth_dir: Path) -> dict[tuple[int, str], int]:
    """(collection id, key) -> seqno of every live document of the producer's truth."""
    import base64

    truth = {}
    for line in (truth_dir / "documents.jsonl").read_text().splitlines():
        d = json.loads(line)
        key = d["key"] if "key" in d else base64.b64decode(d["key_b64"]).decode("utf-8", "replace")
        truth[(d["collection_id"], key)] = d["seqno"]
    return truth


def _compare(
    found: dict[tuple[int, str], int], truth: dict[tuple[int, str], int]
) -> tuple[bool, str]:
    """Every live document of the truth found at its seqno, and nothing else."""
    if found == truth:
        return True, f"{len(truth)} live documents"
    missing = sorted(set(truth) - set(found))[:3]
    extra = sorted(set(found) - set(truth))[:3]
    wrong = [k for k in truth if k in found and found[k] != truth[k]][:3]
    return False, f"missing {missing}, extra {extra}, other seqno {wrong}"


def _run_side(args: argparse.Namespace, rate: float, *, peer: bool) -> dict[str, Any] | None:
    """One rate of one side in a process of its own (its own JVM); None if it failed."""
    command = [sys.executable, "-m", "benchmarks.freshness", "--one", str(rate)]
    command += ["--seconds", str(args.seconds), "--warmup-s", str(args.warmup_s)]
    command += ["--probe-s", str(args.probe_s)]
    command += ["--vbuckets", str(args.vbuckets), "--collections", str(args.collections)]
    command += ["--event-log"] if args.event_log else []
    command += ["--merges"] if args.merges else []
    command += ["--peer"] if peer else []
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    if done.returncode or not lines:
        print(done.stdout[-3000:] + done.stderr[-5000:], file=sys.stderr)
        return None
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return result


def _row(r: dict[str, Any]) -> str:
    verdict = "equal" if r["equals_truth"] else "DIFFERS: " + r["truth_detail"]
    return (
        f"{r['rate']:>8g} {r['vbuckets']:>5} {r['collections']:>5} {r['side']:>5} "
        f"{r['freshness_p50_s']:>7.1f} "
        f"{r['freshness_p95_s']:>7.1f} {r['freshness_max_s']:>7.1f} "
        f"{r['batch_s_median']:>8.1f} {r['batches']:>8} {r['ingest_s_median']:>9.1f} "
        f"{'/'.join(map(str, r['rss_python_mb'])):>28} "
        f"{'/'.join(map(str, r['rss_jvm_mb'])):>18} "
        f"{max(r['load_average_1m'], default=float('nan')):>9.1f} {verdict}"
    )


def print_table(results: list[dict[str, Any]]) -> None:
    """Each rate's row, the peer's under ours, then our p95 over the peer's."""
    print(
        f"{'rate/s':>8} {'vb':>5} {'colls':>5} {'side':>5} {'p50 s':>7} {'p95 s':>7} {'max s':>7} {'batch s':>8} "
        f"{'batches':>8} {'ingest s':>9} {'py RSS MB (first/last/max)':>28} "
        f"{'JVM RSS MB':>18} {'load max':>9} truth"
    )
    for r in results:
        print(_row(r))
        if "peer" in r:
            print(_row(r["peer"]))
    peers = [r for r in results if "peer" in r]
    if peers:
        print(
            "batch s: ours, a micro-batch's ingest and apply; the peer's, its streaming "
            "micro-batch (follow mode's ingest runs beside it); medians"
        )
    for r in peers:
        print(
            f"{r['rate']:g} changes/s: our p95 is {r['p95_to_peer']:.2f} × the peer's "
            f"({'within' if r['p95_to_peer'] <= 0.5 else 'above'} 0.5 ×)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="1000,5000", help="changes a second, comma-separated")
    parser.add_argument("--seconds", type=float, default=600.0, help="how long each rate runs")
    parser.add_argument("--warmup-s", type=float, default=60.0)
    parser.add_argument("--probe-s", type=float, default=0.2, help="how often the probe looks")
    parser.add_argument(
        "--merges",
        action="store_true",
        help="apply with a MERGE per collection ([silver] live_layer = false), not through "
        "the live layer",
    )
    parser.add_argument(
        "--peer",
        action="store_true",
        help="after ours, each rate again with the peer (benchmarks/freshness_peer.py): "
        "Structured Streaming from bronze, foreachBatch MERGE per collection",
    )
    parser.add_argument(
        "--vbuckets", type=int, default=VBUCKETS, help="the bucket's vbuckets (1,024: Couchbase's)"
    )
    parser.add_argument(
        "--collections",
        type=int,
        default=COLLECTIONS,
        help="user collections the workload changes, beside _default (up to 64)",
    )
    parser.add_argument(
        "--event-log",
        action="store_true",
        help="keep Spark's event log in the run's folder (benchmarks/eventlog.py reads it)",
    )
    parser.add_argument("--one", type=float, help=argparse.SUPPRESS)  # a rate, in this process
    args = parser.parse_args(argv)
    if args.one is not None:
        result = run_one(
            args.one,
            args.seconds,
            args.warmup_s,
            args.probe_s,
            live_layer=not args.merges,
            peer=args.peer,
            vbuckets=args.vbuckets,
            collections=args.collections,
            event_log=args.event_log,
        )
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    results = []
    for rate in [float(r) for r in args.rates.split(",")]:
        print(f"-- {rate:g} changes/s for {args.seconds:g} s", flush=True)
        ours = _run_side(args, rate, peer=False)
        if ours is None:
            return 1
        if args.peer:
            print(f"-- {rate:g} changes/s for {args.seconds:g} s, the peer", flush=True)
            peer = _run_side(args, rate, peer=True)
            if peer is None:
                return 1
            ours["peer"] = peer
            ours["p95_to_peer"] = ours["freshness_p95_s"] / (peer["freshness_p95_s"] or 1e-9)
        results.append(ours)
    print_table(results)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "freshness.json"
    out.write_text(json.dumps({"machine": machine(), "results": results}, indent=1) + "\n")
    print(f"results in {out}")
    return 0 if all(r["equals_truth"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
