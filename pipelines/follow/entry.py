"""Follow mode's entry (``dcp-cdc run --follow``): its Spark session, its signals, and the
buckets it follows, those of a configuration or the embedded demo's, handed to the loop
(:class:`pipelines.follow.loop.Follower`)."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
from collections.abc import Iterator
from typing import TextIO

from dcp_cdc.config import AppConfig, load_config
from dcp_cdc.logs import configure_logging_from
from pipelines.app.batch_run import Step
from pipelines.app.demo import (
    DEMO_NODES,
    demo_settings,
    demo_simulation,
    fresh_workdir,
    served_steadily,
)
from pipelines.catalog.settings import shared_catalog, sharing_line
from pipelines.follow.agent import captures_of
from pipelines.follow.loop import Follower
from pipelines.lake import spark_session


@contextlib.contextmanager
def stop_signals(stop: threading.Event, check_now: threading.Event) -> Iterator[None]:
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


@contextlib.contextmanager
def shared_catalog_while_following(config: AppConfig, out: TextIO) -> Iterator[None]:
    """The catalog stays open to other processes while following (``dcp-cdc sql``, ``tables``,
    the Thrift server): on the local default, a metastore server for the warehouse, held by
    a lease while following and started on demand if none runs; it stops when no process
    holds it any more, also after a kill (:func:`pipelines.catalog.settings.shared_catalog`).
    Under ``spark-submit`` the JVM was launched already: the submitter chose its catalog."""
    if spark_session.launched_by_spark_submit():
        yield
        return
    jars = spark_session.delta_jars_dir(config.spark.jars_dir)
    with shared_catalog(config, jars) as server:
        if server is not None:
            out.write(f"{sharing_line(server)}\n")
            out.flush()
        yield


def fair(config: AppConfig) -> AppConfig:
    """``config`` with Spark's fair scheduler: a quality check's jobs share the cores with
    the micro-batches' instead of queueing them."""
    conf = {"spark.scheduler.mode": "FAIR", **config.spark.conf}
    return config.model_copy(update={"spark": config.spark.model_copy(update={"conf": conf})})


def follow(
    out: TextIO,
    *,
    config_file: str | None,
    workdir: str,
    bucket: str | None = None,
    rate: float = 200.0,
    no_capture: bool = False,
) -> int:
    """Micro-batches until a stop signal. With ``config_file``, its buckets (or ``bucket``),
    each with its capture agent alongside when it has a capture section (none with
    ``no_capture``); without, the embedded demo: a bucket served by the test producer with a
    steady live workload of ``rate`` changes a second.

    The signal handlers are set once Spark runs (its context sets a SIGINT handler that
    cancels every job, which would cut the batch in progress)."""
    stop, check_now = threading.Event(), threading.Event()
    if config_file:
        config = fair(load_config(config_file))
        configure_logging_from(config)
        buckets = config.bucket(bucket)
        captures = {} if no_capture else captures_of(config, buckets)  # lag: checkpoints
        with shared_catalog_while_following(config, out):
            spark = spark_session.session_for(config, "dcp-cdc-follow")
            with stop_signals(stop, check_now):
                follower = Follower(
                    spark, config, buckets, out, stop, captures=captures, check_now=check_now
                )
                return follower.run()
    target, config = fresh_workdir(workdir)
    config = fair(config)
    configure_logging_from(config)
    sim = dataclasses.replace(demo_simulation(config.buckets[0].name), ops=0)
    with (
        served_steadily(sim, rate) as (connection_string, user, password),
        shared_catalog_while_following(config, out),
    ):
        out.write(
            f"serving bucket {sim.bucket!r} from {DEMO_NODES} simulated data nodes on 127.0.0.1, "
            f"{rate:g} live changes a second\n"
        )
        settings = demo_settings(
            connection_string,
            sim.bucket,
            user,
            password,
            target / "landing",
            config.follow.rotate_seconds,
        )
        with Step(out, 1, 1, f"starting Spark ({config.spark.master}) on {config.warehouse}"):
            spark = spark_session.session_for(config, "dcp-cdc-follow")
        with stop_signals(stop, check_now):
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
