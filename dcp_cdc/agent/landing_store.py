"""Where the capture agent's durable output goes: the landing of its capture files
(:class:`LandingStore`) and its checkpoint (:class:`CheckpointBackend`), each a local folder
or an object store (:mod:`dcp_cdc.agent.s3_store`).

Both keep one promise, whatever the store: a capture file is visible whole or not at all, and
once :meth:`LandingStore.publish` returned it is durable and listed, so the checkpoint that
covers its frames may be written after it (:mod:`dcp_cdc.agent.writer`). A file is always
written in a local staging folder first; only a closed, fsync'd file is published.

- Local: an ``os.replace`` of the staging file into the landing folder (the same file system),
  then an fsync of the folder; the checkpoint a temporary file, fsync'd and renamed.
- S3 (``s3://bucket/prefix``, ``s3a://...``): one PUT (or a multipart upload, whose
  completion is atomic) of the staging file, then the staging file deleted; the checkpoint an
  object replaced with conditional writes, so a second agent writing it is refused.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

from dcp_cdc.agent.s3_store import (
    ObjectLocation,
    S3Checkpoint,
    S3Client,
    S3Landing,
    S3Options,
    is_object_location,
)

PARTIAL_SUFFIX = ".partial"


def fsync_dir(folder: Path) -> None:
    """Make the entries of ``folder`` (a rename into it) durable."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LandingStore(Protocol):
    """Where closed capture files are published."""

    @property
    def location(self) -> str:
        """The landing, for messages and logs (a path or an ``s3://`` URI)."""
        ...

    def check(self) -> None:
        """Fail now, with a typed error, if files cannot be published here."""
        ...

    def publish(self, staged: Path, name: str) -> Path | str:
        """Make the closed, fsync'd ``staged`` file visible whole as ``name``; returns where."""
        ...


class CheckpointBackend(Protocol):
    """Where a checkpoint document is kept: read whole, replaced whole."""

    @property
    def location(self) -> str: ...

    def read(self) -> bytes | None:
        """The stored bytes; None when there is no checkpoint yet."""
        ...

    def write(self, data: bytes) -> None:
        """Replace the stored bytes; durable when it returns."""
        ...


class LocalLanding:
    """A landing folder on a local (or mounted) file system."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    @property
    def location(self) -> str:
        return str(self.folder)

    def check(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)

    def publish(self, staged: Path, name: str) -> Path:
        final = self.folder / name
        os.replace(staged, final)
        fsync_dir(self.folder)
        return final


class LocalCheckpoint:
    """A checkpoint file, replaced atomically (temporary file, fsync, rename, fsync of the
    folder): a kill leaves the old file or the new one, never a mix."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @property
    def location(self) -> str:
        return str(self.path)

    def read(self) -> bytes | None:
        try:
            return self.path.read_bytes()
        except FileNotFoundError:
            return None

    def write(self, data: bytes) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + PARTIAL_SUFFIX)
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        fsync_dir(self.path.parent)


def open_landing(location: Path | str, s3: S3Options | None = None) -> LandingStore:
    """The store of a landing: an ``s3://`` (``s3a://``) URI, else a local folder."""
    if is_object_location(location):
        return S3Landing(ObjectLocation.parse(str(location)), S3Client(s3))
    return LocalLanding(_local(location))


def open_checkpoint(
    location: Path | str, s3: S3Options | None = None, *, client: S3Client | None = None
) -> CheckpointBackend:
    """The backend of a checkpoint at ``location``: an ``s3://`` object, else a local file.
    ``client`` shares the landing's S3 client."""
    if is_object_location(location):
        return S3Checkpoint(ObjectLocation.parse(str(location)), client or S3Client(s3))
    return LocalCheckpoint(_local(location))


def _local(location: Path | str) -> Path:
    if isinstance(location, Path):
        return location
    return Path(location.removeprefix("file://").removeprefix("file:")).expanduser()


def join_location(folder: Path | str, name: str) -> Path | str:
    """``name`` inside ``folder``: a path, or a URI below an ``s3://`` prefix."""
    if is_object_location(folder):
        return f"{str(folder).rstrip('/')}/{name}"
    return _local(folder) / name
