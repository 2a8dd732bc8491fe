"""Events as JSON objects, the way a protocol analyser shows them (``dcp-cdc decode``)."""

from __future__ import annotations

import base64
import dataclasses
from typing import Any

from dcp_cdc.errors import MalformedFrameError, TruncatedFrameError
from dcp_cdc.events import Event, SnapshotMarker, UnknownFrame
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
        elif f.name == "failover_log":
            out["failover_log"] = [list(entry) for entry in value]
        else:
            out[f.name] = value
    if hasattr(event, "xattrs"):
        out["is_json"] = h.is_json
    if isinstance(event, SnapshotMarker):
        out["snapshot_flag_names"] = list(snapshot_flag_names(event.snapshot_flags))
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
