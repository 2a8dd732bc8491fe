"""The initial load end to end through the agent: N documents served, captured, ingested,
applied and checked, each stage's seconds, CPU seconds and peak RSS.

The test producer (``python -m dcp_cdc.simulator.server``, 4 nodes, 1,024 vbuckets by
default) serves ``--docs`` bulk documents of ``--shape`` (``realistic``: 0.5-4 KB nested JSON,
Snappy-compressed, ~10 % with XATTRs, ~2 % binary, in four collections of two scopes,
:mod:`dcp_cdc.simulator.realistic`; ``small``: fixed tiny bodies in collection 0) beside
``--sim-docs`` simulated ones, and a light live workload of ``--live-rate`` changes a second
runs during the load. The agent, ``dcp-cdc capture --until now``, captures the load; the
workload then halts and a second ``--until now`` captures its tail (``capture tail``). One
Spark session in this process ingests, applies and checks, as ``dcp-cdc run`` does: the apply
reads the run's frames from the files the ingest wrote.

Per stage: wall seconds, CPU seconds and peak RSS of the agent (its own process, from
``wait4``), or of the driver (this process), its JVM and the JVM's Python workers (sampled
with psutil every 0.2 s: a worker's CPU counts while it is seen). Then the bytes on disk of
landing, bronze and silver; and silver must equal the truth: per collection, the number of
live rows and the sum of their digests (:func:`dcp_cdc.simulator.realistic.row_digest`,
computed by Spark over silver and by Python over the bulk documents' numbers and the
producer's truth of the simulated ones), and the quality check must pass.

    python -m benchmarks.initial_load --docs 100000
    python -m benchmarks.initial_load --docs 2000 --vbuckets 64 --live-rate 50
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from benchmarks.common import Case, report

DATA = Path(__file__).resolve().parent / ".data" / "initial_load"
BUCKET = "initial"
USER, PASSWORD, PASSWORD_ENV = "bench", "bench-password", "DCP_CDC_BENCH_PASSWORD"
BODY_BYTES = 64
"""The body of a ``small`` bulk document."""
SAMPLE_S = 0.2
ROLES = ("driver", "jvm", "workers")


# --- the producer and the agent ----------------------------------------------------------------


class Producer:
    """The test producer in a child process, and its control port."""

    def __init__(self, work: Path, args: argparse.Namespace) -> None:
        self.port_file = work / "producer.json"
        self.truth_out = work / "producer"
        cmd = [sys.executable, "-m", "dcp_cdc.simulator.server", "--bucket", BUCKET]
        cmd += ["--nodes", str(args.nodes), "--vbuckets", str(args.vbuckets)]
        cmd += ["--docs", str(args.sim_docs), "--ops", "0", "--bulk-docs", str(args.docs)]
        cmd += ["--bulk-shape", args.shape, "--body-bytes", str(BODY_BYTES)]
        cmd += ["--users", f"{USER}:{PASSWORD}", "--port-file", str(self.port_file)]
        cmd += ["--truth-out", str(self.truth_out), "--ticks-out", str(work / "ticks.jsonl")]
        self.process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        while not self.port_file.exists():
            if self.process.poll() is not None:
                raise RuntimeError(self.process.stderr.read().decode()[-3000:])  # type: ignore[union-attr]
            time.sleep(0.05)
        self.info: dict[str, Any] = json.loads(self.port_file.read_text())

    def control(self, command: str) -> str:
        with socket.create_connection(("127.0.0.1", self.info["control_port"]), timeout=600) as s:
            s.sendall(command.encode() + b"\n")
            answer = s.makefile("rb").readline().decode().strip()
        if not answer.startswith("ok"):
            raise RuntimeError(f"producer: {command}: {answer}")
        return answer

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=300)


def write_config(work: Path, connection_string: str) -> Path:
    config = work / "capture.toml"
    config.write_text(
        f'landing = "{work / "landing"}"\nwarehouse = "{work / "warehouse"}"\n'
        f'[[buckets]]\nname = "{BUCKET}"\n[buckets.capture]\n'
        f'connection_string = "{connection_string}"\nusername = "{USER}"\n'
        f'password_env = "{PASSWORD_ENV}"\n',
        encoding="utf-8",
    )
    return config


def run_agent(config: Path) -> dict[str, Any]:
    """``dcp-cdc capture --until now``: its seconds, CPU seconds and peak RSS (``wait4``)."""
    env = {**os.environ, PASSWORD_ENV: PASSWORD}
    started = time.perf_counter()
    cmd = [sys.executable, "-m", "pipelines.app.cli", "capture", "--config", str(config)]
    agent = subprocess.Popen(
        [*cmd, "--until", "now"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert agent.stdout is not None
    out = agent.stdout.read()  # until it closes: the agent's end
    _, status, usage = os.wait4(agent.pid, 0)
    agent.returncode = os.waitstatus_to_exitcode(status)
    if agent.returncode:
        raise RuntimeError(f"dcp-cdc capture failed ({agent.returncode}):\n{out[-3000:]}")
    return {
        "seconds": time.perf_counter() - started,
        "cpu_s": {"agent": usage.ru_utime + usage.ru_stime},
        "peak_rss_mb": {"agent": usage.ru_maxrss / 1024},
    }


# --- Spark's processes, sampled ----------------------------------------------------------------


class Sampler(threading.Thread):
    """RSS and CPU seconds of the driver (this process), its JVM and the JVM's Python
    workers, every :data:`SAMPLE_S`; :meth:`stage` measures one stage."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.me = psutil.Process()
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.peak: dict[str, float] = {}
        self.first: dict[int, float] = {}
        self.last: dict[int, tuple[str, float]] = {}

    def _processes(self) -> Iterator[tuple[str, psutil.Process]]:
        yield "driver", self.me
        for child in self.me.children():
            if "java" not in child.name():
                continue
            yield "jvm", child
            for worker in child.children(recursive=True):
                yield "workers", worker

    def sample(self) -> None:
        rss = dict.fromkeys(ROLES, 0.0)
        seen: dict[int, tuple[str, float]] = {}
        for role, proc in self._processes():
            try:
                with proc.oneshot():
                    times = proc.cpu_times()
                    seen[proc.pid] = (role, times.user + times.system)
                    rss[role] += proc.memory_info().rss
            except psutil.Error:
                continue
        with self.lock:
            for pid, (role, cpu) in seen.items():
                self.first.setdefault(pid, cpu if pid in self.last else 0.0)
                self.last[pid] = (role, cpu)
            for role, value in rss.items():
                self.peak[role] = max(self.peak.get(role, 0.0), value)

    def run(self) -> None:
        while not self.done.wait(SAMPLE_S):
            self.sample()

    @contextmanager
    def stage(self, stages: dict[str, dict[str, Any]], name: str) -> Iterator[None]:
        self.sample()
        with self.lock:
            self.peak = {}
            self.first = {pid: cpu for pid, (_, cpu) in self.last.items()}
        started = time.perf_counter()
        yield
        seconds = time.perf_counter() - started
        self.sample()
        with self.lock:
            cpu = dict.fromkeys(ROLES, 0.0)
            for pid, (role, value) in self.last.items():
                cpu[role] += value - self.first.get(pid, value)
            stages[name] = {
                "seconds": seconds,
                "cpu_s": cpu,
                "peak_rss_mb": {r: self.peak.get(r, 0.0) / 2**20 for r in ROLES},
            }
        print(f"  {name:<14}{seconds:8.1f} s", flush=True)


# --- the truth and silver ------------------------------------------------------------------------


def expected(truth_out: Path, docs: int, shape: str) -> dict[int, tuple[int, int]]:
    """Per collection id: (live documents, digest) silver must hold: the bulk documents'
    from their numbers, the simulated ones' from the producer's truth."""
    from dcp_cdc.simulator.realistic import CollectionTruth, row_digest, small_truth, truth

    summary = json.loads((truth_out / "truth" / "summary.json").read_text())
    bulk = truth(docs) if shape == "realistic" else small_truth(docs, BODY_BYTES)
    per: dict[int, CollectionTruth] = dict(
        zip(summary["bulk"]["collection_ids"], bulk, strict=True)
    )
    with (truth_out / "truth" / "documents.jsonl").open(encoding="utf-8") as fh:
        for line in fh:
            d = json.loads(line)
            key = (
                d["key"]
                if "key" in d
                else base64.b64decode(d["key_b64"]).decode("utf-8", "replace")
            )
            body = d["value"].encode() if "value" in d else base64.b64decode(d["value_b64"])
            user = {k: v for k, v in (d["xattrs"] or {}).items() if not k.startswith("_")}
            digest = row_digest(
                key,
                body,
                is_json=d["is_json"],
                user_xattrs=user,
                flags=d["flags"],
                expiry=d["expiry"],
                rev_seqno=d["rev_seqno"],
            )
            per.setdefault(d["collection_id"], CollectionTruth()).add(digest)
    return {cid: (t.documents, t.digest) for cid, t in per.items() if t.documents}


def silver_digests(spark: Any) -> dict[int, tuple[int, int]]:
    """Per collection id: (live rows, the sum of their digests) of silver, as its views
    show them (the live layer's pending rows overlaid), computed by Spark."""
    from pyspark.sql import functions as F

    from pipelines.silver.live import current_rows
    from pipelines.tables import BucketTables

    def sep(n: int) -> Any:
        return F.expr(f"char({n})")

    body = F.when(F.col("doc").isNotNull(), F.concat(F.lit("j"), F.col("doc"))).otherwise(
        F.concat(F.lit("b"), F.hex("doc_binary"))
    )
    pairs = F.transform(
        F.array_sort(F.map_entries("xattrs")), lambda e: F.concat(e["key"], sep(1), e["value"])
    )
    row = F.concat_ws(
        "\x00",
        F.col("key"),
        body,
        F.coalesce(F.array_join(pairs, "\x02"), F.lit("")),
        *(F.col(c).cast("string") for c in ("_flags", "_expiry", "_rev_seqno")),
    )
    digest = F.conv(F.substring(F.md5(F.encode(row, "UTF-8")), 1, 15), 16, 10)
    registry = spark.table(BucketTables(BUCKET).registry).where("status != 'retired'").collect()
    out = {}
    for reg in registry:
        rows = current_rows(spark, BUCKET, reg["table_name"], reg["collection_id"])
        got = (
            rows.where(~F.col("_deleted"))
            .agg(F.count("*").alias("n"), F.sum(digest.cast("decimal(38,0)")).alias("d"))
            .first()
        )
        if got is not None and got["n"]:
            out[int(reg["collection_id"])] = (int(got["n"]), int(got["d"]))
    return out


def disk_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


# --- one run -------------------------------------------------------------------------------------


def run_once(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from dcp_cdc.config import AppConfig, BucketConfig

    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    stages: dict[str, dict[str, Any]] = {}
    started = time.perf_counter()
    producer = Producer(work, args)
    try:
        stages["producer start"] = {"seconds": time.perf_counter() - started}
        print(f"  producer start{stages['producer start']['seconds']:8.1f} s", flush=True)
        config = write_config(work, producer.info["connection_string"])
        if args.live_rate:
            producer.control(f"steady {args.live_rate}")
        stages["capture"] = run_agent(config)
        print(f"  capture       {stages['capture']['seconds']:8.1f} s", flush=True)
        live_changes = 0
        if args.live_rate:
            live_changes = int(producer.control("halt").split()[1])
            stages["capture tail"] = run_agent(config)
            print(f"  capture tail  {stages['capture tail']['seconds']:8.1f} s", flush=True)
        producer.control("truth")
    finally:
        producer.stop()
    t = time.perf_counter()
    want = expected(producer.truth_out, args.docs, args.shape)
    stages["truth (python)"] = {"seconds": time.perf_counter() - t}
    result = _spark_stages(
        AppConfig(
            landing=str(work / "landing"),
            warehouse=str(work / "warehouse"),
            buckets=[BucketConfig(name=BUCKET)],
        ),
        stages,
    )
    silver = result.pop("silver")
    warehouse = work / "warehouse"
    result |= {
        "documents": args.docs,
        "shape": args.shape,
        "live_changes": live_changes,
        "stages": stages,
        "disk_bytes": {
            "landing": disk_bytes(work / "landing"),
            "bronze": disk_bytes(warehouse / "bronze.db"),
            "silver": disk_bytes(warehouse / "silver.db"),
        },
        "collections": {str(cid): n for cid, (n, _) in sorted(want.items())},
        "silver_equals_truth": silver == want,
    }
    if silver != want:
        diff = {c: (silver.get(c), want.get(c)) for c in set(silver) | set(want)}
        raise SystemExit(f"silver differs from the truth (silver, truth): {diff}")
    if not result["quality_passed"]:
        raise SystemExit(f"the quality check failed: {result['quality_failed']}")
    return result


def _spark_stages(config: Any, stages: dict[str, dict[str, Any]]) -> dict[str, Any]:
    from pipelines.bronze.job import ingest_bucket
    from pipelines.bronze.memory import IngestMemory
    from pipelines.lake.spark_session import build_spark_session
    from pipelines.quality.job import check_bucket
    from pipelines.silver.job import apply_bucket
    from pipelines.silver.memory import ApplyMemory

    sampler = Sampler()
    sampler.start()
    bucket = config.buckets[0]
    try:
        with sampler.stage(stages, "spark start"):
            spark = build_spark_session("dcp-cdc-bench-initial-load", config.warehouse)
        try:
            memory = IngestMemory()  # as dcp-cdc run: the apply reads the run's own files
            with sampler.stage(stages, "ingest"):
                ingested = ingest_bucket(spark, config, bucket, memory=memory)
            with sampler.stage(stages, "apply"):
                applied = apply_bucket(spark, config, bucket, memory=ApplyMemory(ingest=memory))
            with sampler.stage(stages, "check"):
                quality = check_bucket(spark, config, bucket)
            with sampler.stage(stages, "silver digest"):
                silver = silver_digests(spark)
        finally:
            spark.stop()
    finally:
        sampler.done.set()
        sampler.join()
    return {
        "frames": ingested.frames,
        "changes": applied.changes,
        "quality_passed": quality.passed,
        "quality_failed": quality.failed_errors,
        "silver": silver,
    }


# --- the command ---------------------------------------------------------------------------------

PIPELINE = ("capture", "capture tail", "ingest", "apply", "check")
"""The stages a load costs (the producer, the truth and the digest check are the benchmark's)."""


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.initial_load", description=__doc__)
    parser.add_argument("--docs", type=int, default=100_000, help="bulk documents served")
    parser.add_argument("--vbuckets", type=int, default=1024)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--shape", choices=("realistic", "small"), default="realistic")
    parser.add_argument(
        "--live-rate", type=int, default=100, help="live changes a second (0: none)"
    )
    parser.add_argument("--sim-docs", type=int, default=1000, help="simulated documents beside")
    parser.add_argument("--work", type=Path, default=DATA, help="where the run's files go")
    parser.add_argument(
        "--result",
        type=Path,
        help="write the run's result (JSON) here, not to benchmarks/results/ (tests)",
    )
    args = parser.parse_args(argv)
    result = run_once(args, args.work)
    _print(result)
    if args.result is not None:
        args.result.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        return result
    stages = result["stages"]
    total = sum(stages[s]["seconds"] for s in PIPELINE if s in stages)
    cases = [Case("load: capture → check", args.docs, "documents", [total], baseline=True)]
    cases += [
        Case(name, args.docs, "documents", [s["seconds"]], extra=s) for name, s in stages.items()
    ]
    params = vars(args) | {"work": str(args.work)}
    params |= {k: v for k, v in result.items() if k != "stages"}
    report("initial_load", cases, params=params)
    return result


def _print(result: dict[str, Any]) -> None:
    print(f"\n  {'stage':<16}{'s':>8}{'CPU s':>10}   peak RSS MB")
    for name, s in result["stages"].items():
        cpu = s.get("cpu_s", {})
        rss = s.get("peak_rss_mb", {})
        cells = ", ".join(f"{k} {v:.0f}" for k, v in rss.items() if v)
        print(f"  {name:<16}{s['seconds']:>8.1f}{sum(cpu.values()) if cpu else 0:>10.1f}   {cells}")
    sizes = ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in result["disk_bytes"].items())
    print(f"  on disk: {sizes}")
    print(
        f"  {result['frames']:,} frames, {result['changes']:,} changes, "
        f"{result['live_changes']:,} live changes; silver equals the truth: "
        f"{result['silver_equals_truth']}; quality passed: {result['quality_passed']}"
    )


if __name__ == "__main__":
    main()
