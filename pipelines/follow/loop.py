"""Follow mode (``dcp-cdc run --follow``): one Spark session that keeps silver seconds behind
the bucket.

Every ``follow.interval_s`` a micro-batch runs for each bucket: an ordinary ingest of what
landed (:func:`pipelines.bronze.job.ingest_bucket`), then, when it brought frames, an
ordinary apply (:func:`pipelines.silver.job.apply_bucket`). A micro-batch is a batch run, so
exactly-once and snapshot consistency hold as they do there, through kills and restarts too.
Alongside, the capture agent of each bucket with a ``[buckets.capture]`` section follows the
cluster in a child process (:class:`AgentProcess`), closing files at least every
``follow.rotate_seconds``.

After each micro-batch a status line per bucket says how far behind silver is: the lag (the
seqnos captured, from the agent's checkpoint, that silver has not reached yet, summed over
vbuckets), the events per second, and the age of what silver holds. Quality checks run every
``follow.check_every_s`` and on demand (``SIGUSR1``), in a thread beside the micro-batches,
reading every table as of one moment between two of them.

A stop (``SIGTERM``, ``SIGINT``) lets the current micro-batch finish, stops the agents
cleanly (files closed, checkpoint committed) and returns; a restart carries on from there.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import multiprocessing
import os
import pickle
import signal
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from dcp_cdc.config import AppConfig, BucketConfig

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from dcp_cdc.agent.driver import CaptureSettings

log = logging.getLogger("dcp_cdc.follow")

RATE_WINDOW_S = 10.0
"""Events per second are counted over this many seconds of micro-batches."""


def _no_hook(point: str) -> None:
    return None


class LoopThread:
    """A coroutine ``main(stop)`` running in a thread with its own event loop until
    :meth:`stop` sets ``stop``; its error is raised again by :meth:`check` and :meth:`stop`."""

    def __init__(self, name: str, main: Callable[[asyncio.Event], Awaitable[object]]) -> None:
        self.name = name
        self.error: BaseException | None = None
        self.result: object = None
        self.finished = False
        self._main_coro = main
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait()

    def _main(self) -> None:
        try:
            self.result = asyncio.run(self._run())
            self.finished = True
        except BaseException as exc:  # raised again in the caller's thread: check(), stop()
            self.error = exc
        finally:
            self._ready.set()

    async def _run(self) -> object:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._ready.set()
        return await self._main_coro(self._stop)

    def join(self, timeout: float) -> None:
        """Wait for the coroutine to return (or fail) by itself."""
        self._thread.join(timeout)

    def call(self, fn: Callable[[], object]) -> None:
        """``fn()`` in the thread's event loop (thread-safe)."""
        if self._loop is None:
            raise RuntimeError(f"{self.name} is not running")
        self._loop.call_soon_threadsafe(fn)

    def check(self) -> None:
        """Raise the coroutine's error, if it failed; one that ended unasked is an error."""
        if self.error is not None:
            raise self.error
        if not self._thread.is_alive() and not self.finished:
            raise RuntimeError(f"{self.name} ended")
        if self.finished and not (self._stop and self._stop.is_set()):
            raise RuntimeError(f"{self.name} ended before it was stopped")

    def stop(self, timeout: float = 120.0) -> None:
        """Set ``stop`` and wait for the coroutine to return."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and self._thread.is_alive():
            loop.call_soon_threadsafe(stop.set)
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise RuntimeError(f"{self.name} did not stop in {timeout:g} s")
        if self.error is not None:
            raise self.error


class AgentProcess:
    """The capture agent of one bucket following the cluster in a child process until
    :meth:`stop`; its stop is clean (streams closed, files renamed into landing, checkpoint
    committed), and its error is raised again by :meth:`check` and :meth:`stop`.

    A process, not a thread: an agent busy with thousands of frames a second in the driver's
    interpreter holds the GIL that every py4j call of the micro-batches waits for (a Spark
    call loop ran 2.4 times slower beside one busy thread). The child ignores SIGINT (a
    Ctrl-C reaches the whole process group; the parent decides when the agent stops), stops
    on SIGTERM, and stops by itself if the parent dies. Its settings, the password among
    them, reach it through a pipe, never its command line or environment."""

    def __init__(self, settings: CaptureSettings) -> None:
        ctx = multiprocessing.get_context("spawn")  # no copy of the JVM gateway's threads
        self.name = f"the capture agent of bucket {settings.bucket!r}"
        self._outcome, self._sender = ctx.Pipe(duplex=False)
        level = logging.getLogger().getEffectiveLevel()
        self._process = ctx.Process(
            target=_agent_main, args=(settings, level, self._sender), name=self.name, daemon=True
        )
        self._error: BaseException | None = None
        self._stopping = False

    def start(self) -> None:
        self._process.start()
        self._sender.close()  # the child's end alone: its exit reads as the end of the pipe

    def _ended(self) -> None:
        """Take the child's outcome (its error, if any) once it has ended."""
        if self._error is None and self._outcome.poll():
            with contextlib.suppress(EOFError):  # it ended without an error to send
                self._error = self._outcome.recv()
        code = self._process.exitcode
        asked = self._stopping and code == -signal.SIGTERM  # stopped before it had begun
        if self._error is None and code not in (0, None) and not asked:
            self._error = RuntimeError(f"{self.name} exited with code {self._process.exitcode}")

    def check(self) -> None:
        """Raise the agent's error, if it failed; one that ended unasked is an error."""
        if self._process.is_alive():
            return
        self._ended()
        if self._error is not None:
            raise self._error
        if not self._stopping:
            raise RuntimeError(f"{self.name} ended before it was stopped")

    def stop(self, timeout: float = 120.0) -> None:
        """Ask the agent to stop (SIGTERM) and wait for it."""
        self._stopping = True
        if self._process.is_alive() and self._process.pid is not None:
            os.kill(self._process.pid, signal.SIGTERM)
        self._process.join(timeout)
        if self._process.is_alive():
            self._process.kill()
            raise RuntimeError(f"{self.name} did not stop in {timeout:g} s")
        self._ended()
        if self._error is not None:
            raise self._error


def _agent_main(settings: CaptureSettings, level: int, outcome: Connection) -> None:
    """The child of :class:`AgentProcess`: follow until SIGTERM or an orphaning; the error
    that ended it goes back through ``outcome`` (a picklable copy of it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(_follow_until_stopped(settings, os.getppid()))
    except BaseException as exc:
        try:
            copy = pickle.loads(pickle.dumps(exc))
        except Exception:  # an error that does not pickle: its type and text
            copy = RuntimeError(f"{type(exc).__name__}: {exc}")
        outcome.send(copy)
        raise SystemExit(1) from None


async def _follow_until_stopped(settings: CaptureSettings, parent: int) -> None:
    from dcp_cdc.agent.driver import capture

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)

    async def orphaned() -> None:
        while os.getppid() == parent:
            await asyncio.sleep(1.0)
        log.warning("%s: the follow process is gone; stopping", settings.bucket)
        stop.set()

    watcher = asyncio.create_task(orphaned())
    try:
        await capture(settings, mode="follow", stop=stop)
    finally:
        watcher.cancel()


def captured_seqnos(checkpoint: Path, bucket: str) -> dict[int, int]:
    """vbucket -> the seqno the agent's files reach (its checkpoint); {} before the first."""
    from dcp_cdc.agent.writer import CheckpointStore

    store = CheckpointStore(checkpoint, bucket=bucket, bucket_uuid=None)
    return {vb: p.seqno for vb, p in store.load().items()}  # replaced by rename: never torn


@dataclass
class BucketProgress:
    """What follow mode knows of one bucket between micro-batches."""

    bucket: BucketConfig
    checkpoint: Path | None
    """The capture agent's checkpoint, when the bucket has one (the lag is read from it)."""
    applied: dict[int, int] = field(default_factory=dict)
    """vbucket -> the consistent seqno silver reached."""
    batches: int = 0
    frames: int = 0
    unapplied: bool = True
    """Bronze may hold frames silver has not consumed (at the start: a run before ours)."""
    as_of: float | None = None
    """Wall time: silver holds every file that had landed by then."""
    window: deque[tuple[float, int]] = field(default_factory=deque)

    def lag(self) -> tuple[int, int] | None:
        """(seqnos captured but not applied, summed; vbuckets behind), if the capture is known."""
        if self.checkpoint is None or not self.checkpoint.exists():
            return None
        captured = captured_seqnos(self.checkpoint, self.bucket.name)
        behind = [max(0, s - self.applied.get(vb, 0)) for vb, s in captured.items()]
        return sum(behind), sum(1 for b in behind if b)

    def rate(self, now: float) -> float:
        while self.window and self.window[0][0] < now - RATE_WINDOW_S:
            self.window.popleft()
        return sum(n for _, n in self.window) / RATE_WINDOW_S


@dataclass(frozen=True)
class Batch:
    """One micro-batch of one bucket."""

    bucket: str
    number: int
    frames: int
    ingest_s: float
    apply_s: float
    files: int = 0


def status_line(progress: BucketProgress, batch: Batch, now: float) -> str:
    """One line a person watching reads: the batch, the lag, the rate, the age of silver."""
    lag = progress.lag()
    lag_text = "lag unknown (no capture checkpoint)"
    if lag is not None:
        lag_text = f"lag {lag[0]:,} seqnos in {lag[1]} vbuckets"
    age = now - progress.as_of if progress.as_of is not None else float("nan")
    return (
        f"{time.strftime('%H:%M:%S', time.localtime(now))} {batch.bucket}: batch {batch.number}, "
        f"{batch.frames:,} frames in {batch.files} files (ingest {batch.ingest_s:.1f} s, "
        f"apply {batch.apply_s:.1f} s) | {lag_text} | {progress.rate(now):,.0f} events/s | "
        f"silver {age:.1f} s behind landing"
    )


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
    failed_check: bool = False
    _checking: threading.Thread | None = None
    _check_error: BaseException | None = None
    _out_lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self) -> int:
        """Micro-batches until ``stop``; 0, or 1 when the latest quality check failed."""
        agents = [AgentProcess(s) for s in self.captures.values()]
        for settings in self.captures.values():
            # what the agent makes first when it starts: the first micro-batch may come before
            # the agent's process has (its landing must exist: bronze.job.check_landing)
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
        from pipelines.silver import state
        from pipelines.tables import BucketTables

        interval = self.config.follow.interval_s
        for b in self.buckets:
            progress = BucketProgress(b, checkpoint_of(self.config, b, self.captures.get(b.name)))
            table = BucketTables(b.name).stream_state
            if self.spark.catalog.tableExists(table):
                progress.applied = {
                    vb: s["state"]["consistent_seqno"]
                    for vb, s in state.read_states(self.spark, table).items()
                }
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
                self.micro_batch(self.progress[b.name])
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
        total = sum(p.batches for p in self.progress.values())
        self._say(f"stopped after {total} micro-batches; a restart carries on from here")

    def micro_batch(self, progress: BucketProgress) -> Batch:
        """Ingest what landed; apply when bronze holds frames silver has not consumed."""
        from pipelines.bronze.job import ingest_bucket
        from pipelines.silver.job import apply_bucket

        started_wall, started = time.time(), time.perf_counter()
        ingested = ingest_bucket(self.spark, self.config, progress.bucket, hook=self.hook)
        ingest_s = time.perf_counter() - started
        progress.unapplied |= bool(ingested.files or ingested.resumed)
        apply_s = 0.0
        if progress.unapplied:
            applied = apply_bucket(self.spark, self.config, progress.bucket)
            apply_s = time.perf_counter() - started - ingest_s
            progress.applied.update(applied.positions)
            progress.unapplied = False
        progress.batches += 1
        progress.frames += ingested.frames
        progress.as_of = started_wall
        now = time.time()
        progress.window.append((now, ingested.frames))
        batch = Batch(
            progress.bucket.name,
            progress.batches,
            ingested.frames,
            ingest_s,
            apply_s,
            files=ingested.files,
        )
        self._say(status_line(progress, batch, now))
        if self.on_batch is not None:
            self.on_batch(batch, progress)
        return batch

    def start_check(self) -> None:
        """The quality suites of every bucket, in a thread beside the micro-batches: each
        table is read at the version it had now, between two batches (one consistent moment),
        and its jobs go to a scheduler pool of their own (fair with the batches' under
        ``spark.scheduler.mode=FAIR``, which ``dcp-cdc run --follow`` sets)."""
        from pipelines.quality.job import pinned_versions

        at = {b.name: pinned_versions(self.spark, b.name) for b in self.buckets}
        self._check_error = None
        self._checking = threading.Thread(
            target=self._check, args=(at,), name="quality check", daemon=True
        )
        self._checking.start()

    def _check(self, at: dict[str, dict[str, int]]) -> None:
        from pipelines.quality.job import check_bucket

        self.spark.sparkContext.setLocalProperty("spark.scheduler.pool", "quality")
        try:
            for b in self.buckets:
                report = check_bucket(self.spark, self.config, b, at=at[b.name])
                met = sum(1 for o in report.outcomes if o.success)
                verdict = "PASSED" if report.passed else "FAILED"
                failed = "".join(f", {k} failed" for k in report.failed_errors)
                self._say(
                    f"{time.strftime('%H:%M:%S')} {b.name}: quality {verdict}, {met} of "
                    f"{len(report.outcomes)} expectations met{failed} ({report.report_path})"
                )
                self.failed_check = not report.passed
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


def checkpoint_of(
    config: AppConfig, bucket: BucketConfig, settings: CaptureSettings | None
) -> Path | None:
    """Where the capture agent of ``bucket`` keeps its checkpoint: ``settings``' (an agent
    this process runs), else the one of its capture section (an agent running elsewhere)."""
    from dcp_cdc.agent.writer import checkpoint_name

    if settings is not None:
        return settings.checkpoint_path
    if bucket.capture is None:
        return None
    return config.capture_dirs(bucket)[2] / checkpoint_name(bucket.name, bucket.capture.agent_id)


def follow_settings(settings: CaptureSettings, config: AppConfig) -> CaptureSettings:
    """``settings`` with files closed at least every ``follow.rotate_seconds``."""
    rotate = min(settings.rotate_seconds, config.follow.rotate_seconds)
    return dataclasses.replace(settings, rotate_seconds=rotate)


def captures_of(config: AppConfig, buckets: Sequence[BucketConfig]) -> dict[str, CaptureSettings]:
    """The capture agents follow mode runs: one per bucket with a capture section."""
    from dcp_cdc.agent.driver import settings_from_config

    return {
        b.name: follow_settings(settings_from_config(config, b), config)
        for b in buckets
        if b.capture is not None
    }
