"""The capture agent's writer and checkpoints: rotation, whole frames, durability order.

The crash test kills a real writer process with SIGKILL at random moments and checks what the
next start finds: every capture file in landing parses whole, the checkpoint loads, and no
checkpoint position is ahead of the frames in landing (replays are fine, gaps are not).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dcp_cdc.agent.positions import VbPosition
from dcp_cdc.agent.writer import (
    CHECKPOINT_FORMAT,
    CheckpointStore,
    SessionWriter,
    clear_staging,
    rfc3339,
    session_id,
)
from dcp_cdc.capture import iter_capture, read_capture_header
from dcp_cdc.encoder import encode, make_header
from dcp_cdc.errors import CheckpointError, MalformedFrameError
from dcp_cdc.events import Mutation
from dcp_cdc.protocol import Opcode

ROOT = Path(__file__).resolve().parents[2]
T0 = 1767225600.0  # 2026-01-01T00:00:00Z
STARTED = "2026-01-01T00:00:00.000000Z"


def mutation(vbucket: int, seqno: int, value: bytes = b'{"v":1}') -> bytes:
    h = make_header(Opcode.DCP_MUTATION, vbucket=vbucket)
    return encode(Mutation(h, seqno, 1, 0, 0, 0, 0, 0, None, b"k%04d" % seqno, value, None))


def session(tmp_path: Path, **kw: object) -> SessionWriter:
    args: dict[str, object] = {
        "bucket": "b",
        "session_id": "b-agent-20260101T000000.000000Z-0-0",
        "collections": False,
        "features": ("xattr", "snappy"),
        "source": "couchbase://node1:11210",
        "started_at": STARTED,
        "rotate_bytes": 1 << 20,
        "rotate_seconds": 300.0,
    } | kw
    landing = tmp_path / "landing"
    return SessionWriter(landing, landing / ".dcp-cdc-capture", **args)  # type: ignore[arg-type]


def seqnos(path: Path) -> list[tuple[int, int]]:
    """(vbucket, by_seqno) of every frame; fails on any malformed or cut frame."""
    out = []
    for event in iter_capture(path):
        assert not isinstance(event, MalformedFrameError), event
        assert isinstance(event, Mutation)
        out.append((event.header.vbucket_or_status, event.by_seqno))
    return out


def test_nothing_in_landing_before_close_then_a_whole_file(tmp_path: Path) -> None:
    writer = session(tmp_path)
    assert writer.close_file() is None  # nothing open yet
    writer.write(mutation(3, 1) + mutation(3, 2), T0)
    writer.write(mutation(4, 1), T0 + 1)
    landing = tmp_path / "landing"
    assert list(landing.glob("*.dcpcap")) == []
    [partial] = (landing / ".dcp-cdc-capture").iterdir()
    assert partial.name == "b-agent-20260101T000000.000000Z-0-0-00000.dcpcap.partial"
    path = writer.close_file()
    assert path == landing / "b-agent-20260101T000000.000000Z-0-0-00000.dcpcap"
    assert list((landing / ".dcp-cdc-capture").iterdir()) == []
    assert seqnos(path) == [(3, 1), (3, 2), (4, 1)]
    header, _ = read_capture_header(path)
    assert header.session_id == "b-agent-20260101T000000.000000Z-0-0"
    assert header.sequence == 0
    assert header.started_at == STARTED
    assert header.model_extra == {"opened_at": "2026-01-01T00:00:00.000000Z"}
    assert header.features == ("xattr", "snappy")
    assert header.source == "couchbase://node1:11210"
    assert header.bucket == "b" and header.collections is False


def test_rotation_by_size_never_splits_a_frame(tmp_path: Path) -> None:
    writer = session(tmp_path, rotate_bytes=1000)
    frame_len = len(mutation(0, 1, b"x" * 100))
    written = []
    for seqno in range(1, 61):
        writer.write(mutation(seqno % 3, seqno, b"x" * 100), T0)
        written.append((seqno % 3, seqno))
        if writer.due(T0):
            assert writer.close_file() is not None
    writer.close_file()
    paths = sorted((tmp_path / "landing").glob("*.dcpcap"))
    assert paths == writer.closed_paths
    assert len(paths) > 5
    got = []
    for sequence, path in enumerate(paths):
        header, start = read_capture_header(path)
        assert header.sequence == sequence
        assert header.started_at == STARTED  # the session's start in every file
        size = path.stat().st_size
        assert size < 1000 + frame_len  # rotated as soon as the size was reached
        assert (size - start) % frame_len == 0
        got += seqnos(path)
    assert got == written


def test_a_run_of_frames_stays_in_one_file(tmp_path: Path) -> None:
    writer = session(tmp_path, rotate_bytes=100)
    run = b"".join(mutation(1, s) for s in range(1, 21))
    writer.write(run, T0)
    assert writer.due(T0) and writer.open_bytes == len(run)
    path = writer.close_file()
    assert path is not None and [s for _, s in seqnos(path)] == list(range(1, 21))


def test_rotation_by_age_counts_from_the_first_write(tmp_path: Path) -> None:
    writer = session(tmp_path, rotate_seconds=10.0)
    assert not writer.due(T0 + 1000)  # no file open: nothing is due
    writer.write(mutation(0, 1), T0 + 100)
    assert not writer.due(T0 + 109.9)
    writer.write(mutation(0, 2), T0 + 109.9)
    assert writer.due(T0 + 110)
    first = writer.close_file()
    writer.write(mutation(0, 3), T0 + 200)
    assert not writer.due(T0 + 205)
    assert writer.due(T0 + 210)
    second = writer.close_file()
    assert first is not None and second is not None
    assert read_capture_header(second)[0].model_extra == {"opened_at": rfc3339(T0 + 200)}
    assert read_capture_header(second)[0].sequence == 1
    assert [seqnos(p) for p in (first, second)] == [[(0, 1), (0, 2)], [(0, 3)]]


def test_a_failed_close_publishes_nothing_and_ends_the_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = session(tmp_path)
    writer.write(mutation(0, 1), T0)

    def no_space(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(OSError, match="No space left"):
        writer.close_file()
    monkeypatch.undo()
    landing = tmp_path / "landing"
    assert list(landing.glob("*.dcpcap")) == []
    assert [p.name for p in (landing / ".dcp-cdc-capture").iterdir()] == [
        "b-agent-20260101T000000.000000Z-0-0-00000.dcpcap.partial"
    ]
    with pytest.raises(OSError, match=r"failed earlier .*No space left.*start a new session"):
        writer.write(mutation(0, 2), T0)
    with pytest.raises(OSError, match="failed earlier"):
        writer.close_file()


def test_session_ids_sort_by_start() -> None:
    assert session_id("b", "east", T0 + 0.25, 2, 7) == "b-east-20260101T000000.250000Z-2-7"
    ids = [session_id("b", "a", T0 + t, 0, 0) for t in (9.5, 10.0, 100.0, 86400.0)]
    assert sorted(ids) == ids


def test_clear_staging_drops_only_this_agents_partials(tmp_path: Path) -> None:
    writer = session(tmp_path)
    writer.write(mutation(0, 1), T0)
    writer.abandon()
    staging = tmp_path / "landing" / ".dcp-cdc-capture"
    mine = staging / "b-agent-20260101T000000.000000Z-0-0-00000.dcpcap.partial"
    assert mine.is_file()
    # another agent of the same bucket, and bucket "b-agent" (sharing the landing folder)
    others = [
        staging / "b-west-20260101T000000.000000Z-0-0-00000.dcpcap.partial",
        staging / "b-agent-x-20260101T000000.000000Z-0-0-00000.dcpcap.partial",
    ]
    for other in others:
        other.write_bytes(b"another agent's open file")
    keep = staging / "b.agent.checkpoint.json"
    keep.write_text("{}")
    assert clear_staging(staging, bucket="b", agent_id="agent") == [mine]
    assert sorted(staging.iterdir()) == sorted([keep, *others])
    assert clear_staging(staging) == sorted(others)
    assert list(staging.iterdir()) == [keep]
    assert clear_staging(tmp_path / "absent") == []


def position(vbucket: int, seqno: int) -> VbPosition:
    return VbPosition(vbucket, seqno, 0xABC0 + vbucket, ((0xABC0 + vbucket, 0),), 7, 2)


def test_checkpoint_round_trip_and_merge(tmp_path: Path) -> None:
    path = tmp_path / "state" / "b.agent.checkpoint.json"
    store = CheckpointStore(path, bucket="b", bucket_uuid="u1", agent="agent")
    assert store.load() == {}
    store.commit({0: position(0, 10), 5: position(5, 50)}, updated_at=STARTED)
    reader = CheckpointStore(path, bucket="b", bucket_uuid="u1")
    reader.load()
    assert store.updated_at == reader.updated_at == STARTED  # when it was last committed
    store.commit({5: position(5, 60), 9: position(9, 1)})
    expected = {0: position(0, 10), 5: position(5, 60), 9: position(9, 1)}
    assert reader.load() == expected
    assert reader.updated_at is None  # that commit did not say
    # a new store merges into what is on disk, not into nothing
    fresh = CheckpointStore(path, bucket="b", bucket_uuid="u1")
    fresh.commit({1: position(1, 3)})
    assert set(fresh.load()) == {0, 1, 5, 9}
    document = json.loads(path.read_text())
    assert document["format"] == CHECKPOINT_FORMAT
    assert (document["bucket"], document["bucket_uuid"], document["agent"]) == ("b", "u1", "agent")
    assert document["vbuckets"]["5"] == {
        "vbucket": 5,
        "seqno": 60,
        "vb_uuid": 0xABC5,
        "failover_log": [[0xABC5, 0]],
        "manifest_uid": 7,
        "purge_seqno": 2,
    }
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # no temporary left


def test_a_commit_writes_each_position_as_it_is_now(tmp_path: Path) -> None:
    """A commit encodes only the vbuckets whose position changed and keeps the lines of the
    others: the document is the one a store with nothing remembered writes, byte for byte,
    whatever changed (a new seqno, failover log, manifest uid or purge seqno, or an equal
    position that is another object)."""
    path, other = tmp_path / "a.json", tmp_path / "b.json"
    store = CheckpointStore(path, bucket="b", bucket_uuid="u1")
    store.commit({vb: position(vb, 10) for vb in range(4)}, updated_at=STARTED)
    changes = [
        {1: position(1, 11)},
        {2: VbPosition(2, 10, 0xABC2, ((0xABC2, 0), (0x77, 5)), 7, 2)},
        {0: VbPosition(0, 10, 0xABC0, ((0xABC0, 0),), 8, 2)},
        {3: VbPosition(3, 10, 0xABC3, ((0xABC3, 0),), 7, 3)},
        {1: position(1, 11), 0: position(0, 10)},  # equal to what is stored
    ]
    for change in changes:
        store.commit(change, updated_at=STARTED)
        merged = CheckpointStore(path, bucket="b", bucket_uuid="u1").load()
        other.unlink(missing_ok=True)
        CheckpointStore(other, bucket="b", bucket_uuid="u1").commit(merged, updated_at=STARTED)
        assert path.read_bytes() == other.read_bytes()
        assert all(merged[vb] == p for vb, p in change.items())


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"{not json", "is not JSON"),
        (b"[]", "is not a JSON object"),
        (b'{"format": "other", "bucket": "b", "vbuckets": {}}', "format 'other'"),
        (
            json.dumps({"format": CHECKPOINT_FORMAT, "bucket": "c", "vbuckets": {}}).encode(),
            "belongs to bucket 'c', not 'b'",
        ),
        (
            json.dumps(
                {"format": CHECKPOINT_FORMAT, "bucket": "b", "bucket_uuid": "u0", "vbuckets": {}}
            ).encode(),
            "bucket uuid u0",
        ),
        (json.dumps({"format": CHECKPOINT_FORMAT, "bucket": "b"}).encode(), "lacks the 'vbuckets'"),
        (
            json.dumps(
                {
                    "format": CHECKPOINT_FORMAT,
                    "bucket": "b",
                    "vbuckets": {"3": {"vbucket": 3, "seqno": -1, "vb_uuid": 1}},
                }
            ).encode(),
            r"vbuckets\[3\]: position field 'seqno'",
        ),
        (
            json.dumps(
                {
                    "format": CHECKPOINT_FORMAT,
                    "bucket": "b",
                    "vbuckets": {"3": position(4, 1).to_json()},
                }
            ).encode(),
            r"vbuckets\[3\] holds vbucket 4",
        ),
    ],
)
def test_a_corrupt_checkpoint_names_the_file_and_the_problem(
    tmp_path: Path, content: bytes, problem: str
) -> None:
    path = tmp_path / "b.agent.checkpoint.json"
    path.write_bytes(content)
    store = CheckpointStore(path, bucket="b", bucket_uuid="u1")
    with pytest.raises(CheckpointError, match=problem) as info:
        store.load()
    assert str(path) in str(info.value)
    with pytest.raises(CheckpointError):
        store.commit({0: position(0, 1)})  # never overwrites what it cannot read
    assert path.read_bytes() == content


# --- the crash test -------------------------------------------------------------------------

# A zygote imports once, then forks one writer per trial: the killed writers are real
# processes, without paying the interpreter's start-up (~0.5 s) ten times.
CHILD = """
import os, sys, time
from pathlib import Path
from dcp_cdc.agent.positions import VbPosition
from dcp_cdc.agent.writer import CheckpointStore, SessionWriter, clear_staging, rfc3339, session_id
from dcp_cdc.encoder import encode, make_header
from dcp_cdc.events import Mutation
from dcp_cdc.protocol import Opcode


def capture(landing, trial):
    staging = landing / ".dcp-cdc-capture"
    clear_staging(staging, bucket="b", agent_id="agent")
    store = CheckpointStore(staging / "b.agent.checkpoint.json", bucket="b", bucket_uuid="u1")
    positions = store.load()
    last = {vb: positions[vb].seqno if vb in positions else 0 for vb in range(4)}
    started = time.time()
    writer = SessionWriter(
        landing, staging, bucket="b", session_id=session_id("b", "agent", started, 0, trial),
        collections=False, features=(), source="test", started_at=rfc3339(started),
        rotate_bytes=4096, rotate_seconds=0.02,
    )
    n = 0
    while True:
        vb = n % 4
        n += 1
        first = last[vb] + 1
        frames = b"".join(
            encode(Mutation(make_header(Opcode.DCP_MUTATION, vbucket=vb), s, 1, 0, 0, 0, 0, 0,
                            None, b"k", b"v" * (s % 97), None))
            for s in range(first, first + 1 + n % 5)
        )
        writer.write(frames, time.time())
        last[vb] = first + n % 5
        if writer.due(time.time()):
            writer.close_file()
            store.commit({v: VbPosition(v, s, 1) for v, s in last.items()})


for line in sys.stdin:
    pid = os.fork()
    if pid == 0:
        try:
            capture(Path(sys.argv[1]), int(line))
        finally:
            os._exit(1)  # an error: never back into the zygote's loop
    print(pid, flush=True)
    _, status = os.waitpid(pid, 0)
    print(status, flush=True)
"""


def _landed(landing: Path) -> dict[int, set[int]]:
    """The seqnos of each vbucket in the renamed files; asserts each file parses whole."""
    found: dict[int, set[int]] = {}
    for path in sorted(landing.glob("*.dcpcap")):
        header, _ = read_capture_header(path)
        assert path.name == f"{header.session_id}-{header.sequence:05d}.dcpcap"
        for vbucket, seqno in seqnos(path):
            found.setdefault(vbucket, set()).add(seqno)
    return found


def test_sigkill_at_random_moments_never_leaves_a_checkpoint_ahead_of_landing(
    tmp_path: Path,
) -> None:
    rng = random.Random(15)
    landing = tmp_path / "landing"
    zygote = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(landing)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
    )
    assert zygote.stdin is not None and zygote.stdout is not None
    advanced = previous = 0
    try:
        for trial in range(10):
            zygote.stdin.write(b"%d\n" % trial)
            zygote.stdin.flush()
            pid = int(zygote.stdout.readline())
            time.sleep(rng.uniform(0.02, 0.2))
            os.kill(pid, signal.SIGKILL)
            status = int(zygote.stdout.readline())  # reaped: it writes no more
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
            found = _landed(landing)
            # each start drops the partial files of the run killed before it
            assert len(list((landing / ".dcp-cdc-capture").glob("*.dcpcap.partial"))) <= 2
            checkpoint = CheckpointStore(
                landing / ".dcp-cdc-capture" / "b.agent.checkpoint.json",
                bucket="b",
                bucket_uuid="u1",
            ).load()
            for vbucket, pos in checkpoint.items():
                # every seqno up to the checkpoint is in a renamed file: none ahead of landing
                missing = set(range(1, pos.seqno + 1)) - found.get(vbucket, set())
                assert not missing, f"trial {trial}: vb {vbucket} at {pos.seqno} lacks {missing}"
            total = sum(p.seqno for p in checkpoint.values())
            assert total >= previous
            advanced += total > previous
            previous = total
    finally:
        zygote.kill()
        zygote.wait()
    assert advanced >= 5, "the writer hardly ever got to commit: the test proves little"
