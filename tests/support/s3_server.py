"""A moto S3 (and DynamoDB) server on 127.0.0.1 for the tests of Spark on S3 (``s3a://``).

:class:`MotoS3Server` is a context manager: it starts moto's threaded server on a free
loopback port, and gives its endpoint, fixed test credentials, a bucket made on demand
(:meth:`create_bucket`), a boto3 client and the ``spark.hadoop.fs.s3a.*`` settings of a
session (or ``[spark.conf]`` of a configuration) that uses it. One server serves every driver
process of a test: moto keeps its state in the server process, so two Spark JVMs see the
same objects. moto's S3 honours conditional writes (``If-None-Match: *``), which the
several-writers log store relies on. ``process=True`` runs it in a child process instead, for
a client that holds the GIL while it waits for an answer (delta-rs does): a server thread of
the same process would never answer it.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
import time
from types import TracebackType
from typing import Any

from tests.support.ports import free_port

ACCESS_KEY = "dcp-cdc-test-access"
SECRET_KEY = "dcp-cdc-test-secret"
REGION = "us-east-1"


class MotoS3Server:
    """``with MotoS3Server() as s3: s3.create_bucket("lake")``; ``s3.endpoint`` is its URL."""

    def __init__(self, port: int = 0, *, process: bool = False) -> None:
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.process = process
        self._server: Any = None

    def __enter__(self) -> MotoS3Server:
        if self.process:
            self._start_process()
            return self
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        return self

    def _start_process(self, timeout_s: float = 30.0) -> None:
        command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._server = child
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.client().list_buckets()
                return
            except Exception:
                if child.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto did not start on port {self.port}") from None
                time.sleep(0.1)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> None:
        if isinstance(self._server, subprocess.Popen):
            self._server.terminate()
            self._server.wait(timeout=10)
        elif self._server is not None:
            self._server.stop()
        self._server = None

    @property
    def credentials(self) -> dict[str, str]:
        """The test keys as the AWS environment names them (moto accepts any)."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
        }

    def client(self, service: str = "s3") -> Any:
        import boto3

        return boto3.client(
            service,
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )

    def create_bucket(self, name: str) -> str:
        """Make bucket ``name`` (again is fine); returns ``s3a://name``."""
        s3 = self.client()
        with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
            s3.create_bucket(Bucket=name)
        return f"s3a://{name}"

    def spark_conf(self) -> dict[str, str]:
        """The ``spark.hadoop.fs.s3a.*`` settings that point S3A (and the landing reader, and
        the preflight) at this server with the test keys."""
        return {
            "spark.hadoop.fs.s3a.endpoint": self.endpoint,
            "spark.hadoop.fs.s3a.endpoint.region": REGION,
            "spark.hadoop.fs.s3a.path.style.access": "true",
            "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
            "spark.hadoop.fs.s3a.access.key": ACCESS_KEY,
            "spark.hadoop.fs.s3a.secret.key": SECRET_KEY,
            # a test server: fail fast instead of S3A's minutes of retries
            "spark.hadoop.fs.s3a.attempts.maximum": "2",
            "spark.hadoop.fs.s3a.retry.limit": "2",
        }
