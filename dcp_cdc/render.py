"""Events as JSON objects, the way a protocol analyser shows them (``dcp-cdc decode``), and
a capture's counts as text."""

from __future__ import annotations

import base64
import dataclasses
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from dcp_cdc.capture import iter_capture, read_capture_header
from dcp_cdc.errors import MalformedFrameError, TruncatedFrameError
from dcp_cdc.events import AddStream, Event, SnapshotMarker, StreamRequest, UnknownFrame
from dcp_cdc.protocol import snapshot_flag_names

_SKIP = frozenset({"header", "nmeta"})


def bytes_field(out: dict[str, Any], name: str, data: bytes, *, text_ok: bool = True) -> None:
    """``out[name]`` as text when allowed and UTF-8, else ``out[name + "_b64"]``."""
    if text_ok:
        try:
            out[name] = data.decode("utf-8")
            return
        except UnicodeDecodeError:
            pass
    out[f"{name}_b64"] = base64.b64encode(data).decode("ascii")


def event_to_json(event: Event, *, file: str | None = None) -> dict[str, Any]:
    """One JSON object for one frame; keys as documented for ``dcp-cdc decode``."""
    h = event.header
    out: dict[str, Any] = {"file": file, "offset": h.offset, "op": event.op}
    out["magic"] = h.magic
    out["opcode"] = h.opcode
    if h.is_response:
        out["status"] = h.vbucket_or_status
    else:
        out["vbucket"] = h.vbucket_or_status
    out.update(opaque=h.opaque, cas=h.cas, datatype=h.datatype, stream_id=h.stream_id)
    if isinstance(event, UnknownFrame):
        out["raw_b64"] = base64.b64encode(event.raw).decode("ascii")
        return out
    for f in dataclasses.fields(event):
        if f.name in _SKIP:
            continue
        value = getattr(event, f.name)
        if value is None:
            continue
        if f.name == "key":
            bytes_field(out, "key", value, text_ok=True)
        elif f.name == "value" and isinstance(value, bytes):
            if value:
                bytes_field(out, "value", value, text_ok=h.is_json and hasattr(event, "xattrs"))
        elif f.name in ("failover_log", "high_seqnos"):
            out[f.name] = [list(entry) for entry in value]
        else:
            out[f.name] = value
    if hasattr(event, "xattrs"):
        out["is_json"] = h.is_json
    if isinstance(event, SnapshotMarker):
        out["snapshot_flag_names"] = list(snapshot_flag_names(event.snapshot_flags))
    if isinstance(event, (StreamRequest, AddStream)):
        out["stream_flag_names"] = list(event.flag_names)
    return out


def error_to_json(error: MalformedFrameError) -> dict[str, Any]:
    """The ``op: "error"`` object for a malformed frame or a truncated tail."""
    out: dict[str, Any] = {
        "file": error.file,
        "offset": error.offset,
        "op": "error",
        "reason": error.reason,
        "opcode": error.opcode,
        "expected": error.expected,
        "got": error.got,
        "frame_length": error.frame_length,
        "truncated": isinstance(error, TruncatedFrameError),
    }
    return out


def summarize(paths: Sequence[Path], out: TextIO) -> int:
    """Counts per op and per vbucket of the captures, and their errors; 1 if any."""
    ops: Counter[str] = Counter()
    vbuckets: set[int] = set()
    errors: list[MalformedFrameError] = []
    total_bytes = 0
    for path in paths:
        header, _ = read_capture_header(path)
        total_bytes += path.stat().st_size
        for item in iter_capture(path):
            if isinstance(item, MalformedFrameError):
                errors.append(item)
                continue
            ops[item.op] += 1
            if item.header.vbucket is not None and item.op != "noop":
                vbuckets.add(item.header.vbucket)
        out.write(
            f"  {path.name}: bucket={header.bucket} session={header.session_id} "
            f"sequence={header.sequence}\n"
        )
    out.write(f"{sum(ops.values())} frames, {total_bytes} bytes, {len(vbuckets)} vbuckets\n")
    for op, count in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])):
        out.write(f"  {op:<26}{count:>10}\n")
    for err in errors:
        out.write(f"  error: {err}\n")
    return 1 if errors else 0
