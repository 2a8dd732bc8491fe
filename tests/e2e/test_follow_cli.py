"""``dcp-cdc run --follow --config`` as a user runs it: a process of its own with its Spark
session and capture agent, stopped by SIGTERM in the middle of its work and started again.

The first stop comes while micro-batches run, at a random instant after the first status
line; the process must finish the batch, stop the agent cleanly and exit 0. The restart
carries on (the same tables, the agent resuming from its checkpoint), runs the quality suites
when SIGUSR1 asks, and exits 0 on SIGTERM again. Here the quality suites reconcile silver with
bronze; ``tests/spark/test_follow.py`` proves silver against the producer's truth. Both run in
``make test-long`` (``DCP_CDC_FOLLOW=1``); ``make test`` checks the signals, the lag and the
threads (``tests/unit/test_follow.py``).
"""

from __future__ import annotations

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

    def __init__(self, config: Path) -> None:
        self.lines: list[str] = []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pipelines.cli", "run", "--follow", "--config", str(config)],
            env={**agent_env(), "DCP_CDC_LOG_LEVEL": "WARNING"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
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
