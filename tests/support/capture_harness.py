"""What the capture-agent tests share: the test producer as a child process, the agent's
configuration, and the checks (every landed file whole, the captures against the truth).

The producer (``python -m dcp_cdc.simulator.server``) serves a simulated bucket from several
nodes on 127.0.0.1 and takes faults on its control port; the agent is the real command line,
``dcp-cdc capture``, so that a test can kill it with SIGKILL.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dcp_cdc.agent.settings import CaptureSettings
from dcp_cdc.capture import iter_capture
from dcp_cdc.errors import MalformedFrameError
from dcp_cdc.simulator.server import ProducerServer
from tests.support.reference_consumer import ReferenceConsumer

PASSWORD_ENV = "DCP_CDC_TEST_CAPTURE_PASSWORD"
IN_PROCESS_BUCKET = "travel-sample"
"""The bucket of a :class:`ProducerServer` made from a default :class:`SimConfig`."""
USER, PASSWORD = "dcp-reader", "s3cret-Passw0rd"


@dataclass
class Producer:
    process: subprocess.Popen[bytes]
    info: dict[str, Any]
    truth_out: Path

    def control(self, command: str) -> str:
        with socket.create_connection(("127.0.0.1", self.info["control_port"]), timeout=30) as s:
            s.sendall(command.encode() + b"\n")
            answer = s.makefile("rb").readline().decode().strip()
        assert answer.startswith("ok"), f"{command}: {answer}"
        return answer

    def wait_workload(self, timeout: float = 300) -> None:
        """Until the workload finished (the producer wrote the truth then)."""
        summary = self.truth_out / "truth" / "summary.json"
        deadline = time.monotonic() + timeout
        while not summary.exists():
            assert self.process.poll() is None, "the producer exited"
            assert time.monotonic() < deadline, "the workload did not finish in time"
            time.sleep(0.1)


@contextmanager
def producer(tmp: Path, **options: Any) -> Iterator[Producer]:
    """The test producer in a child process, the password of its user from the environment
    (as docs/deployment.md starts it); stopped (SIGTERM) at the end."""
    port_file = tmp / "producer.json"
    truth_out = tmp / "producer-truth"
    args = [sys.executable, "-m", "dcp_cdc.simulator.server", "--port-file", str(port_file)]
    args += ["--truth-out", str(truth_out), "--user", USER, "--password-env", PASSWORD_ENV]
    for name, value in options.items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    process = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=agent_env()
    )
    try:
        deadline = time.monotonic() + 120
        while not port_file.exists():
            if process.poll() is not None:
                raise AssertionError(process.stderr.read().decode()[-3000:])  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the producer did not start"
            time.sleep(0.05)
        yield Producer(process, json.loads(port_file.read_text()), truth_out)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def write_config(
    path: Path,
    *,
    landing: Path,
    warehouse: Path,
    bucket: str,
    connection_string: str,
    **capture: Any,
) -> Path:
    """A configuration whose one bucket has a ``[buckets.capture]`` section. Its Spark
    settings are the shared test session's (tests/spark/conftest.py): a job run in the test's
    process applies its ``[spark]`` runtime settings to that session."""
    lines = [
        f'landing = "{landing}"',
        f'warehouse = "{warehouse}"',
        "[spark]",
        "shuffle_partitions = 2",
        "[[buckets]]",
        f'name = "{bucket}"',
        "[buckets.capture]",
        f'connection_string = "{connection_string}"',
        f'username = "{USER}"',
        f'password_env = "{PASSWORD_ENV}"',
    ]
    lines += [f"{k} = {json.dumps(v)}" for k, v in capture.items()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def agent_command(config: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "pipelines.app.cli", "capture", "--config", str(config), *flags]


def agent_env() -> dict[str, str]:
    return {**os.environ, PASSWORD_ENV: PASSWORD}


def assert_landing_whole(landing: Path, seen: set[Path] | None = None) -> int:
    """Every capture file in ``landing`` (not yet in ``seen``) decodes to its last byte: no
    partly written file was ever renamed into it. Returns how many files were read."""
    read = 0
    for path in sorted(landing.glob("*.dcpcap")):
        if seen is not None and path in seen:
            continue
        errors = [e for e in iter_capture(path) if isinstance(e, MalformedFrameError)]
        assert not errors, f"{path.name}: {errors[0]}"
        read += 1
        if seen is not None:
            seen.add(path)
    return read


def truth_documents(truth_out: Path) -> dict[tuple[int, bytes], dict[str, Any]]:
    docs = {}
    for line in (truth_out / "truth" / "documents.jsonl").read_text().splitlines():
        d = json.loads(line)
        key = d["key"].encode() if "key" in d else base64.b64decode(d["key_b64"])
        docs[(d["collection_id"], key)] = d
    return docs


def assert_captures_equal_truth(landing: Path, truth_out: Path) -> int:
    """The reference consumer over every capture in ``landing`` ends with the truth: the same
    live keys, and per key the same seqno, rev seqno, body, xattrs, expiry, flags and CAS.
    Returns the number of live documents."""
    consumer = ReferenceConsumer()
    consumer.consume(landing)
    assert not consumer.errors, consumer.errors[:3]
    live = consumer.state()
    truth = truth_documents(truth_out)
    missing, extra = set(truth) - set(live), set(live) - set(truth)
    assert not missing and not extra, f"missing {sorted(missing)[:3]}, extra {sorted(extra)[:3]}"
    for ident, d in truth.items():
        v = live[ident]
        body = d["value"].encode() if "value" in d else base64.b64decode(d["value_b64"])
        got = (v.seqno, v.rev_seqno, v.value, v.xattrs, v.expiry, v.flags, v.cas)
        want = (d["seqno"], d["rev_seqno"], body, d["xattrs"], d["expiry"], d["flags"], d["cas"])
        assert got == want, f"{ident}: {got[:2]} != {want[:2]}"
    return len(truth)


# --- the agent in process, against a ProducerServer in the same event loop ---------------


def in_process_settings(tmp: Path, connection_string: str, **changes: Any) -> CaptureSettings:
    """Capture settings for a test: small buffers and files, short timers, quick backoff."""
    base: dict[str, Any] = {
        "connection_string": connection_string,
        "bucket": IN_PROCESS_BUCKET,
        "username": "Administrator",
        "password": "password",
        "landing": tmp / "landing",
        "staging": tmp / "landing" / ".dcp-cdc-capture",
        "state_dir": tmp / "state",
        "buffer_bytes": 1 << 16,
        "connect_timeout_s": 5.0,
        "rotate_seconds": 0.3,
        "backoff_s": 0.05,
        "noop_interval_s": 2,
    }
    base.update(changes)
    return CaptureSettings(**base)


def truth_seqnos(server: ProducerServer, out: Path) -> dict[tuple[int, bytes], tuple[int, int]]:
    """The bucket's live documents now: (collection, key) → (seqno, rev seqno)."""
    server.write_truth(out)
    return {ident: (d["seqno"], d["rev_seqno"]) for ident, d in truth_documents(out).items()}


def captured_seqnos(landing: Path) -> dict[tuple[int, bytes], tuple[int, int]]:
    """The reference consumer over every capture in ``landing``: the same shape."""
    consumer = ReferenceConsumer()
    consumer.consume(landing)
    assert consumer.errors == []
    return {k: (v.seqno, v.rev_seqno) for k, v in consumer.state().items()}
