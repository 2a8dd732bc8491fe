"""The loop of follow mode (:class:`Follower`): a micro-batch of each bucket every
``follow.interval_s``, the capture agents alongside, quality checks in a thread beside, and,
with ``follow.metrics_port``, its metrics and health served over HTTP.

A micro-batch that fails is logged and tried again at the next interval: it is a batch run,
so the next one finishes what the failed one left (an ingest's open plan, an apply's walk).
An error no retry cures (:data:`FATAL`: the configuration, credentials, a bucket or table
that is not there, a landing changed under bronze) ends follow mode at once.
A bucket whose micro-batches failed ``follow.unready_after_failed_batches`` times in a row
fails ``/readyz``; at ``follow.stop_after_failed_batches`` follow mode gives up, raising the
last error, for a supervisor to restart it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from pyspark.sql import SparkSession

from dcp_cdc.agent.s3_store import S3Options
from dcp_cdc.agent.settings import CaptureSettings
from dcp_cdc.config import AppConfig, BucketConfig
from dcp_cdc.errors import ConfigError
from dcp_cdc.logs import log_context
from pipelines.bronze.job import ingest_bucket
from pipelines.bronze.memory import IngestMemory
from pipelines.errors import (
    CatalogError,
    CollectionNameError,
    LandingChangedError,
    S3BucketNotFoundError,
    S3CredentialsError,
    TableLocationError,
)
from pipelines.follow.agent import AgentProcess, checkpoint_of
from pipelines.follow.metrics import FollowMetrics, monitoring_for, serving
from pipelines.follow.progress import Batch, BucketProgress, status_line
from pipelines.quality.job import check_bucket, pinned_versions
from pipelines.silver import live
from pipelines.silver.job import Compaction, applied_positions, apply_bucket
from pipelines.silver.memory import ApplyMemory
from pipelines.silver.registry import read_registry

log = logging.getLogger("dcp_cdc.follow")

FATAL: tuple[type[Exception], ...] = (
    ConfigError,
    CatalogError,
    TableLocationError,
    CollectionNameError,
    LandingChangedError,
    S3CredentialsError,
    S3BucketNotFoundError,
)
"""Errors of a micro-batch that the next attempt would meet again: a person has to act, so
follow mode ends with them at once instead of retrying."""


def _no_hook(point: str) -> None:
    return None


@dataclass
class Follower:
    """The loop of follow mode; :meth:`run` until ``stop`` is set."""

    spark: SparkSession
    config: AppConfig
    buckets: Sequence[BucketConfig]
    out: TextIO
    stop: threading.Event
    captures: dict[str, CaptureSettings] = field(default_factory=dict)
    """bucket -> the agent to run alongside; none for buckets whose files land otherwise."""
    check_now: threading.Event = field(default_factory=threading.Event)
    hook: Callable[[str], None] = _no_hook
    """Called between the steps of an ingest (tests stop a run in the middle of a batch)."""
    on_batch: Callable[[Batch, BucketProgress], None] | None = None
    progress: dict[str, BucketProgress] = field(default_factory=dict)
    metrics: FollowMetrics | None = None
    """What a scrape of ``follow.metrics_port`` reads (made by :meth:`run` when not given)."""
    memory: dict[str, ApplyMemory] = field(default_factory=dict)
    """bucket -> what its last apply left (:mod:`pipelines.silver.memory`)."""
    compactions: dict[str, Compaction] = field(default_factory=dict)
    """bucket -> its live layer's compaction (``[silver] live_layer``): in a thread of its own,
    beside the micro-batches (:meth:`start_compaction`)."""
    ingest_memory: dict[str, IngestMemory] = field(default_factory=dict)
    """bucket -> its ingest log as its last ingest left it (:mod:`pipelines.bronze.memory`)."""
    failed_check: bool = False
    _compacting: dict[str, threading.Thread] = field(default_factory=dict)
    _compact_error: BaseException | None = None
    _checking: threading.Thread | None = None
    _check_error: BaseException | None = None
    _out_lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self) -> int:
        """Micro-batches until ``stop``; 0, or 1 when the latest quality check failed."""
        names = [b.name for b in self.buckets]
        with serving(self.config.follow, monitoring_for(self._metrics(), names)):
            return self._run()

    def _run(self) -> int:
        agents = [AgentProcess(s) for s in self.captures.values()]
        for settings in self.captures.values():
            # what the agent makes first when it starts: the first micro-batch may come before
            # the agent's process has (its landing must exist: landing.check_landing)
            if isinstance(settings.landing, Path):  # an object store's prefix needs none
                settings.landing.mkdir(parents=True, exist_ok=True)
        try:
            for agent in agents:
                agent.start()
            self._follow(agents)
        finally:
            errors = []
            for agent in agents:
                try:
                    agent.stop()
                except BaseException as exc:  # every agent is stopped; the first error raised
                    errors.append(exc)
            if errors:
                raise errors[0]
        return 1 if self.failed_check else 0

    def _follow(self, agents: list[AgentProcess]) -> None:
        interval = self.config.follow.interval_s
        for b in self.buckets:
            progress = BucketProgress(
                b,
                checkpoint_of(self.config, b, self.captures.get(b.name)),
                s3=S3Options.from_spark_conf(self.config.spark.conf),
            )
            progress.applied = applied_positions(self.spark, b.name)
            self.progress[b.name] = progress
        names = ", ".join(repr(b.name) for b in self.buckets)
        self._say(
            f"following bucket {names}: a micro-batch every {interval:g} s; stop with Ctrl-C "
            "or SIGTERM (the current batch finishes), a quality check now with SIGUSR1"
        )
        last_check = time.monotonic()
        next_at = time.monotonic()
        while not self.stop.is_set():
            for agent in agents:
                agent.check()
            for b in self.buckets:
                with log_context(bucket=b.name):
                    self.attempt(self.progress[b.name])
                if self.stop.is_set():
                    break
            every = self.config.follow.check_every_s
            due = every > 0 and time.monotonic() - last_check >= every
            asked = due or self.check_now.is_set()
            if asked and not self.stop.is_set() and self.check_done():
                self.check_now.clear()
                self.start_check()
                last_check = time.monotonic()
            next_at = max(next_at + interval, time.monotonic())
            self.stop.wait(next_at - time.monotonic())
        if not self.check_done():
            self._say("waiting for the quality check to finish")
            self.check_done(wait=True)
        self.compaction_done(wait=True)
        total = sum(p.batches for p in self.progress.values())
        self._say(f"stopped after {total} micro-batches; a restart carries on from here")

    def attempt(self, progress: BucketProgress) -> Batch | None:
        """A micro-batch; one that fails is logged, counted and left for the next interval
        (None), unless it is the ``follow.stop_after_failed_batches``-th in a row or one of
        :data:`FATAL`: then its error is raised."""
        try:
            return self.micro_batch(progress)
        except Exception as exc:
            settings = self.config.follow
            in_a_row = self._metrics().batch_failed(progress.bucket.name, exc)
            log.error(
                "micro-batch of bucket %s failed (%d in a row)",
                progress.bucket.name,
                in_a_row,
                exc_info=True,
            )
            what = f"{type(exc).__name__}: {exc}".splitlines()[0]
            self._say(
                f"{time.strftime('%H:%M:%S')} {progress.bucket.name}: batch "
                f"{progress.batches + 1} FAILED ({in_a_row} in a row; not ready from "
                f"{settings.unready_after_failed_batches}, stopping at "
                f"{settings.stop_after_failed_batches}): {what}"
            )
            if isinstance(exc, FATAL) or in_a_row >= settings.stop_after_failed_batches:
                raise
            return None

    def micro_batch(self, progress: BucketProgress) -> Batch:
        """Ingest what landed; apply when bronze holds frames silver has not consumed. With
        nothing new landed, it runs no Spark job."""
        started_wall, started = time.time(), time.perf_counter()
        ingest_memory = self.ingest_memory.setdefault(progress.bucket.name, IngestMemory())
        ingested = ingest_bucket(
            self.spark, self.config, progress.bucket, hook=self.hook, memory=ingest_memory
        )
        ingest_s = time.perf_counter() - started
        progress.unapplied |= bool(ingested.files or ingested.resumed)
        apply_s = 0.0
        applied = None
        if progress.unapplied:
            memory = self.memory.setdefault(progress.bucket.name, ApplyMemory())
            memory.ingest = ingest_memory  # the runs to walk, found without reading the log
            compaction = self.compactions.setdefault(progress.bucket.name, Compaction(in_run=False))
            applied = apply_bucket(
                self.spark, self.config, progress.bucket, memory=memory, compaction=compaction
            )
            self.start_compaction(progress.bucket)
            apply_s = time.perf_counter() - started - ingest_s
            progress.applied.update(applied.positions)
            progress.unapplied = False
        progress.batches += 1
        progress.frames += ingested.frames
        progress.as_of = started_wall
        now = time.time()
        progress.window.append((now, ingested.frames))
        times = applied.change_times if applied is not None else None
        if times is not None:
            progress.freshness.append(times)
        batch = Batch(
            progress.bucket.name,
            progress.batches,
            ingested.frames,
            ingest_s,
            apply_s,
            files=ingested.files,
            apply_steps=dict(applied.steps) if applied is not None else {},
            merged=dict(applied.tables) if applied is not None else {},
            change_times=times,
            lag=progress.lag(),
            held_back=tuple(ingested.held_back),
        )
        self._metrics().batch_done(batch, ended_at=now)
        self._say(status_line(progress, batch, now))
        if self.on_batch is not None:
            self.on_batch(batch, progress)
        return batch

    def _metrics(self) -> FollowMetrics:
        """:attr:`metrics`, made on first use unless given."""
        if self.metrics is None:
            unready = self.config.follow.unready_after_failed_batches
            self.metrics = FollowMetrics(
                [b.name for b in self.buckets],
                unready_after=unready,
                held_back_after_s=self.config.quality.held_back_after_s,
            )
        return self.metrics

    def start_compaction(self, bucket: BucketConfig) -> None:
        """With the live layer on, when due and none runs, the bucket's compaction in a thread
        (its Spark jobs in a pool of their own); its error is raised in the loop's thread at
        the next call or at the end."""
        self.compaction_done(wait=False)
        running = self._compacting.get(bucket.name)
        if not self.config.silver.live_layer or (running is not None and running.is_alive()):
            return
        if not live.compaction_due(self.spark, bucket.name, self.config.silver):
            return
        compaction = self.compactions[bucket.name]

        def compact() -> None:
            self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", "compaction")
            try:
                with compaction.lock, log_context(bucket=bucket.name):
                    live.compact(self.spark, bucket.name, read_registry(self.spark, bucket.name))
            except BaseException as exc:  # raised again in the loop's thread
                self._compact_error = exc

        thread = threading.Thread(target=compact, name=f"compaction {bucket.name}", daemon=True)
        self._compacting[bucket.name] = thread
        thread.start()

    def compaction_done(self, *, wait: bool) -> None:
        """Raise the error of a compaction that failed (``wait``: once every running one
        ended)."""
        if wait:
            for thread in self._compacting.values():
                thread.join()
        error, self._compact_error = self._compact_error, None
        if error is not None:
            raise error

    def start_check(self) -> None:
        """The quality suites of every bucket, in a thread beside the micro-batches: each
        table is read at the version it had now, between two batches (one consistent moment),
        and its jobs go to a scheduler pool of their own (fair with the batches' under
        ``spark.scheduler.mode=FAIR``, which ``dcp-cdc run --follow`` sets)."""
        at = {b.name: pinned_versions(self.spark, b.name) for b in self.buckets}
        self._check_error = None
        self._checking = threading.Thread(
            target=self._check, args=(at,), name="quality check", daemon=True
        )
        self._checking.start()

    def _check(self, at: dict[str, dict[str, int]]) -> None:
        self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", "quality")
        any_failed = False
        try:
            for b in self.buckets:
                with log_context(bucket=b.name):  # this thread's own context
                    report = check_bucket(self.spark, self.config, b, at=at[b.name])
                self._metrics().quality_checked(b.name, report.passed)
                met = sum(1 for o in report.outcomes if o.success)
                verdict = "PASSED" if report.passed else "FAILED"
                failed = "".join(f", {k} failed" for k in report.failed_errors)
                self._say(
                    f"{time.strftime('%H:%M:%S')} {b.name}: quality {verdict}, {met} of "
                    f"{len(report.outcomes)} expectations met{failed} ({report.report_path})"
                )
                any_failed = any_failed or not report.passed
            self.failed_check = any_failed  # any bucket's failure fails the round's verdict
        except BaseException as exc:  # raised again in the loop's thread (check_done)
            self._check_error = exc

    def check_done(self, *, wait: bool = False) -> bool:
        """Whether no check is running (``wait``: once the running one ended); the error of
        a check that failed is raised here, in the loop's thread."""
        if self._checking is None:
            return True
        if wait:
            self._checking.join()
        if self._checking.is_alive():
            return False
        self._checking = None
        if self._check_error is not None:
            raise self._check_error
        return True

    def _say(self, line: str) -> None:
        with self._out_lock:
            self.out.write(line + "\n")
            self.out.flush()
