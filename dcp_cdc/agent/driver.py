"""The capture agent's entry: :func:`capture` (one run in the running event loop) and
:func:`run` (in a fresh loop, stopped cleanly by SIGTERM or SIGINT).

The agent is three layers, each in its module: the sans-I/O protocol rules
(:mod:`dcp_cdc.agent.consumer`), one connection's socket, session files and tasks
(:mod:`dcp_cdc.agent.node`), and which vbucket streams where (:mod:`dcp_cdc.agent.placement`);
what a run is given and reports is :mod:`dcp_cdc.agent.settings`.

Metrics and health (docs/metrics.md): with ``metrics_port`` set, a run serves ``/metrics``,
``/healthz`` and ``/readyz`` (:mod:`dcp_cdc.agent.metrics_server`) from its own event loop for
as long as it runs; or it attaches itself to a :class:`~dcp_cdc.agent.metrics.Monitoring`
its caller serves (one per process, shared by the runs in it).

Secrets: the password reaches only the SASL exchange; nothing here logs it, and a log line
that would show it, or the object store's keys, has them masked (:mod:`dcp_cdc.logs`).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from dcp_cdc.agent.placement import Placement
from dcp_cdc.agent.progress import RunReport, run_report
from dcp_cdc.agent.s3_store import S3Options
from dcp_cdc.agent.settings import CaptureSettings, CaptureSummary, Mode
from dcp_cdc.logs import log_context, register_secret

if TYPE_CHECKING:
    from dcp_cdc.agent.metrics import Monitoring


async def capture(
    settings: CaptureSettings,
    *,
    mode: Mode = "until-now",
    stop: asyncio.Event | None = None,
    monitoring: Monitoring | None = None,
) -> CaptureSummary:
    """Capture ``settings.bucket`` into ``settings.landing``.

    ``until-now``: every vbucket of the range up to its high seqno at the start
    (GET_ALL_VB_SEQNOS), then stop. ``follow``: until ``stop`` is set. Either way the end is
    clean: streams closed, files closed and renamed, the checkpoint committed. Its log lines
    name the bucket.

    ``monitoring``: the run's metrics and readiness check join it, and whoever made it
    serves it (``settings.metrics_port`` is not used then); without it, a run whose
    ``metrics_port`` is set serves its own."""
    if mode not in ("until-now", "follow"):
        raise ValueError(f"mode must be 'until-now' or 'follow', got {mode!r}")
    # also where the settings came by pickle (the agent's child process), or were built by hand
    for secret in (settings.password, *(_s3_secrets(settings.s3) if settings.s3 else ())):
        register_secret(secret)
    with log_context(bucket=settings.bucket):  # the tasks it starts inherit it
        agent = Placement(settings, mode, stop or asyncio.Event())
        if monitoring is None and settings.metrics_port is None:
            return await agent.run()
        return await _monitored(agent, monitoring)


async def _monitored(agent: Placement, monitoring: Monitoring | None) -> CaptureSummary:
    """``agent``'s run attached to ``monitoring``, or to one of its own served on its
    ``metrics_port`` from now until the run ends."""
    from dcp_cdc.agent.metrics import Monitoring
    from dcp_cdc.agent.metrics_server import MetricsServer

    s = agent.settings
    server = None
    if monitoring is None:
        assert s.metrics_port is not None
        monitoring = Monitoring()
        server = MetricsServer(monitoring, s.metrics_host, s.metrics_port)
        await server.start()

    def report() -> RunReport | None:
        return run_report(agent, time.monotonic(), time.time())

    try:
        with monitoring.attach(f"{s.bucket}/{s.agent_id}", report):
            return await agent.run()
    finally:
        if server is not None:
            await server.close()


def _s3_secrets(s3: S3Options) -> tuple[str | None, ...]:
    return (s3.access_key, s3.secret_key, s3.session_token)


def run(
    settings: CaptureSettings,
    *,
    mode: Mode = "until-now",
    on_signal: Callable[[int], None] | None = None,
) -> CaptureSummary:
    """:func:`capture` in a fresh event loop; SIGTERM and SIGINT stop it cleanly."""

    async def main() -> CaptureSummary:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        installed = []
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):

                def handler(sig: int = sig) -> None:
                    if on_signal is not None:
                        on_signal(sig)
                    stop.set()

                loop.add_signal_handler(sig, handler)
                installed.append(sig)
        try:
            return await capture(settings, mode=mode, stop=stop)
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    return asyncio.run(main())
