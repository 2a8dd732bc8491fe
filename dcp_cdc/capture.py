"""Capture files, format version 1 (docs/protocol/capture-format.md).

``DCPCAP\\x00\\x01`` | u32 header length | JSON header | frames back to back. The header and
frame codecs here are pure; :class:`CaptureWriter` and :func:`read_capture_header` are the only
functions that touch files.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dcp_cdc.decoder import DcpDecoder, drain
from dcp_cdc.errors import CaptureFormatError, MalformedFrameError
from dcp_cdc.events import Event

MAGIC = b"DCPCAP\x00\x01"
FORMAT_VERSION = 1
MAX_HEADER_LEN = 1 << 20
PREAMBLE_LEN = len(MAGIC) + 4
EXTENSION = ".dcpcap"
_U32 = struct.Struct(">I")


class CaptureHeader(BaseModel):
    """The JSON header object. Unknown fields are kept and ignored (docs/protocol/capture-format.md)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    bucket: str = Field(min_length=1)
    collections: bool
    session_id: str = Field(min_length=1)
    sequence: int = Field(ge=0)
    features: tuple[str, ...] = ()
    source: str | None = None
    started_at: str | None = None


def encode_header(header: CaptureHeader) -> bytes:
    """Preamble and header bytes; the frames follow."""
    body = json.dumps(
        header.model_dump(exclude_none=True), separators=(",", ":"), sort_keys=True
    ).encode()
    if len(body) > MAX_HEADER_LEN:
        raise CaptureFormatError(f"header of {len(body)} bytes exceeds {MAX_HEADER_LEN}")
    return MAGIC + _U32.pack(len(body)) + body


def parse_header(data: bytes, *, file: str | None = None) -> tuple[CaptureHeader, int]:
    """``(header, offset of the first frame)`` from the first bytes of a capture file."""
    if len(data) < PREAMBLE_LEN:
        raise CaptureFormatError(
            f"file too short for a capture preamble ({len(data)} of {PREAMBLE_LEN} bytes)",
            file=file,
        )
    if data[:6] != MAGIC[:6]:
        raise CaptureFormatError(f"not a capture file: magic {data[:8]!r}", file=file)
    version = int.from_bytes(data[6:8], "big")
    if version != FORMAT_VERSION:
        raise CaptureFormatError(
            f"capture format version {version} is not supported (expected {FORMAT_VERSION})",
            file=file,
        )
    (length,) = _U32.unpack_from(data, len(MAGIC))
    if length > MAX_HEADER_LEN:
        raise CaptureFormatError(f"header length {length} exceeds {MAX_HEADER_LEN}", file=file)
    end = PREAMBLE_LEN + length
    if len(data) < end:
        raise CaptureFormatError(
            f"header truncated: {len(data) - PREAMBLE_LEN} of {length} bytes", file=file
        )
    try:
        raw = json.loads(data[PREAMBLE_LEN:end])
    except ValueError as exc:
        raise CaptureFormatError(f"header is not JSON: {exc}", file=file) from None
    if not isinstance(raw, dict):
        raise CaptureFormatError("header is not a JSON object", file=file)
    try:
        return CaptureHeader.model_validate(raw), end
    except ValidationError as exc:
        fields = ", ".join(".".join(map(str, e["loc"])) + f": {e['msg']}" for e in exc.errors())
        raise CaptureFormatError(f"invalid header: {fields}", file=file) from None


def read_capture_header(path: str | Path) -> tuple[CaptureHeader, int]:
    """Read just the header of the capture file at ``path``."""
    with open(path, "rb") as fh:
        head = fh.read(PREAMBLE_LEN)
        if len(head) == PREAMBLE_LEN and head[:6] == MAGIC[:6]:
            (length,) = _U32.unpack_from(head, len(MAGIC))
            head += fh.read(min(length, MAX_HEADER_LEN))
    return parse_header(head, file=str(path))


def iter_capture(
    path: str | Path, *, chunk_size: int = 1 << 20, collections: bool | None = None
) -> Iterator[Event | MalformedFrameError]:
    """Every frame of one capture file, read in chunks; malformed frames yielded in place.

    Offsets are file offsets. Stops after an unrecoverable error (e.g. a truncated tail).
    """
    header, start = read_capture_header(path)
    with open(path, "rb") as fh:
        fh.seek(start)
        yield from iter_stream(
            fh,
            collections=header.collections if collections is None else collections,
            base_offset=start,
            file=str(path),
            chunk_size=chunk_size,
        )


def iter_stream(
    fh: BinaryIO,
    *,
    collections: bool,
    base_offset: int = 0,
    file: str | None = None,
    chunk_size: int = 1 << 20,
) -> Iterator[Event | MalformedFrameError]:
    """Frames of a headerless stream read from ``fh`` in chunks."""
    decoder = DcpDecoder(collections=collections, base_offset=base_offset, file=file)
    while True:
        chunk = fh.read(chunk_size)
        decoder.receive_data(chunk)
        if (yield from drain(decoder)) or not chunk:
            return


def capture_file_name(session_id: str, sequence: int) -> str:
    """``<session_id>-<sequence:05d>.dcpcap``: the name of a session's file ``sequence``, so
    that a session's files sort in order."""
    return f"{session_id}-{sequence:05d}{EXTENSION}"


class CaptureWriter:
    """Writes one session's frames into files that rotate by size.

    Files are ``<session_id>-<sequence:05d>.dcpcap`` in ``directory``; a file is closed once
    it reaches ``max_file_bytes`` (frames are never split across files).
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        bucket: str,
        session_id: str,
        collections: bool,
        features: tuple[str, ...] = (),
        source: str | None = None,
        started_at: str | None = None,
        max_file_bytes: int = 64 * 1024 * 1024,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._fields: dict[str, Any] = {
            "bucket": bucket,
            "session_id": session_id,
            "collections": collections,
            "features": tuple(features),
            "source": source,
            "started_at": started_at,
            **(extra or {}),
        }
        self.max_file_bytes = max_file_bytes
        self.sequence = -1
        self.paths: list[Path] = []
        self._fh: BinaryIO | None = None
        self._size = 0

    def _open_next(self) -> None:
        self.close()
        self.sequence += 1
        header = CaptureHeader(**self._fields, sequence=self.sequence)
        path = self.directory / capture_file_name(header.session_id, self.sequence)
        self._fh = open(path, "wb")  # noqa: SIM115 - closed by close()
        self._size = self._fh.write(encode_header(header))
        self.paths.append(path)

    def write(self, frame: bytes) -> tuple[Path, int]:
        """Append one whole frame, rotating first if the current file is full.

        Returns the file and the offset the frame was written at.
        """
        if self._fh is None or self._size >= self.max_file_bytes:
            self._open_next()
        assert self._fh is not None
        at = self._size
        self._size += self._fh.write(frame)
        return self.paths[-1], at

    def write_raw(self, data: bytes) -> tuple[Path, int]:
        """Append bytes that are not a whole frame (a cut tail), without rotating."""
        if self._fh is None:
            self._open_next()
        assert self._fh is not None
        at = self._size
        self._size += self._fh.write(data)
        return self.paths[-1], at

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> CaptureWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
