"""A bounded fuzz campaign of both decoder faces: only ``DcpError`` subclasses
escape, and the faces agree (tests/support/fuzz_decoder.py says how inputs are made and what is
compared). ``make test`` runs a few thousand inputs; ``DCP_CDC_FUZZ_INPUTS`` sets how many
(``make test-long`` runs 200,000; a 1,000,000 campaign: ``python -m tests.support.fuzz_decoder``).
"""

from __future__ import annotations

import os

import pytest

from tests.support.fuzz_decoder import REPRODUCERS, campaign, check

INPUTS = int(os.environ.get("DCP_CDC_FUZZ_INPUTS", "2000"))


@pytest.mark.parametrize("collections", [False, True])
@pytest.mark.parametrize("data", REPRODUCERS, ids=lambda d: d[:12].hex())
def test_reproducers_give_typed_errors_and_faces_agree(data: bytes, collections: bool) -> None:
    check(data, collections, bounded=True)


def test_fuzzed_inputs_give_typed_errors_and_faces_agree() -> None:
    findings = campaign(seed=14, count=INPUTS, out=None)
    assert not findings, "\n".join(f"{d.hex()} collections={c}: {w}" for d, c, w in findings[:5])
