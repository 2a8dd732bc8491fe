"""Synthetic frame streams for benchmarks: mixed ops, ~200-byte JSON bodies, some Snappy and
XATTR values, snapshot markers every 50 frames. Deterministic for a given size."""

from __future__ import annotations

import json
import random

from dcp_cdc.encoder import encode, make_header
from dcp_cdc.events import Deletion, Expiration, Mutation, SeqnoAdvanced, SnapshotMarker
from dcp_cdc.protocol import Datatype, Opcode


def _body(rng: random.Random, i: int) -> bytes:
    doc = {
        "id": i,
        "type": "order",
        "customer": {"name": f"customer-{rng.randrange(10_000)}", "tier": rng.choice("abc")},
        "items": [{"sku": f"sku-{rng.randrange(1000)}", "qty": rng.randrange(1, 9)}
                  for _ in range(3)],
        "total": round(rng.random() * 1000, 2),
        "note": "héllo wörld",
    }  # fmt: skip
    return json.dumps(doc, ensure_ascii=False).encode()


def build_stream(n_frames: int, *, seed: int = 7, vbuckets: int = 64) -> bytes:
    """``n_frames`` encoded frames back to back (collection-aware keys)."""
    rng = random.Random(seed)
    # Encoding a million frames one by one is slow; encode a pool of templates and vary the
    # by_seqno bytes in place (extras offset 0 of every data frame is by_seqno).
    pool: list[bytes] = []
    for i in range(2048):
        vb = i % vbuckets
        key = f"order::{i:08d}".encode()
        r = rng.random()
        cas = 0x17A8B0D8E6F40000 + (i << 16)
        if r < 0.70:
            h = make_header(Opcode.DCP_MUTATION, vbucket=vb, cas=cas, datatype=Datatype.JSON)
            pool.append(encode(Mutation(h, i, 1, 0, 0, 0, 0, 0, 8, key, _body(rng, i), None)))
        elif r < 0.80:
            dt = Datatype.JSON | Datatype.SNAPPY | Datatype.XATTR
            h = make_header(Opcode.DCP_MUTATION, vbucket=vb, cas=cas, datatype=dt)
            xattrs = {"_sync": '{"rev":"1-a"}', "meta": '{"src":"bench"}'}
            pool.append(encode(Mutation(h, i, 2, 0, 0, 0, 0, 0, 8, key, _body(rng, i), xattrs)))
        elif r < 0.90:
            h = make_header(Opcode.DCP_DELETION, vbucket=vb, cas=cas)
            pool.append(encode(Deletion(h, i, 3, 1_700_000_000, 8, key, b"", None)))
        elif r < 0.95:
            h = make_header(Opcode.DCP_EXPIRATION, vbucket=vb, cas=cas)
            pool.append(encode(Expiration(h, i, 3, 1_700_000_000, 8, key, b"", None)))
        else:
            h = make_header(Opcode.DCP_SEQNO_ADVANCED, vbucket=vb)
            pool.append(encode(SeqnoAdvanced(h, i)))
    marker = encode(
        SnapshotMarker(make_header(Opcode.DCP_SNAPSHOT_MARKER, vbucket=0), "1", 1, 50, 1)
    )
    out = bytearray()
    for i in range(n_frames):
        out += marker if i % 50 == 0 else pool[i % len(pool)]
    return bytes(out)
