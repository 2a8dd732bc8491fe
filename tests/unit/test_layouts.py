"""Frame layouts (docs/protocol/dcp.md §1.1, §6): one table per section serves struct and numpy alike."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcp_cdc import layouts
from dcp_cdc.layouts import Layout

ALL = sorted(
    (v for v in vars(layouts).values() if isinstance(v, Layout)), key=lambda layout: layout.name
)


@pytest.mark.parametrize("layout", ALL, ids=lambda layout: layout.name)
@given(data=st.data())
@settings(max_examples=20, deadline=None)
def test_numpy_dtype_reads_what_struct_reads(layout: Layout, data: st.DataObject) -> None:
    raw = data.draw(st.binary(min_size=layout.length, max_size=layout.length))
    record = np.frombuffer(raw, dtype=layout.numpy_dtype())[0]
    assert tuple(int(record[name]) for name in layout.names) == layout.unpack(raw)


def test_header_layout_matches_the_spec() -> None:
    # docs/protocol/dcp.md §1.1: magic, opcode, key length, extras length, datatype, vbucket/status,
    # total body length, opaque, CAS
    assert layouts.HEADER.length == 24
    assert [(f.name, f.offset, f.size) for f in layouts.HEADER.fields] == [
        ("magic", 0, 1),
        ("opcode", 1, 1),
        ("key_len", 2, 2),
        ("ext_len", 4, 1),
        ("datatype", 5, 1),
        ("vbucket_or_status", 6, 2),
        ("body_len", 8, 4),
        ("opaque", 12, 4),
        ("cas", 16, 8),
    ]
    assert layouts.BODY_LEN_OFFSET == 8
