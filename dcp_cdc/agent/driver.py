"""The capture agent's entry: :func:`capture` (one run in the running event loop) and
:func:`run` (in a fresh loop, stopped cleanly by SIGTERM or SIGINT).

The agent is three layers, each in its module: the sans-I/O protocol rules
(:mod:`dcp_cdc.agent.consumer`), one connection's socket, session files and tasks
(:mod:`dcp_cdc.agent.node`), and which vbucket streams where (:mod:`dcp_cdc.agent.placement`);
what a run is given and reports is :mod:`dcp_cdc.agent.settings`.

Secrets: the password reaches only the SASL exchange; nothing here logs it, and a log line
that would show it, or the object store's keys, has them masked (:mod:`dcp_cdc.logs`).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable

from dcp_cdc.agent.placement import Placement
from dcp_cdc.agent.s3_store import S3Options
from dcp_cdc.agent.settings import CaptureSettings, CaptureSummary, Mode
from dcp_cdc.logs import log_context, register_secret


async def capture(
    settings: CaptureSettings,
    *,
    mode: Mode = "until-now",
    stop: asyncio.Event | None = None,
) -> CaptureSummary:
    """Capture ``settings.bucket`` into ``settings.landing``.

    ``until-now``: every vbucket of the range up to its high seqno at the start
    (GET_ALL_VB_SEQNOS), then stop. ``follow``: until ``stop`` is set. Either way the end is
    clean: streams closed, files closed and renamed, the checkpoint committed. Its log lines
    name the bucket."""
    if mode not in ("until-now", "follow"):
        raise ValueError(f"mode must be 'until-now' or 'follow', got {mode!r}")
    # also where the settings came by pickle (the agent's child process), or were built by hand
    for secret in (settings.password, *(_s3_secrets(settings.s3) if settings.s3 else ())):
        register_secret(secret)
    with log_context(bucket=settings.bucket):  # the tasks it starts inherit it
        agent = Placement(settings, mode, stop or asyncio.Event())
        return await agent.run()


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
