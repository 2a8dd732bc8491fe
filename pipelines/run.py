"""``dcp-cdc run``: the whole pipeline in one process, and the summary a newcomer reads.

Without ``--config`` it is the embedded demo: a small simulated bucket served over DCP by the
test producer (4 data nodes on 127.0.0.1, a live workload with a failover and a rebalance on
the way) and captured by the capture agent into ``--workdir`` (fresh each time), then ingest,
apply and check on a local warehouse there, with the configuration
every verb uses when given none (:data:`dcp_cdc.config.CONFIG_RULE`: ``$DCP_CDC_CONFIG``, else
``./conf/local.toml``, else the same settings built in) as it is, but for its landing and
warehouse. From a checkout's root (or an empty folder) the default ``--workdir`` is where that
configuration keeps its data, so ``dcp-cdc check``, ``tables``, ``sql`` find the demo's tables
with no options. With ``--config`` it runs the same steps on that configuration's landing data.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import secrets
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from dcp_cdc.config import DEFAULT_WORKDIR, AppConfig, load_config

if TYPE_CHECKING:
    from dcp_cdc.agent.driver import CaptureSettings, CaptureSummary
    from dcp_cdc.simulator import SimConfig
    from pipelines.quality.report import QualityReport


class _Step:
    """One numbered step of a long command: its line, a running clock while it works (on a
    terminal), and how long it took."""

    def __init__(self, out: TextIO, number: int, total: int, label: str) -> None:
        self.out, self.line = out, f"[{number}/{total}] {label}"
        self.done = threading.Event()
        self.ticker: threading.Thread | None = None

    def __enter__(self) -> _Step:
        self.started = time.perf_counter()
        self.out.write(self.line + " ...")
        self.out.flush()
        if self.out.isatty():
            self.ticker = threading.Thread(target=self._tick, daemon=True)
            self.ticker.start()
        return self

    def _tick(self) -> None:
        while not self.done.wait(1.0):
            self.out.write(f"\r{self.line} ... {time.perf_counter() - self.started:.0f} s")
            self.out.flush()

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        if self.ticker is not None:
            self.ticker.join()
        seconds = time.perf_counter() - self.started
        ending = "done" if exc[0] is None else "FAILED"
        # a log (no terminal) gets one line per step; a terminal has its ticking line redrawn
        again = f"\r{self.line} ... " if self.ticker is not None else " "
        self.out.write(f"{again}{ending} in {seconds:.1f} s\n")
        self.out.flush()


def _indent(text: str, prefix: str = "      ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


def _command_name() -> str:
    """How the reader calls this command again: ``dcp-cdc`` if it is on the PATH."""
    if shutil.which("dcp-cdc"):
        return "dcp-cdc"
    beside = Path(sys.executable).with_name("dcp-cdc")
    try:
        return str(beside.relative_to(Path.cwd()))
    except ValueError:
        return str(beside)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``dcp-cdc run`` besides ``--bucket``; the check step's flags too."""
    from pipelines.quality.job import add_arguments as check_arguments

    parser.add_argument(
        "--workdir", default=DEFAULT_WORKDIR, help="where the embedded demo's data go"
    )
    parser.add_argument("--config", help="a TOML file in conf/: run on its landing data instead")
    parser.add_argument(
        "--follow",
        action="store_true",
        help="keep following: ingest and apply in micro-batches every follow.interval_s, with "
        "the capture agent alongside, until SIGTERM or Ctrl-C (the embedded demo: a live "
        "workload at --rate)",
    )
    parser.add_argument(
        "--rate",
        type=float,
        default=200.0,
        help="with --follow and no --config: the demo bucket's live changes a second",
    )
    parser.add_argument(
        "--no-capture",
        action="store_true",
        help="with --follow --config: run no capture agent (files land by other means)",
    )
    check_arguments(parser)


def demo_simulation(bucket: str) -> SimConfig:
    """The bucket the demo serves: its initial load, then ``ops`` live changes."""
    from dcp_cdc.simulator import SimConfig

    return SimConfig(scenario="mixed", seed=1, bucket=bucket, vbuckets=16, docs=400, ops=2000)


DEMO_NODES = 4


def demo_capture(target: Path, sim: SimConfig) -> tuple[CaptureSummary, CaptureSummary]:
    """Serve ``sim`` from the test producer and capture it as a user would a cluster: the
    agent follows the live workload (through a failover and a rebalance half-way), is stopped,
    then captures ``--until now``. The truth of the bucket goes to ``target/truth``."""
    return asyncio.run(_demo_capture(target, sim))


def _demo_settings(
    connection_string: str, bucket: str, user: str, password: str, landing: Path, rotate: float
) -> CaptureSettings:
    from dcp_cdc.agent.driver import CaptureSettings

    return CaptureSettings.into(
        landing,
        connection_string=connection_string,
        bucket=bucket,
        username=user,
        password=password,
        rotate_bytes=1 << 20,
        rotate_seconds=rotate,
    )


async def _demo_capture(target: Path, sim: SimConfig) -> tuple[CaptureSummary, CaptureSummary]:
    from dcp_cdc.agent.driver import capture
    from dcp_cdc.simulator.server import ProducerServer

    user, password = "dcp-cdc-demo", secrets.token_urlsafe(18)  # this run's only
    async with ProducerServer(sim, nodes=DEMO_NODES, users={user: password}) as server:
        settings = _demo_settings(
            server.connection_string, sim.bucket, user, password, target / "landing", 60
        )
        stop = asyncio.Event()
        follow = asyncio.create_task(capture(settings, mode="follow", stop=stop))
        await asyncio.sleep(1.0)  # the agent connects and opens its streams
        workload = asyncio.create_task(server.run_workload(sim.ops, batch=50, pause_s=0.02))
        while server.ops_done < sim.ops // 2 and not workload.done():
            await asyncio.sleep(0.01)
        server.failover(3)
        server.rebalance(5, (server.cluster.vbmap[5] + 1) % DEMO_NODES)
        await workload
        await asyncio.sleep(1.0)  # the last changes reach the agent as they would a follower
        stop.set()
        followed = await follow
        bounded = await capture(settings, mode="until-now")
        server.write_truth(target)
    return followed, bounded


def command(args: argparse.Namespace, out: TextIO) -> int:
    """The main job. Without ``--config``: simulate a small bucket into ``--workdir`` (fresh
    each time) and run the pipeline on a local warehouse there; with it, run on real data.
    Exit 1 when a quality check of severity error failed (the data stay)."""
    if args.follow:
        return follow_command(args, out)
    simulated = not args.config
    total = 5 if simulated else 4
    number = iter(range(1, total + 1))
    if args.config:
        config = load_config(args.config)
    else:
        target = Path(args.workdir).resolve()
        for folder in ("landing", "truth", "warehouse"):  # the embedded demo starts afresh
            shutil.rmtree(target / folder, ignore_errors=True)
        config = load_config(
            None, landing=str(target / "landing"), warehouse=str(target / "warehouse")
        )
        sim = demo_simulation(config.buckets[0].name)
        with _Step(
            out,
            next(number),
            total,
            f"capturing bucket {sim.bucket!r} over DCP from {DEMO_NODES} simulated data nodes "
            f"on 127.0.0.1 (live workload, seed {sim.seed})",
        ):
            followed, bounded = demo_capture(target, sim)
        files = sorted(target.joinpath("landing").glob("*.dcpcap"))
        size = sum(f.stat().st_size for f in files)
        out.write(
            f"      followed {sim.ops:,} live changes through a failover and a rebalance "
            f"({followed.rollbacks + bounded.rollbacks} rollbacks, "
            f"{followed.moves + bounded.moves} moved vbuckets), then "
            f"{len(bounded.done)} vbuckets up to now: {len(files)} capture files, {size:,} bytes "
            f"under {target / 'landing'}\n"
        )
    buckets = [b.name for b in config.bucket(args.bucket)]

    from pipelines.bronze.job import check_landing
    from pipelines.bronze.job import run as ingest
    from pipelines.catalog import bucket_overview
    from pipelines.quality.job import run as check
    from pipelines.silver.job import run as apply
    from pipelines.spark_session import session_for

    check_landing(config, config.bucket(args.bucket), args.config)  # before Spark starts
    with _Step(
        out, next(number), total, f"starting Spark ({config.spark.master}) on {config.warehouse}"
    ):
        spark = session_for(config, "dcp-cdc-run")
    with _Step(out, next(number), total, "ingesting capture files into bronze"):
        ingested = ingest(config, args.bucket, spark=spark)
    out.write("".join(_indent(s.render()) + "\n" for s in ingested))
    with _Step(out, next(number), total, "applying bronze to silver (MERGE per collection)"):
        applied = apply(config, args.bucket, spark=spark)
    out.write("".join(_indent(s.render()) + "\n" for s in applied))
    with _Step(out, next(number), total, "checking data quality"):
        reports = check(config, args.bucket, spark=spark, screenshot=args.screenshot)

    cli = _command_name()
    default_warehouse = load_config(None).warehouse
    where = "" if config.warehouse == default_warehouse else f" --warehouse {config.warehouse}"
    where += f" --config {args.config}" if args.config else ""
    for bucket in buckets:
        overview = bucket_overview(spark, bucket)
        out.write(f"\n=== bucket {bucket!r} ===\n\n{overview.render()}\n\n")
        for report in (r for r in reports if r.bucket == bucket):
            out.write(_verdict(report) + "\n")
        sample = next((c.table for c in overview.collections if c.live), None)
        out.write(
            "\nTry (the tables are in the catalog under "
            f"{config.warehouse}):\n"
            f"  {cli} tables{where}\n"
            f'  {cli} sql{where} "SELECT op, count(*) AS n FROM {overview.events_table} '
            f'GROUP BY op ORDER BY n DESC"\n'
        )
        if sample:
            out.write(
                f'  {cli} sql{where} "SELECT key, _seqno, _change, doc FROM {sample} '
                f'ORDER BY _seqno DESC LIMIT 5"\n'
            )
    return 0 if all(r.passed for r in reports) else 1


def _verdict(report: QualityReport) -> str:
    """A quality report in the run summary: the verdict, what failed, where to read more."""
    met = sum(1 for o in report.outcomes if o.success)
    verdict = "PASSED" if report.passed else f"FAILED ({len(report.failed_errors)} errors)"
    lines = [
        f"Quality: {verdict}, {met} of {len(report.outcomes)} expectations met"
        + (f", warnings: {', '.join(report.failed_warnings)}" if report.failed_warnings else "")
    ]
    lines += [f"  error: {key}" for key in report.failed_errors]
    lines += [
        f"  report:    {report.report_path}",
        f"  data docs: {report.data_docs_path}",
        f"  results:   {report.results_table}",
    ]
    return "\n".join(lines)


# --- follow mode ---------------------------------------------------------------------------


@contextlib.contextmanager
def _stop_signals(stop: threading.Event, check_now: threading.Event) -> Iterator[None]:
    """SIGTERM and SIGINT set ``stop`` (a second Ctrl-C interrupts at once); SIGUSR1 asks
    for a quality check."""

    def on_stop(signum: int, frame: object) -> None:
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        stop.set()

    wanted = {signal.SIGTERM: on_stop, signal.SIGINT: on_stop}
    wanted[signal.SIGUSR1] = lambda signum, frame: check_now.set()
    previous = {sig: signal.signal(sig, handler) for sig, handler in wanted.items()}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _fair(config: AppConfig) -> AppConfig:
    """``config`` with Spark's fair scheduler: a quality check's jobs share the cores with
    the micro-batches' instead of queueing them."""
    conf = {"spark.scheduler.mode": "FAIR", **config.spark.conf}
    return config.model_copy(update={"spark": config.spark.model_copy(update={"conf": conf})})


def follow_command(args: argparse.Namespace, out: TextIO) -> int:
    """``dcp-cdc run --follow``: micro-batches until a stop signal. With ``--config``, its
    buckets, each with its capture agent alongside when it has a capture section; without,
    the embedded demo: a bucket served by the test producer with a steady live workload.

    The signal handlers are set once Spark runs (its context sets a SIGINT handler that
    cancels every job, which would cut the batch in progress)."""
    from pipelines.follow import Follower, LoopThread, captures_of
    from pipelines.spark_session import session_for

    stop, check_now = threading.Event(), threading.Event()
    if args.config:
        config = _fair(load_config(args.config))
        buckets = config.bucket(args.bucket)
        captures = {} if args.no_capture else captures_of(config, buckets)  # lag: checkpoints
        spark = session_for(config, "dcp-cdc-follow")
        with _stop_signals(stop, check_now):
            follower = Follower(
                spark, config, buckets, out, stop, captures=captures, check_now=check_now
            )
            return follower.run()
    target = Path(args.workdir).resolve()
    for folder in ("landing", "truth", "warehouse"):  # the embedded demo starts afresh
        shutil.rmtree(target / folder, ignore_errors=True)
    config = _fair(
        load_config(None, landing=str(target / "landing"), warehouse=str(target / "warehouse"))
    )
    sim = dataclasses.replace(demo_simulation(config.buckets[0].name), ops=0)
    user, password = "dcp-cdc-demo", secrets.token_urlsafe(18)
    served: list[str] = []
    started = threading.Event()

    async def serve(halt: asyncio.Event) -> None:
        from dcp_cdc.simulator.server import ProducerServer

        async with ProducerServer(sim, nodes=DEMO_NODES, users={user: password}) as server:
            served.append(server.connection_string)
            started.set()
            await server.steady_workload(args.rate, halt)

    producer = LoopThread("the demo's test producer", serve)
    producer.start()
    try:
        while not started.wait(0.1):
            producer.check()
        out.write(
            f"serving bucket {sim.bucket!r} from {DEMO_NODES} simulated data nodes on 127.0.0.1, "
            f"{args.rate:g} live changes a second\n"
        )
        settings = _demo_settings(
            served[0], sim.bucket, user, password, target / "landing", config.follow.rotate_seconds
        )
        with _Step(out, 1, 1, f"starting Spark ({config.spark.master}) on {config.warehouse}"):
            spark = session_for(config, "dcp-cdc-follow")
        with _stop_signals(stop, check_now):
            follower = Follower(
                spark,
                config,
                config.buckets,
                out,
                stop,
                captures={sim.bucket: settings},
                check_now=check_now,
            )
            return follower.run()
    finally:
        producer.stop()
