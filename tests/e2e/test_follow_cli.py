"""``dcp-cdc run --follow --config`` as a user runs it: a process of its own with its Spark
session and capture agent, stopped by SIGTERM in the middle of its work and started again.

The first stop comes while micro-batches run, at a random instant after the first status
line; the process must finish the batch, stop the agent cleanly and exit 0. The restart
carries on (the same tables, the agent resuming from its checkpoint), runs the quality suites
when SIGUSR1 asks, and exits 0 on SIGTERM again. Here the quality suites reconcile silver with
bronze; ``tests/spark/test_follow.py`` proves silver against the producer's truth. Then the
catalog server follow mode starts on demand: killed with its whole process group (kill -9),
started again, stopped by SIGTERM, it leaves no process of its own behind. All run in ``make
test-long`` (``DCP_CDC_FOLLOW=1``); ``make test`` checks the signals, the lag and the threads
(``tests/unit/test_follow.py``) and the server's leases (``tests/unit/test_metastore_leases.py``,
``tests/e2e/test_shared_catalog.py``).
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from pipelines.catalog import server as metastore_server
from tests.support.capture_harness import agent_env, producer, write_config

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.environ.get("DCP_CDC_FOLLOW"),
        reason="make test-long (DCP_CDC_FOLLOW=1): two Spark processes and a quality check",
    ),
]


class Follow:
    """``dcp-cdc run --follow`` in a child process, its output collected line by line."""

    def __init__(self, config: Path, cwd: Path | None = None) -> None:
        """``cwd``: the process's folder, and a process group of its own (for ``killpg``)."""
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pipelines.app.cli", "run", "--follow", "--config", str(config)],
            env={**agent_env(), "DCP_CDC_LOG_LEVEL": "WARNING"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=cwd,
            start_new_session=cwd is not None,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    def wait_for(self, pattern: str, after: int = 0, timeout: float = 600) -> int:
        """Index of the first line from ``after`` on that matches ``pattern``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i in range(after, len(self.lines)):
                if re.search(pattern, self.lines[i]):
                    return i
            assert self.process.poll() is None, "".join(self.lines)[-4000:]
            time.sleep(0.1)
        raise AssertionError(f"no line matching {pattern!r}:\n" + "".join(self.lines)[-4000:])

    def stop(self) -> str:
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(timeout=240) == 0, "".join(self.lines)[-4000:]
        self.reader.join(10)
        return "".join(self.lines)


def test_sigterm_mid_work_exits_0_and_a_restart_carries_on(tmp_path: Path) -> None:
    bucket = f"fcli{uuid.uuid4().hex[:6]}"
    with producer(
        tmp_path, bucket=bucket, nodes=2, vbuckets=16, docs=300, ops=100_000, batch=20, pause=0.1
    ) as prod:
        config = write_config(
            tmp_path / "conf" / "follow.toml",
            landing=tmp_path / "landing",
            warehouse=tmp_path / "warehouse",
            bucket=bucket,
            connection_string=prod.info["connection_string"],
        )
        with open(config, "a", encoding="utf-8") as fh:
            fh.write("[follow]\ninterval_s = 0.5\nrotate_seconds = 0.3\ncheck_every_s = 0\n")
        first = Follow(config)
        batch = first.wait_for(rf"{bucket}: batch 1,")
        time.sleep(random.Random(os.getpid()).uniform(0.0, 3.0))
        text = first.stop()
        assert re.search(r"stopped after \d+ micro-batches", text), text[-3000:]
        assert "Traceback" not in text, text[-3000:]

        again = Follow(config)
        batch = again.wait_for(rf"{bucket}: batch 1,")
        line = again.lines[batch]
        assert "lag unknown" not in line  # the agent's checkpoint of the first run is read
        again.process.send_signal(signal.SIGUSR1)
        verdict = again.wait_for(rf"{bucket}: quality (PASSED|FAILED)", after=batch)
        assert "quality PASSED" in again.lines[verdict], "".join(again.lines)[-4000:]
        again.wait_for(rf"{bucket}: batch \d+,", after=verdict)
        text = again.stop()
        assert re.search(r"stopped after \d+ micro-batches", text), text[-3000:]
        frames = re.findall(r"batch \d+, ([\d,]+) frames", text)
        ingested = [int(m.replace(",", "")) for m in frames]
        assert sum(ingested) > 0, text[-3000:]


def _running_in(folder: Path) -> list[str]:
    """The processes whose working folder is ``folder`` or under it, as ``pid cmdline``: a
    follow process started there, its Spark driver and capture agent, and the catalog server
    and its watchdog (which run in the warehouse)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = Path(os.readlink(entry / "cwd"))
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if cmdline and cwd.is_relative_to(folder):
            found.append(f"{entry.name} {cmdline[:200]}")
    return found


def _none_left_in(folder: Path, within: float = 30.0) -> None:
    """No process of ours runs in ``folder`` within ``within`` seconds (a bounded wait)."""
    deadline = time.monotonic() + within
    while left := _running_in(folder):
        assert time.monotonic() < deadline, "still running:\n" + "\n".join(left)
        time.sleep(0.2)


def test_the_catalog_server_ends_with_follow_mode_also_after_kill_9(tmp_path: Path) -> None:
    """Follow mode on a local warehouse starts a metastore server on demand. Killed with its
    process group (kill -9: it cannot stop the server itself), started again, stopped by
    SIGTERM: each time no process of ours is left, the server's port is free, its record
    gone."""
    bucket = f"fkil{uuid.uuid4().hex[:6]}"
    warehouse = tmp_path / "warehouse"
    with producer(tmp_path, bucket=bucket, nodes=1, vbuckets=8, docs=100) as prod:
        config = write_config(
            tmp_path / "conf" / "follow.toml",
            landing=tmp_path / "landing",
            warehouse=warehouse,
            bucket=bucket,
            connection_string=prod.info["connection_string"],
        )
        with open(config, "a", encoding="utf-8") as fh:
            fh.write("[follow]\ninterval_s = 0.5\nrotate_seconds = 0.3\ncheck_every_s = 0\n")
        first = Follow(config, cwd=tmp_path)
        try:
            first.wait_for(rf"{bucket}: batch 1,")
            server = metastore_server.live_server(warehouse)
            assert server is not None, "follow mode started no metastore server"
            os.killpg(first.process.pid, signal.SIGKILL)
            first.process.wait(timeout=60)
            _none_left_in(tmp_path)
            assert not metastore_server.answers(server.host, server.port, timeout=1)

            again = Follow(config, cwd=tmp_path)
            again.wait_for(rf"{bucket}: batch 1,")
            second = metastore_server.live_server(warehouse)
            assert second is not None, "follow mode started no metastore server"
            text = again.stop()
            assert re.search(r"stopped after \d+ micro-batches", text), text[-3000:]
            _none_left_in(tmp_path)
            assert not metastore_server.answers(second.host, second.port, timeout=1)
            assert metastore_server.read_record(warehouse) is None
        finally:
            for pid in (int(line.split()[0]) for line in _running_in(tmp_path)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
