"""The embedded demo of ``dcp-cdc run`` and ``dcp-cdc run --follow``: a small simulated
bucket served over DCP by the test producer (data nodes on 127.0.0.1) and captured by the
capture agent, in a work folder made afresh each time. The bucket is made when it is served
and keeps this host's clock (:class:`~dcp_cdc.simulator.server.ProducerServer`), so its
documents with a TTL are in the views until their expiry and follow mode's freshness is
how far silver really is behind it.

The configuration is the one every verb uses when given none
(:data:`dcp_cdc.config.CONFIG_RULE`) but for its landing and warehouse, which go under the
work folder. ``dcp-cdc run`` serves a live workload with a failover and a rebalance on the
way and captures it (:func:`demo_capture`); ``run --follow`` serves a steady live workload
in a thread (:func:`served_steadily`) while its agent follows it.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

from dcp_cdc.agent.driver import capture
from dcp_cdc.agent.settings import CaptureSettings, CaptureSummary
from dcp_cdc.config import AppConfig, load_config
from dcp_cdc.simulator import SimConfig
from dcp_cdc.simulator.server import ProducerServer
from pipelines.catalog.server import vacated

DEMO_NODES = 4
DEMO_USER = "dcp-cdc-demo"


def fresh_workdir(workdir: str | Path) -> tuple[Path, AppConfig]:
    """The demo's folder (its landing, truth and warehouse removed: the demo starts afresh)
    and the configuration with its landing and warehouse there. An on-demand metastore server
    no process holds (a killed demo's, which its watchdog is about to stop) is stopped first;
    any other server that runs is an error (:func:`pipelines.catalog.server.vacated`)."""
    from pipelines.lake.spark_session import delta_jars_dir

    target = Path(workdir).resolve()
    with vacated(target / "warehouse", jars=delta_jars_dir()):
        for folder in ("landing", "truth", "warehouse"):
            if (target / folder).exists():
                shutil.rmtree(target / folder)
    config = load_config(None, landing=str(target / "landing"), warehouse=str(target / "warehouse"))
    return target, config


def demo_simulation(bucket: str) -> SimConfig:
    """The bucket the demo serves: its initial load, then ``ops`` live changes."""
    return SimConfig(scenario="mixed", seed=1, bucket=bucket, vbuckets=16, docs=400, ops=2000)


def demo_settings(
    connection_string: str, bucket: str, user: str, password: str, landing: Path, rotate: float
) -> CaptureSettings:
    """The capture agent's settings for the demo's producer: files into ``landing``, closed
    at 1 MiB or every ``rotate`` seconds."""
    return CaptureSettings.into(
        landing,
        connection_string=connection_string,
        bucket=bucket,
        username=user,
        password=password,
        rotate_bytes=1 << 20,
        rotate_seconds=rotate,
    )


def demo_capture(target: Path, sim: SimConfig) -> tuple[CaptureSummary, CaptureSummary]:
    """Serve ``sim`` from the test producer and capture it as a user would a cluster: the
    agent follows the live workload (through a failover and a rebalance half-way), is stopped,
    then captures ``--until now``. The truth of the bucket goes to ``target/truth``."""
    return asyncio.run(_demo_capture(target, sim))


async def _demo_capture(target: Path, sim: SimConfig) -> tuple[CaptureSummary, CaptureSummary]:
    user, password = DEMO_USER, secrets.token_urlsafe(18)  # this run's only
    async with ProducerServer(sim, nodes=DEMO_NODES, users={user: password}) as server:
        settings = demo_settings(
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


@contextlib.contextmanager
def served_steadily(sim: SimConfig, rate: float) -> Iterator[tuple[str, str, str]]:
    """``sim``'s bucket served by the test producer in a thread of its own, with a steady
    live workload of ``rate`` changes a second, until the block ends; yields the connection
    string, the user and this run's password."""
    user, password = DEMO_USER, secrets.token_urlsafe(18)
    served: list[str] = []
    started = threading.Event()

    async def serve(halt: asyncio.Event) -> None:
        async with ProducerServer(sim, nodes=DEMO_NODES, users={user: password}) as server:
            served.append(server.connection_string)
            started.set()
            await server.steady_workload(rate, halt)

    producer = LoopThread("the demo's test producer", serve)
    producer.start()
    try:
        while not started.wait(0.1):
            producer.check()
        yield served[0], user, password
    finally:
        producer.stop()


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
