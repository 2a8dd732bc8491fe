"""The capture agent's S3 test server: :class:`~tests.support.s3_server.MotoS3Server` with a
bucket of its own (:func:`s3_server`), and what the agent's tests read back from it
(:class:`S3Server`): the agent's options, the keys below a prefix, the files downloaded.

moto keeps its buckets per process, so each server's bucket has a fresh name; a server
started again on the same port (:func:`s3_server` ``port=``) finds the objects it had.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dcp_cdc.agent.s3_store import S3Options
from tests.support.s3_server import ACCESS_KEY, REGION, SECRET_KEY, MotoS3Server

__all__ = ["ACCESS_KEY", "REGION", "SECRET_KEY", "S3Server", "s3_server"]


@dataclass
class S3Server:
    moto: MotoS3Server
    bucket: str

    @property
    def endpoint(self) -> str:
        return self.moto.endpoint

    @property
    def spark_conf(self) -> dict[str, str]:
        """``[spark.conf]`` settings that reach this server (the agent and bronze read them)."""
        return self.moto.spark_conf()

    @property
    def options(self) -> S3Options:
        """The agent's options, as :meth:`S3Options.from_spark_conf` makes them."""
        return S3Options.from_spark_conf(self.spark_conf)

    def client(self) -> Any:
        return self.moto.client()

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
        self.moto.stop()


@contextmanager
def s3_server(port: int = 0) -> Iterator[S3Server]:
    """moto's S3 server on 127.0.0.1 (a free port, or ``port``) with a bucket of its own;
    stopped at the end."""
    with MotoS3Server(port) as moto:
        s3 = S3Server(moto, f"cdc-landing-{uuid.uuid4().hex[:12]}")
        moto.create_bucket(s3.bucket)
        yield s3
