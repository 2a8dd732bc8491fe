"""The capture agent's durable output: rotating capture files and the resume checkpoint.

Durable means fsync'd and published. A session's frames go to ``<staging>/<name>.dcpcap.partial``
(a local file, a name bronze never lists); :meth:`SessionWriter.close_file` flushes, fsyncs and
publishes it into landing as ``<name>.dcpcap`` through its :class:`~dcp_cdc.agent.landing_store.LandingStore`:
a rename into a local folder (then an fsync of the folder), or one upload into an object store;
either way a reader never sees a half-written file. The driver commits a checkpoint only after
the file holding the frames it covers is published: a kill between the two replays those
frames at the next start, never skips them. The checkpoint is kept through a
:class:`~dcp_cdc.agent.landing_store.CheckpointBackend` (a local file, or an object written
with conditional writes). No clocks in here: times come from the caller (``now``, seconds
since the epoch).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

from dcp_cdc.agent.landing_store import (
    PARTIAL_SUFFIX,
    CheckpointBackend,
    LandingStore,
    LocalCheckpoint,
    LocalLanding,
    open_checkpoint,
)
from dcp_cdc.agent.positions import VbPosition
from dcp_cdc.agent.s3_store import S3Options
from dcp_cdc.capture import EXTENSION, CaptureHeader, capture_file_name, encode_header
from dcp_cdc.config.capture import CAPTURE_DIR
from dcp_cdc.errors import CheckpointError

STAGING_DIR = CAPTURE_DIR
"""The default staging folder (and checkpoint folder) inside a landing folder: the same file
system, so the rename into landing is atomic."""
CHECKPOINT_FORMAT = "dcp-cdc-capture-checkpoint/1"


def rfc3339(now: float) -> str:
    """``now`` (seconds since the epoch) as RFC 3339 UTC with microseconds, the form of the
    capture headers' times and the session ids: ``2026-01-02T03:04:05.123456Z``."""
    return dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class SessionWriter:
    """One DCP session's frames into capture files, rotated by size and age.

    ``write`` appends whole frames (a run of them, as the consumer hands them out) to the open
    file, opening one lazily; a run is never split, so a file ends on a frame boundary and may
    pass ``rotate_bytes`` by the last run. ``due`` says when the driver should ``close_file``.
    Every file's header carries the session's ``started_at`` (bronze orders a vbucket's frames
    by session start, session id, file sequence, offset) and its own ``opened_at``.
    """

    def __init__(
        self,
        landing: Path | LandingStore,
        staging: Path,
        *,
        bucket: str,
        session_id: str,
        collections: bool,
        features: tuple[str, ...],
        source: str,
        started_at: str,
        rotate_bytes: int,
        rotate_seconds: float,
    ) -> None:
        if rotate_bytes < 1 or rotate_seconds <= 0:
            raise ValueError("rotate_bytes and rotate_seconds must be positive")
        self.store: LandingStore = LocalLanding(landing) if isinstance(landing, Path) else landing
        self.staging = Path(staging)
        if isinstance(self.store, LocalLanding):
            self.store.check()
        self.staging.mkdir(parents=True, exist_ok=True)
        self.bucket = bucket
        self.session_id = session_id
        self.collections = collections
        self.features = tuple(features)
        self.source = source
        self.started_at = started_at
        self.rotate_bytes = rotate_bytes
        self.rotate_seconds = rotate_seconds
        self.sequence = 0
        """The sequence of the next file to open."""
        self.closed_paths: list[Path | str] = []
        """Files published into landing (paths, or ``s3://`` URIs), in order."""
        self._fh: BinaryIO | None = None
        self._name = ""
        self._size = 0
        self._frame_bytes = 0
        self._opened_at = 0.0
        self._failed: Exception | None = None

    @property
    def file_bytes(self) -> int:
        """Bytes of the open file so far, its header included (0 when none is open)."""
        return self._size if self._fh is not None else 0

    @property
    def open_bytes(self) -> int:
        """Frame bytes in the open file (0 when none is open)."""
        return self._frame_bytes

    def write(self, frames: bytes, now: float) -> None:
        """Append ``frames`` (whole frames only) to the open file, opening one first if needed.

        An ``OSError`` (a full disk) leaves the file in staging, never published: the writer
        is then unusable and the next start drops the file (:func:`clear_staging`)."""
        if not frames:
            return
        self._usable()
        try:
            if self._fh is None:
                self._open(now)
            assert self._fh is not None
            self._fh.write(frames)
        except OSError as exc:
            self._fail(exc)
            raise
        self._size += len(frames)
        self._frame_bytes += len(frames)

    def due(self, now: float) -> bool:
        """True when the open file reached ``rotate_bytes``, or ``rotate_seconds`` passed since
        its first write."""
        return self._fh is not None and (
            self._size >= self.rotate_bytes or now - self._opened_at >= self.rotate_seconds
        )

    def close_file(self) -> Path | str | None:
        """Make the open file durable and visible: flush, fsync, publish into landing (a
        rename and an fsync of the folder, or one upload). Returns its landing path or URI;
        None when no file is open. A failure (an ``OSError``, an
        :class:`~dcp_cdc.errors.ObjectStoreError`) leaves the file unpublished in staging."""
        self._usable()
        if self._fh is None:
            return None
        fh, self._fh = self._fh, None
        partial = self.staging / (self._name + PARTIAL_SUFFIX)
        try:
            fh.flush()
            os.fsync(fh.fileno())
            fh.close()
            final = self.store.publish(partial, self._name)
        except Exception as exc:
            fh.close()
            self._fail(exc)
            raise
        self.sequence += 1
        self._size = self._frame_bytes = 0
        self.closed_paths.append(final)
        return final

    def abandon(self) -> None:
        """Close the open file without publishing it (it stays in staging as a partial)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def _open(self, now: float) -> None:
        header = CaptureHeader(
            bucket=self.bucket,
            collections=self.collections,
            session_id=self.session_id,
            sequence=self.sequence,
            features=self.features,
            source=self.source,
            started_at=self.started_at,
            opened_at=rfc3339(now),
        )
        self._name = capture_file_name(self.session_id, self.sequence)
        path = self.staging / (self._name + PARTIAL_SUFFIX)
        fh = open(path, "wb")  # noqa: SIM115 - closed by close_file() or abandon()
        self._fh = fh
        self._size = fh.write(encode_header(header))
        self._frame_bytes = 0
        self._opened_at = now

    def _fail(self, exc: Exception) -> None:
        self._failed = exc
        self.abandon()

    def _usable(self) -> None:
        if self._failed is not None:
            raise OSError(
                f"capture session {self.session_id} failed earlier ({self._failed}); "
                "start a new session"
            ) from self._failed


def checkpoint_name(bucket: str, agent_id: str) -> str:
    """The file name of an agent's checkpoint in its state folder."""
    return f"{bucket}.{agent_id}.checkpoint.json"


class CheckpointStore:
    """The agent's resume positions, one JSON document per agent (bucket and vbucket range):
    ``{format, bucket, bucket_uuid, agent, updated_at, vbuckets: {"<vb>": position}}``.

    :meth:`commit` merges positions into the stored map and replaces the document whole: a
    local file atomically (temporary file, fsync, rename, fsync of the folder; a kill leaves
    the old file or the new one, never a mix), an object with a conditional PUT (another
    writer's change is refused: :class:`~dcp_cdc.errors.CheckpointConflictError`). A
    document of another bucket (or of the same name recreated: another ``bucket_uuid``) is
    refused, not resumed from. ``path`` is a local path, an ``s3://`` URI (with ``s3``'s
    options) or a backend."""

    def __init__(
        self,
        path: Path | str | CheckpointBackend,
        *,
        bucket: str,
        bucket_uuid: str | None,
        agent: str = "agent",
        s3: S3Options | None = None,
    ) -> None:
        self.backend: CheckpointBackend = (
            open_checkpoint(path, s3) if isinstance(path, (Path, str)) else path
        )
        self.path: Path | str = (
            self.backend.path
            if isinstance(self.backend, LocalCheckpoint)
            else self.backend.location
        )
        self.bucket = bucket
        self.bucket_uuid = bucket_uuid
        """None while unknown; once known, a stored different uuid is refused."""
        self.agent = agent
        self.updated_at: str | None = None
        """When the stored document was last committed (RFC 3339 UTC, as :func:`rfc3339`
        writes it), once :meth:`load` or :meth:`commit` ran; None when it does not say."""
        self._positions: dict[int, VbPosition] | None = None
        self._lines: dict[int, tuple[VbPosition, str]] = {}
        """Each vbucket's line of the document as last written, by the position it holds: a
        commit encodes only the positions that changed (a node's commit rewrites the whole
        map, and 1,024 lines cost some 5 ms to encode)."""

    def load(self) -> dict[int, VbPosition]:
        """The stored positions; ``{}`` when there is no checkpoint yet."""
        try:
            text = self.backend.read()
        except OSError as exc:
            raise self._error(f"cannot be read: {exc.strerror or exc}") from None
        if text is None:
            self._positions = {}
            return {}
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise self._error(f"is not JSON ({exc})") from None
        self._positions = self._parse(raw)
        return dict(self._positions)

    def commit(self, positions: Mapping[int, VbPosition], *, updated_at: str | None = None) -> None:
        """Merge ``positions`` into the stored map and write it durably."""
        stored = self._positions if self._positions is not None else self.load()
        merged = dict(stored)
        for vbucket, position in positions.items():
            if position.vbucket != vbucket:
                raise ValueError(f"position of vbucket {position.vbucket} given as {vbucket}")
            merged[vbucket] = position
        document: dict[str, object] = {
            "format": CHECKPOINT_FORMAT,
            "bucket": self.bucket,
            "bucket_uuid": self.bucket_uuid,
            "agent": self.agent,
        }
        if updated_at is not None:
            document["updated_at"] = updated_at
        lines = [self._line(position) for _, position in sorted(merged.items())]
        self.backend.write(_document_text(document, lines))
        self._positions = merged
        self.updated_at = updated_at

    def _line(self, position: VbPosition) -> str:
        cached = self._lines.get(position.vbucket)
        if cached is not None and (cached[0] is position or cached[0] == position):
            return cached[1]
        line = f'  "{position.vbucket}": {json.dumps(position.to_json())}'
        self._lines[position.vbucket] = (position, line)
        return line

    def _parse(self, raw: object) -> dict[int, VbPosition]:
        if not isinstance(raw, dict):
            raise self._error("is not a JSON object")
        if raw.get("format") != CHECKPOINT_FORMAT:
            raise self._error(f"format {raw.get('format')!r}, expected {CHECKPOINT_FORMAT!r}")
        if raw.get("bucket") != self.bucket:
            raise self._error(f"belongs to bucket {raw.get('bucket')!r}, not {self.bucket!r}")
        stored_uuid = raw.get("bucket_uuid")
        if stored_uuid is not None and not isinstance(stored_uuid, str):
            raise self._error(f"bucket_uuid must be a string, got {stored_uuid!r}")
        if self.bucket_uuid is not None and stored_uuid not in (None, self.bucket_uuid):
            raise self._error(
                f"was written for bucket uuid {stored_uuid}, but bucket {self.bucket!r} now has "
                f"uuid {self.bucket_uuid} (recreated?): its positions do not apply; move the "
                "file away to capture the new bucket from the start"
            )
        vbuckets = raw.get("vbuckets")
        if not isinstance(vbuckets, dict):
            raise self._error("lacks the 'vbuckets' object")
        updated_at = raw.get("updated_at")
        self.updated_at = updated_at if isinstance(updated_at, str) else None
        positions: dict[int, VbPosition] = {}
        for key, value in vbuckets.items():
            if not (isinstance(key, str) and key.isdigit()):
                raise self._error(f"vbuckets key {key!r} is not a vbucket number")
            if not isinstance(value, dict):
                raise self._error(f"vbuckets[{key}] is not an object")
            try:
                position = VbPosition.from_json(value)
            except CheckpointError as exc:
                raise self._error(f"vbuckets[{key}]: {exc}") from None
            if position.vbucket != int(key):
                raise self._error(f"vbuckets[{key}] holds vbucket {position.vbucket}")
            positions[position.vbucket] = position
        return positions

    def _error(self, problem: str) -> CheckpointError:
        return CheckpointError(f"checkpoint {self.path} {problem}")


_STAMP = r"[0-9]{8}T[0-9]{6}\.[0-9]{6}Z"


def session_id(bucket: str, agent_id: str, started: float, node_index: int, counter: int) -> str:
    """``<bucket>-<agent_id>-<YYYYmmddTHHMMSS.ffffffZ>-<node_index>-<counter>``: session ids
    (and so capture file names) sort by start time; ``started`` is seconds since the epoch."""
    stamp = dt.datetime.fromtimestamp(started, dt.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    return f"{bucket}-{agent_id}-{stamp}-{node_index}-{counter}"


def clear_staging(
    staging: Path, *, bucket: str | None = None, agent_id: str | None = None
) -> list[Path]:
    """Delete the partial capture files a killed run left in ``staging`` and return them.

    Their frames were never renamed into landing, so no checkpoint covers them: the next
    session captures them again. Agents share a staging folder when they share a landing
    folder, so with ``bucket`` and ``agent_id`` only that agent's sessions (:func:`session_id`)
    are deleted, not another agent's open file."""
    folder = Path(staging)
    if not folder.is_dir():
        return []
    if (bucket is None) != (agent_id is None):
        raise ValueError("give both bucket and agent_id, or neither")
    mine = (
        re.compile(rf"{re.escape(bucket)}-{re.escape(agent_id)}-{_STAMP}-")
        if bucket is not None and agent_id is not None
        else None
    )
    removed = sorted(
        path
        for path in folder.glob(f"*{EXTENSION}{PARTIAL_SUFFIX}")
        if mine is None or mine.match(path.name)
    )
    for path in removed:
        path.unlink(missing_ok=True)
    return removed


def _document_text(document: Mapping[str, object], lines: list[str]) -> bytes:
    """The checkpoint's JSON: ``document``'s fields, then ``vbuckets``, one vbucket a line
    (``lines``, in vbucket order, :meth:`CheckpointStore._line`). Each part goes through the
    C encoder (``json.dumps`` without ``indent``): an indented dump of 1,024 vbuckets takes
    the pure-Python encoder about 50 ms, and each node's commit writes the whole map."""
    fields = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in document.items()]
    vbuckets = "{\n" + ",\n".join(lines) + "\n }" if lines else "{}"
    return ("{\n " + ",\n ".join([*fields, f'"vbuckets": {vbuckets}']) + "\n}\n").encode()
