"""Follow mode without Spark: the signals, the lag against the agent's checkpoint, the status
line, the threads the agent and the demo's producer run in (the loop itself runs in
``tests/spark/test_follow.py``)."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from dcp_cdc.agent.positions import VbPosition
from dcp_cdc.agent.settings import CaptureSettings
from dcp_cdc.agent.writer import CheckpointStore
from dcp_cdc.config import AppConfig, BucketConfig, FollowConfig
from dcp_cdc.config.capture import CaptureConfig
from dcp_cdc.errors import AuthenticationError
from dcp_cdc.simulator.server import ProducerServer
from dcp_cdc.simulator.state import SimConfig
from pipelines.app.demo import DEMO_NODES, LoopThread, demo_simulation
from pipelines.follow import loop
from pipelines.follow.agent import AgentProcess, captured_seqnos, checkpoint_of, follow_settings
from pipelines.follow.entry import stop_signals
from pipelines.follow.progress import Batch, BucketProgress, status_line
from pipelines.observe.freshness import PROBABILITIES, ChangeTimes
from pipelines.quality.report import ExpectationOutcome, QualityReport


def _settings(tmp_path: Path, rotate: float = 300.0) -> CaptureSettings:
    return CaptureSettings.into(
        tmp_path,
        connection_string="couchbase://127.0.0.1:1",
        bucket="b",
        username="u",
        password="p",
        rotate_seconds=rotate,
    )


def _wait(event: threading.Event) -> bool:
    deadline = time.monotonic() + 5
    while not event.is_set() and time.monotonic() < deadline:
        time.sleep(0.01)  # the handler runs between two bytecodes of this thread
    return event.is_set()


def test_sigterm_asks_a_stop_sigusr1_a_check_and_a_second_ctrl_c_interrupts() -> None:
    before = signal.getsignal(signal.SIGTERM)
    stop, check = threading.Event(), threading.Event()
    with stop_signals(stop, check):
        os.kill(os.getpid(), signal.SIGUSR1)
        assert _wait(check) and not stop.is_set()
        os.kill(os.getpid(), signal.SIGTERM)
        assert _wait(stop)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_first_ctrl_c_only_asks_a_stop() -> None:
    stop, check = threading.Event(), threading.Event()
    with stop_signals(stop, check):
        os.kill(os.getpid(), signal.SIGINT)
        assert _wait(stop)


def test_the_lag_is_what_the_agent_captured_beyond_what_silver_applied(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    progress = BucketProgress(
        BucketConfig(name="b"), settings.checkpoint_path, applied={0: 10, 1: 7}
    )
    assert progress.lag() is None  # no checkpoint yet: unknown, not 0
    store = CheckpointStore(settings.checkpoint_path, bucket="b", bucket_uuid=None)
    store.commit({vb: VbPosition(vb, seqno, 99) for vb, seqno in {0: 10, 1: 12, 2: 5}.items()})
    assert captured_seqnos(settings.checkpoint_path, "b") == {0: 10, 1: 12, 2: 5}
    assert progress.lag() == (5 + 5, 2)
    progress.applied[1] = 20  # a rollback lowered the capture below silver for a moment
    assert progress.lag() == (5, 1)
    progress.as_of = 1000.0
    progress.window.extend([(995.0, 300), (1004.0, 200)])
    batch = Batch("b", 3, 200, 0.4, 1.1, files=2, lag=progress.lag())
    line = status_line(progress, batch, now=1005.0)
    assert "b: batch 3, 200 frames in 2 files (ingest 0.4 s, apply 1.1 s)" in line
    assert "lag 5 seqnos in 1 vbuckets" in line
    assert "50 events/s" in line  # 500 frames in the last 10 s
    assert "silver 5.0 s behind landing" in line


def test_the_demos_status_line_says_how_many_seconds_silver_is_behind_its_bucket() -> None:
    """The demo's bucket, served as ``run --follow`` serves it, dates its changes now: a
    batch of them committed right after they were made is seconds behind the bucket, not
    the age of a fixed simulated start."""
    server = ProducerServer(demo_simulation("b"), nodes=DEMO_NODES)
    bucket = server.sim.bucket
    highs = [vb.high_seqno for vb in bucket.vbuckets]

    async def steadily() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.3, stop.set)
        await server.steady_workload(200, stop)

    asyncio.run(steadily())
    cas = sorted(
        d.cas / 1e9
        for vb, high in zip(bucket.vbuckets, highs, strict=True)
        for d in vb.versions or ()
        if d.seqno > high
    )
    assert len(cas) > 10
    quantiles = tuple(cas[round(p * (len(cas) - 1))] for p in PROBABILITIES)
    now = time.time()
    progress = BucketProgress(BucketConfig(name="b"), None, as_of=now)
    progress.freshness.append(ChangeTimes(len(cas), quantiles, sum(cas), now))
    batch = Batch("b", 1, len(cas), 0.1, 0.2, change_times=progress.freshness[0])
    line = status_line(progress, batch, now)
    behind = float(line.split("silver ")[-1].split(" s behind the bucket")[0])
    assert 0 <= behind < 60, line


def test_follow_closes_the_agents_files_at_least_every_rotate_seconds(tmp_path: Path) -> None:
    config = AppConfig(
        landing=str(tmp_path),
        warehouse=str(tmp_path / "w"),
        buckets=[BucketConfig(name="b")],
        follow=FollowConfig(rotate_seconds=0.5),
    )
    assert follow_settings(_settings(tmp_path, 300.0), config).rotate_seconds == 0.5
    assert follow_settings(_settings(tmp_path, 0.2), config).rotate_seconds == 0.2


def test_a_loop_thread_raises_its_error_and_stops_on_request() -> None:
    async def fails(stop: asyncio.Event) -> None:
        raise ConnectionRefusedError("node 127.0.0.1:1 refused")

    thread = LoopThread("failing", fails)
    thread.start()
    thread.join(5)
    with pytest.raises(ConnectionRefusedError):
        thread.check()

    async def waits(stop: asyncio.Event) -> str:
        await stop.wait()
        return "stopped"

    waiting = LoopThread("waiting", waits)
    waiting.start()
    waiting.check()  # running: nothing to raise
    waiting.stop(timeout=5)
    assert waiting.result == "stopped"

    async def ends(stop: asyncio.Event) -> None:
        return None

    early = LoopThread("early", ends)
    early.start()
    early.join(5)
    with pytest.raises(RuntimeError, match="ended before it was stopped"):
        early.check()


def test_the_lag_of_an_agent_running_elsewhere_is_read_from_its_capture_section(
    tmp_path: Path,
) -> None:
    capture = CaptureConfig(
        connection_string="couchbase://cb1", username="u", password_env="X", agent_id="east"
    )
    config = AppConfig(
        landing=str(tmp_path),
        warehouse=str(tmp_path / "w"),
        buckets=[BucketConfig(name="b", capture=capture), BucketConfig(name="c")],
    )
    b, c = config.buckets
    expected = tmp_path / ".dcp-cdc-capture" / "b.east.checkpoint.json"
    assert checkpoint_of(config, b, None) == expected
    assert checkpoint_of(config, c, None) is None
    own = _settings(tmp_path)
    assert own.staging == own.state_dir == tmp_path / ".dcp-cdc-capture"
    assert (
        checkpoint_of(config, b, own)
        == own.checkpoint_path
        == tmp_path / (".dcp-cdc-capture/b.agent.checkpoint.json")
    )


def test_the_agent_process_raises_its_typed_error_and_stops_cleanly(tmp_path: Path) -> None:
    """The agent runs in a child process (out of the driver's GIL): a wrong password comes
    back as the same typed error, naming the node and not the password; a right one follows
    the bucket until stopped, and its checkpoint reaches every vbucket's high seqno."""
    sim = SimConfig(docs=60, ops=0, vbuckets=4)
    served: list[ProducerServer] = []
    started = threading.Event()

    async def serve(halt: asyncio.Event) -> None:
        async with ProducerServer(sim, nodes=2, users={"u": "right"}) as server:
            served.append(server)
            started.set()
            await halt.wait()

    producer = LoopThread("the test producer", serve)
    producer.start()
    try:
        assert started.wait(30)
        server = served[0]

        def agent(folder: str, password: str) -> tuple[AgentProcess, CaptureSettings]:
            settings = CaptureSettings.into(
                tmp_path / folder,
                connection_string=server.connection_string,
                bucket=sim.bucket,
                username="u",
                password=password,
                rotate_seconds=0.2,
            )
            return AgentProcess(settings), settings

        wrong, _ = agent("wrong", "not-the-password")
        wrong.start()
        wrong._process.join(60)
        with pytest.raises(AuthenticationError) as info:
            wrong.check()
        assert info.value.node.startswith("127.0.0.1:")
        assert "not-the-password" not in str(info.value)

        right, settings = agent("right", "right")
        right.start()
        highs = {vb.vbid: vb.high_seqno for vb in server.sim.bucket.vbuckets}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            right.check()  # following: nothing to raise
            done = settings.checkpoint_path.exists()
            if done and captured_seqnos(settings.checkpoint_path, sim.bucket) == highs:
                break
            time.sleep(0.2)
        right.stop(timeout=30)
        assert captured_seqnos(settings.checkpoint_path, sim.bucket) == highs
        assert list((tmp_path / "right").glob("*.dcpcap")), "no capture file landed"
    finally:
        producer.stop()


class _SparkContext:
    def setLocalProperty(self, key: str, value: str) -> None:
        pass


class _Spark:
    sparkContext = _SparkContext()


def _report(bucket: str, passed: bool) -> QualityReport:
    outcome = ExpectationOutcome(
        suite="snapshots",
        name="complete",
        severity="error",
        description="every snapshot complete",
        expectation_type="expect_column_values_to_be_in_set",
        success=passed,
        observed="",
    )
    return QualityReport(bucket=bucket, run_id="r", checked_at="now", outcomes=[outcome])


@pytest.mark.parametrize("verdicts", [(False, True), (True, False), (False, False)])
def test_a_round_of_checks_fails_when_any_bucket_fails_whatever_its_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, verdicts: tuple[bool, bool]
) -> None:
    buckets = [BucketConfig(name="first"), BucketConfig(name="second")]
    config = AppConfig(landing=str(tmp_path), warehouse=str(tmp_path / "w"), buckets=buckets)
    passed = dict(zip(("first", "second"), verdicts, strict=True))

    def check_bucket(
        spark: object, config: AppConfig, b: BucketConfig, at: object
    ) -> QualityReport:
        return _report(b.name, passed[b.name])

    monkeypatch.setattr(loop, "check_bucket", check_bucket)
    follower = loop.Follower(
        spark=_Spark(),  # type: ignore[arg-type]
        config=config,
        buckets=buckets,
        out=io.StringIO(),
        stop=threading.Event(),
    )
    follower._check({"first": {}, "second": {}})
    assert follower._check_error is None
    assert follower.failed_check

    passed.update(first=True, second=True)  # the next round passes everywhere: the verdict clears
    follower._check({"first": {}, "second": {}})
    assert not follower.failed_check
