"""Couchbase names → SQL identifiers, one deterministic rule for buckets, scopes, collections.

Couchbase allows ``A-Z a-z 0-9 _ - %`` (and ``.`` in bucket names) and is case-sensitive;
catalog identifiers are lowercase ``[a-z0-9_]``. The rule: lowercase ASCII letters, digits and
``_`` stay; ``-`` and ``.`` become ``_``; ``%`` becomes ``_pct_``; an uppercase letter becomes
its lowercase. When that loses information (the name has uppercase letters, ``-``, ``.`` or
``%``), an 8-hex-digit suffix of the name's CRC32 is appended, so different names never share
an identifier: ``travel-sample`` → ``travel_sample_a8560dff``, ``orders%2026`` →
``orders_pct_2026_6070f28b``, ``Airline`` → ``airline_23a92764``, ``airline`` → ``airline``.
"""

from __future__ import annotations

import re
import zlib

_PLAIN = re.compile(r"[a-z0-9_]+")


def identifier(name: str) -> str:
    """The SQL identifier for a Couchbase name (see the module docstring for the rule)."""
    if not name:
        raise ValueError("empty name")
    if _PLAIN.fullmatch(name):  # not match(): "$" would let a final newline through
        return name
    mapped = name.lower().replace("-", "_").replace(".", "_").replace("%", "_pct_")
    mapped = re.sub(r"[^a-z0-9_]", "_", mapped)
    return f"{mapped}_{zlib.crc32(name.encode()):08x}"
