"""``make s3-up`` (build-support/local_s3.py): an S3 API on loopback with the buckets asked
for, the settings it prints pointing at it, and a clean stop on SIGTERM."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
UP = (sys.executable, str(ROOT / "build-support" / "local_s3.py"), "up")


def test_up_serves_the_buckets_it_prints_settings_for_and_stops_on_sigterm() -> None:
    import boto3

    port = free_port()
    process = subprocess.Popen(
        [*UP, "--port", str(port), "--bucket", "lake", "--bucket", "landing"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert first.startswith(f"S3 API on http://127.0.0.1:{port}; buckets: lake, landing"), (
            first + (process.stderr.read() if process.poll() is not None else "")
        )
        lines = [process.stdout.readline() for _ in range(12)]
        printed = "".join(lines)
        assert f'"spark.hadoop.fs.s3a.endpoint" = "http://127.0.0.1:{port}"' in printed
        keys = dict(
            part.split("=", 1)
            for line in lines
            if line.startswith("export ")
            for part in line.split()[1:]
        )
        client = boto3.client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{port}",
            aws_access_key_id=keys["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=keys["AWS_SECRET_ACCESS_KEY"],
            region_name=keys["AWS_DEFAULT_REGION"],
        )
        names = {b["Name"] for b in client.list_buckets()["Buckets"]}
        assert names == {"lake", "landing"}
        client.put_object(Bucket="lake", Key="a", Body=b"x")
        # a second writer of the same key is refused: the conditional write the log store needs
        refused = None
        try:
            client.put_object(Bucket="lake", Key="a", Body=b"y", IfNoneMatch="*")
        except client.exceptions.ClientError as error:
            refused = error.response["ResponseMetadata"]["HTTPStatusCode"]
        assert refused == 412
    finally:
        process.send_signal(signal.SIGTERM)
        status = process.wait(timeout=30)
    assert status == 0
    started = time.monotonic()
    while time.monotonic() - started < 5:  # the port is free again
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) != 0:
                break
        time.sleep(0.1)
    else:
        raise AssertionError(f"port {port} still answers after the stop")


def test_a_taken_port_is_a_clear_error() -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        done = subprocess.run(
            [*UP, "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 2
    assert f"local_s3.py: cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "Traceback" not in done.stderr
