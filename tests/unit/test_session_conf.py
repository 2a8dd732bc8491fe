"""pipelines.lake.delta_io.session_conf: a setting held for a block, restored once no block holds
it, also when blocks of two threads overlap on one session (without a JVM: a session's
``conf`` is all it touches)."""

from __future__ import annotations

import threading
from typing import Any, cast

import pytest
from pyspark.sql import SparkSession

from pipelines.lake.delta_io import session_conf

KEY = "spark.databricks.delta.merge.materializeSource"


class Conf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = dict(values)

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value

    def unset(self, key: str) -> None:
        self.values.pop(key, None)


class Session:
    def __init__(self, **values: str) -> None:
        self.conf = Conf(values)


def _session(**values: str) -> Any:
    return cast(SparkSession, Session(**values))


def test_a_block_sets_and_restores_or_unsets() -> None:
    before, unset = _session(**{KEY: "auto"}), _session()
    for session in (before, unset):
        with session_conf(session, {KEY: "none"}):
            assert session.conf.get(KEY) == "none"
    assert before.conf.values == {KEY: "auto"}
    assert unset.conf.values == {}


def test_overlapping_blocks_in_threads_restore_once_the_last_ends() -> None:
    """The interleaving that left ``none`` behind: A enters, B enters (seeing A's value as
    "before"), A leaves, B leaves."""
    session = _session(**{KEY: "auto"})
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[str | None] = []

    def first() -> None:
        with session_conf(session, {KEY: "none"}):
            a_in.set()
            b_in.wait(5)
        a_out.set()

    def second() -> None:
        a_in.wait(5)
        with session_conf(session, {KEY: "none"}):
            b_in.set()
            a_out.wait(5)
            seen.append(session.conf.get(KEY))  # A has left: still held by B

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == ["none"]
    assert session.conf.values == {KEY: "auto"}


def test_a_block_wanting_another_value_beside_a_holder_is_refused() -> None:
    session = _session()
    refused = pytest.raises(RuntimeError, match="held at 'none'")
    with session_conf(session, {KEY: "none"}), refused, session_conf(session, {"o": "1", KEY: "a"}):
        pass
    assert session.conf.values == {}  # nothing of the refused block stays either


def test_an_error_in_the_block_restores_too() -> None:
    session = _session(**{KEY: "auto"})
    with pytest.raises(ValueError), session_conf(session, {KEY: "none"}):
        raise ValueError("boom")
    assert session.conf.values == {KEY: "auto"}
