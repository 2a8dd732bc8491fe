"""The DCP decoder, columnar face: a buffer of frames in, one Arrow table out.

Its modules, in the order a batch goes through them: :mod:`~dcp_cdc.columnar.framing` (where
the frames start), :mod:`~dcp_cdc.columnar.hot` (the messages decoded for all rows at once),
:mod:`~dcp_cdc.columnar.values` (Snappy values and XATTR sections of many frames at once),
:mod:`~dcp_cdc.columnar.columns` (the Arrow columns), :mod:`~dcp_cdc.columnar.schema` (the
columns in order, and an event's row), :mod:`~dcp_cdc.columnar.native` (the compiled pass's
wiring) and :mod:`~dcp_cdc.columnar.decode` (the entry points). Both faces of the decoder read
the same layout tables (:mod:`dcp_cdc.layouts`), and a test checks that they agree row for row.

The package's face is the decoder's entry points.
"""

from dcp_cdc.columnar.decode import decode_batch, decode_frames
from dcp_cdc.columnar.framing import frame_starts
from dcp_cdc.columnar.native import NATIVE, keep_freed_memory
from dcp_cdc.columnar.schema import ARROW_SCHEMA, DecodedBatch

__all__ = [
    "ARROW_SCHEMA",
    "NATIVE",
    "DecodedBatch",
    "decode_batch",
    "decode_frames",
    "frame_starts",
    "keep_freed_memory",
]
