"""The capture agent beside follow mode's loop: each bucket's agent follows the cluster in a
child process (:class:`AgentProcess`), closing files at least every ``follow.rotate_seconds``;
where its checkpoint is, and the seqnos it reached (the lag is read from them).

This module imports no Spark: the agent's child process imports it (to run
:func:`_agent_main`) and needs none.
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
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path

from dcp_cdc.agent.driver import capture
from dcp_cdc.agent.landing_store import join_location
from dcp_cdc.agent.s3_store import S3Options
from dcp_cdc.agent.settings import CaptureSettings, settings_from_config
from dcp_cdc.agent.writer import CheckpointStore, checkpoint_name
from dcp_cdc.config import AppConfig, BucketConfig
from dcp_cdc.logs import LogFormat, configure_logging, current_format, log_context

log = logging.getLogger("dcp_cdc.follow")


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
        logs = (logging.getLogger().getEffectiveLevel(), current_format())  # as this process's
        self._process = ctx.Process(
            target=_agent_main, args=(settings, logs, self._sender), name=self.name, daemon=True
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


def _agent_main(
    settings: CaptureSettings, logs: tuple[int, LogFormat], outcome: Connection
) -> None:
    """The child of :class:`AgentProcess`: follow until SIGTERM or an orphaning, logging as
    its parent does (``logs``: level and format); the error that ended it goes back through
    ``outcome`` (a picklable copy of it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    configure_logging(*logs)
    try:
        with log_context(bucket=settings.bucket):
            asyncio.run(_follow_until_stopped(settings, os.getppid()))
    except BaseException as exc:
        try:
            copy = pickle.loads(pickle.dumps(exc))
        except Exception:  # an error that does not pickle: its type and text
            copy = RuntimeError(f"{type(exc).__name__}: {exc}")
        outcome.send(copy)
        raise SystemExit(1) from None


async def _follow_until_stopped(settings: CaptureSettings, parent: int) -> None:
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


def captured_seqnos(
    checkpoint: Path | str, bucket: str, s3: S3Options | None = None
) -> dict[int, int]:
    """vbucket -> the seqno the agent's files reach (its checkpoint, a path or an ``s3://``
    URI); {} before the first."""
    store = CheckpointStore(checkpoint, bucket=bucket, bucket_uuid=None, s3=s3)
    return {vb: p.seqno for vb, p in store.load().items()}  # replaced by rename: never torn


def checkpoint_of(
    config: AppConfig, bucket: BucketConfig, settings: CaptureSettings | None
) -> Path | str | None:
    """Where the capture agent of ``bucket`` keeps its checkpoint: ``settings``' (an agent
    this process runs), else the one of its capture section (an agent running elsewhere)."""
    if settings is not None:
        return settings.checkpoint_path
    if bucket.capture is None:
        return None
    name = checkpoint_name(bucket.name, bucket.capture.agent_id)
    return join_location(config.capture_dirs(bucket).state, name)


def follow_settings(settings: CaptureSettings, config: AppConfig) -> CaptureSettings:
    """``settings`` with files closed at least every ``follow.rotate_seconds``."""
    rotate = min(settings.rotate_seconds, config.follow.rotate_seconds)
    return dataclasses.replace(settings, rotate_seconds=rotate)


def captures_of(config: AppConfig, buckets: Sequence[BucketConfig]) -> dict[str, CaptureSettings]:
    """The capture agents follow mode runs: one per bucket with a capture section."""
    return {
        b.name: follow_settings(settings_from_config(config, b), config)
        for b in buckets
        if b.capture is not None
    }
