"""Where an apply starts reading bronze for each vbucket (``position_version``,
``pipelines/silver/walk.py::next_position``), and the vbuckets a walk got no frame of
(``pipelines/silver/state.py::idle_positions``): with every frame consumed, the next read
starts after the newest run read, so neither a vbucket's last change nor an idle vbucket holds
the others' read back."""

from __future__ import annotations

from typing import Any

import pytest

from pipelines.silver.state import idle_positions
from pipelines.silver.walk import next_position

SAVED = {"run_id": "run-4", "position_version": 5, "seen_version": 4, "consistent_seqno": 9}


@pytest.mark.parametrize(
    ("unconsumed", "last_read", "saved", "read_through", "expected"),
    [
        (("run-6", 6), ("run-7", 7), SAVED, 8, ("run-6", 6)),  # a frame left: read from it
        (None, ("run-7", 7), SAVED, 8, ("run-7", 9)),  # all consumed: after the newest read
        (None, None, SAVED, 8, ("run-4", 9)),  # nothing new for it
        (None, None, SAVED, 3, ("run-4", 5)),  # never back before the saved position
        (None, ("run-7", 7), SAVED, None, ("run-7", 7)),  # newest unknown: the last run read
        (None, None, SAVED, None, ("run-4", 5)),
        (None, None, None, None, (None, None)),
        (None, ("run-1", 1), None, 1, ("run-1", 2)),  # a vbucket's first walk
    ],
)
def test_next_position(
    unconsumed: tuple[str, int] | None,
    last_read: tuple[str, int] | None,
    saved: dict[str, Any] | None,
    read_through: int | None,
    expected: tuple[str | None, int | None],
) -> None:
    assert next_position(unconsumed, last_read, saved, read_through) == expected


def _states(*vbuckets: int) -> dict[int, dict[str, Any]]:
    return {vb: {"state": dict(SAVED, vbucket=vb), "position_run_id": "run-4"} for vb in vbuckets}


def test_a_vbucket_the_walk_got_no_frame_of_moves_past_the_newest_run_read() -> None:
    walked = {1: {"run_id": "run-8", "position_version": 9}}
    idle = idle_positions(_states(0, 1, 2), walked, read_through=8)
    assert set(idle) == {0, 2}  # the walked vbucket saves what its walk gave
    for vb in (0, 2):
        assert idle[vb] == {
            **SAVED,
            "vbucket": vb,
            "run_id": "run-4",
            "position_version": 9,
            "seen_version": 8,  # every run up to 8 was read: none of its frames can be late
        }


def test_without_the_newest_run_read_idle_vbuckets_keep_their_state() -> None:
    assert idle_positions(_states(0, 2), {}, read_through=None) == {}
