"""What a bronze decode task holds in memory while Snappy values expand.

Snappy blocks expand up to ~21 times (``dcp_cdc.snappy.MAX_RATIO``). The columnar face used to
decompress every value of a batch at once: a 63 MiB chunk of blocks each expanding to 64 MiB
took 2.9 GB. Now a batch decompresses at most ``chunk_bytes`` (or one value, when that alone
is more), and the task's peak stays within ``MEMORY_PER_CHUNK`` times that.

The peak is measured in a child process (``ru_maxrss`` of a fresh interpreter), after a
warm-up decode so that the allocators' first growth is not counted.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from dcp_cdc.capture import CaptureWriter
from dcp_cdc.columnar import decode_batch
from dcp_cdc.encoder import encode, make_header
from dcp_cdc.events import Mutation
from dcp_cdc.protocol import Datatype, Opcode
from pipelines.bronze.decode import MEMORY_PER_CHUNK

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import resource, sys
from pathlib import Path
from dcp_cdc.capture import read_capture_header
from pipelines import schemas
from pipelines.bronze.decode import decode_file

schema = schemas.arrow_schema(schemas.DECODED_EVENTS)

def rows(path, chunk):
    _, length = read_capture_header(path)
    file = {"path": str(path), "bucket": "b", "session_id": "s", "session_started_at": None,
            "file_sequence": 0, "collections": False, "header_length": length,
            "size": path.stat().st_size, "carry": None}
    batches = decode_file(file, schema, chunk_bytes=chunk, raw_limit=64)
    return sum(b.num_rows for b in batches)

rows(Path(sys.argv[1]), 1 << 20)  # warm-up
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
n = rows(Path(sys.argv[2]), int(sys.argv[3]))
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(n, (after - before) * 1024)
"""


def _expanding_mutation(expands_to: int) -> bytes:
    """A mutation whose Snappy value (a run of one byte) expands ~21 times."""
    h = make_header(Opcode.DCP_MUTATION, datatype=Datatype.SNAPPY)
    return encode(Mutation(h, 1, 1, 0, 0, 0, 0, 0, None, b"k", b"a" * expands_to, None))


def _capture(folder: Path, frame: bytes, count: int) -> Path:
    with CaptureWriter(folder, bucket="b", session_id="s", collections=False) as writer:
        for _ in range(count):
            writer.write(frame)
    (path,) = writer.paths
    return path


def test_peak_memory_of_a_decode_task_is_a_known_multiple_of_chunk_bytes(tmp_path: Path) -> None:
    chunk = 8 * MiB
    frame = _expanding_mutation(4 * MiB)  # ~197 KB on the wire
    count = 2 * chunk // len(frame)  # two chunks of 42 frames: 340 MiB once decompressed
    path = _capture(tmp_path / "big", frame, count)
    warm = _capture(tmp_path / "warm", _expanding_mutation(64 * 1024), 4)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(warm), str(path), str(chunk)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=120,
        cwd=ROOT,
    )
    rows, growth = (int(v) for v in done.stdout.split())
    assert rows == count
    # unbounded, the first batch alone decompressed 42 values of 4 MiB (measured: 564 MiB)
    assert growth <= MEMORY_PER_CHUNK * chunk, f"peak grew {growth / MiB:.0f} MiB"


def test_a_bounded_batch_stops_before_the_frame_past_the_bound() -> None:
    frame = _expanding_mutation(100_000)
    plain = encode(
        Mutation(make_header(Opcode.DCP_MUTATION), 2, 1, 0, 0, 0, 0, 0, None, b"p", b"v", None)
    )
    data = frame + plain + frame + frame
    whole = decode_batch(data, collections=False)
    assert whole.table.num_rows == 4 and whole.consumed == len(data)
    # 250 KB: the first value (100 KB) and the plain one fit, the second compressed one too
    bounded = decode_batch(data, collections=False, max_expanded=250_000)
    assert bounded.table.num_rows == 3 and bounded.fatal is None
    assert bounded.consumed == 2 * len(frame) + len(plain)
    # a bound below one value still decodes the first frame: decoding always moves on
    tiny = decode_batch(data, collections=False, max_expanded=10)
    assert tiny.table.num_rows == 1 and tiny.consumed == len(frame)
    # batch after batch, the same rows as one unbounded call
    rows, pos = [], 0
    while pos < len(data):
        batch = decode_batch(data[pos:], collections=False, base_offset=pos, max_expanded=10)
        rows += batch.table.to_pylist()
        pos += batch.consumed
    assert rows == whole.table.to_pylist()
    assert np.diff([r["offset"] for r in rows]).min() > 0


def test_a_truncated_tail_past_the_bound_waits_for_its_batch() -> None:
    frame = _expanding_mutation(100_000)
    data = frame + frame + frame[:30]
    first = decode_batch(data, collections=False, max_expanded=10)
    assert first.fatal is None and first.consumed == len(frame)
    last = decode_batch(data[2 * len(frame) :], collections=False, base_offset=2 * len(frame))
    assert last.fatal is not None and last.fatal.offset == 2 * len(frame)
