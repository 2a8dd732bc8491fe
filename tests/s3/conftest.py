"""Fixtures of the tests of Spark on S3: one moto server per module (tests/support/s3_server.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.s3_server import MotoS3Server


@pytest.fixture(scope="module")
def s3_server() -> Iterator[MotoS3Server]:
    with MotoS3Server() as server:
        yield server
