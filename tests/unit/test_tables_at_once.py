"""A step makes a bucket's tables several at once (``delta_io.each_at_once``): every
table is made, and a failure of one is raised only after the others ended."""

from __future__ import annotations

import threading
import time

import pytest

from pipelines.lake import delta_io


def test_every_item_is_ensured_on_threads_of_its_own() -> None:
    seen: dict[str, str] = {}
    lock = threading.Lock()

    def ensure(name: str) -> None:
        time.sleep(0.3)
        with lock:
            seen[name] = threading.current_thread().name

    names = [f"silver.t{i}" for i in range(6)]
    delta_io.each_at_once(ensure, names)
    assert sorted(seen) == names
    assert len(set(seen.values())) == delta_io.TABLE_THREADS
    assert all(t.startswith("delta-tables") for t in seen.values())


def test_one_table_is_made_on_the_callers_thread() -> None:
    seen: list[str] = []
    delta_io.each_at_once(lambda name: seen.append(threading.current_thread().name), ["t"])
    assert seen == [threading.current_thread().name]


def test_a_failure_is_raised_after_every_other_table_ended() -> None:
    ended: list[str] = []

    def ensure(name: str) -> None:
        if name == "bad":
            raise RuntimeError("the catalog refused bad")
        time.sleep(0.2)
        ended.append(name)

    with pytest.raises(RuntimeError, match="refused bad"):
        delta_io.each_at_once(ensure, ["bad", "a", "b", "c"])
    assert sorted(ended) == ["a", "b", "c"]
