"""An S3 API server on 127.0.0.1 for the capture agent's tests: moto's server mode in a
thread (:func:`s3_server`), with a bucket made, and what the agent and bronze need to reach
it (:class:`S3Server`): the endpoint, test keys, the ``[spark.conf]`` settings.

moto's server speaks the S3 REST API over HTTP, conditional writes included (``If-Match``,
``If-None-Match: *``), so the agent's boto3 client talks to it as to a store.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from moto.server import ThreadedMotoServer

from dcp_cdc.agent.s3_store import S3Options

ACCESS_KEY, SECRET_KEY, REGION = "dcp-cdc-test-key", "dcp-cdc-test-Secret/0", "us-east-1"


@dataclass
class S3Server:
    server: ThreadedMotoServer
    endpoint: str
    bucket: str

    @property
    def options(self) -> S3Options:
        """The agent's options, as :meth:`S3Options.from_spark_conf` makes them."""
        return S3Options.from_spark_conf(self.spark_conf)

    @property
    def spark_conf(self) -> dict[str, str]:
        """``[spark.conf]`` settings that reach this server (the agent and bronze read them)."""
        s3a = "spark.hadoop.fs.s3a."
        return {
            f"{s3a}endpoint": self.endpoint,
            f"{s3a}access.key": ACCESS_KEY,
            f"{s3a}secret.key": SECRET_KEY,
            f"{s3a}endpoint.region": REGION,
            f"{s3a}path.style.access": "true",
        }

    def client(self) -> Any:
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        )

    def keys(self, prefix: str = "") -> list[str]:
        pages = (
            self.client()
            .get_paginator("list_objects_v2")
            .paginate(Bucket=self.bucket, Prefix=prefix)
        )
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def download(self, prefix: str, into: Path, suffix: str = ".dcpcap") -> Path:
        """Every object below ``prefix`` ending with ``suffix``, as files in ``into``."""
        into.mkdir(parents=True, exist_ok=True)
        client = self.client()
        for key in self.keys(prefix):
            if key.endswith(suffix):
                body = client.get_object(Bucket=self.bucket, Key=key)["Body"].read()
                (into / key.rsplit("/", 1)[-1]).write_bytes(body)
        return into

    def stop(self) -> None:
        self.server.stop()


@contextmanager
def s3_server(port: int = 0) -> Iterator[S3Server]:
    """moto's S3 server on 127.0.0.1 (a free port, or ``port``) with a bucket of its own
    (moto keeps its buckets per process, so each server's has a fresh name); stopped at the
    end."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    host, bound = server.get_host_and_port()
    s3 = S3Server(server, f"http://{host}:{bound}", f"cdc-landing-{uuid.uuid4().hex[:12]}")
    try:
        s3.client().create_bucket(Bucket=s3.bucket)
        yield s3
    finally:
        server.stop()
