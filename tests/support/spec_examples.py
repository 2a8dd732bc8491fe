"""The worked examples of docs/protocol/dcp.md §8, each with the values the protocol doc writes
down: the decoder's first fixtures (tests/unit/test_spec_examples.py reads them three ways) and
the seed of the fuzz corpus (tests/support/fuzz_decoder.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Example:
    section: str
    hex: str
    collections: bool
    op: str
    header: dict[str, Any]
    fields: dict[str, Any]


HELLO_HEADER = {"vbucket": 0x0210, "opaque": 0x1210}

EXAMPLES = [
    Example(
        "8.1 mutation, no collections",
        "805700051f0102100000002b0000121017a8b0d8e6f400000000000000000004000000000000000102000006"
        "000000000000000000000068656c6c6f7b2261223a317d",
        False,
        "mutation",
        {
            **HELLO_HEADER,
            "magic": 0x80,
            "opcode": 0x57,
            "datatype": 0x01,
            "body_len": 43,
            "cas": 0x17A8B0D8E6F40000,
            "key_len": 5,
            "ext_len": 31,
        },
        {
            "by_seqno": 4,
            "rev_seqno": 1,
            "flags": 0x02000006,
            "expiration": 0,
            "lock_time": 0,
            "nmeta": 0,
            "nru": 0,
            "collection_id": None,
            "key": b"hello",
            "value": b'{"a":1}',
            "xattrs": None,
        },
    ),
    Example(
        "8.2 mutation, collection 0x8",
        "805700061f010210"
        "0000002c00001210"
        "17a8b0d8e6f40000"
        "0000000000000004"
        "0000000000000001"
        "02000006"
        "00000000"
        "00000000"
        "0000"
        "00"
        "0868656c6c6f"
        "7b2261223a317d",
        True,
        "mutation",
        {**HELLO_HEADER, "key_len": 6, "body_len": 44, "cas": 0x17A8B0D8E6F40000},
        {
            "by_seqno": 4,
            "rev_seqno": 1,
            "flags": 0x02000006,
            "collection_id": 8,
            "key": b"hello",
            "value": b'{"a":1}',
        },
    ),
    Example(
        "8.3 deletion V1, cid 8",
        "8058000612000210"
        "0000001800001210"
        "17a8b0d8e6f50000"
        "0000000000000005"
        "0000000000000002"
        "0000"
        "0868656c6c6f",
        True,
        "deletion",
        {**HELLO_HEADER, "ext_len": 18, "body_len": 24, "cas": 0x17A8B0D8E6F50000},
        {
            "by_seqno": 5,
            "rev_seqno": 2,
            "delete_time": None,
            "collection_id": 8,
            "key": b"hello",
            "value": b"",
        },
    ),
    Example(
        "8.4 deletion V2 with delete time",
        "8058000615000210"
        "0000001b00001210"
        "17a8b0d8e6f50000"
        "0000000000000005"
        "0000000000000002"
        "66a0b3c4"
        "00"
        "0868656c6c6f",
        True,
        "deletion",
        {**HELLO_HEADER, "ext_len": 21, "body_len": 27},
        {
            "by_seqno": 5,
            "rev_seqno": 2,
            "delete_time": 1721807812,
            "collection_id": 8,
            "key": b"hello",
        },
    ),
    Example(
        "8.5 expiration",
        "8059000614000210"
        "0000001a00001210"
        "17a8b0d8e6f60000"
        "0000000000000006"
        "0000000000000003"
        "66a0b3c4"
        "0868656c6c6f",
        True,
        "expiration",
        {**HELLO_HEADER, "ext_len": 20, "body_len": 26, "cas": 0x17A8B0D8E6F60000},
        {
            "by_seqno": 6,
            "rev_seqno": 3,
            "delete_time": 0x66A0B3C4,
            "collection_id": 8,
            "key": b"hello",
        },
    ),
    Example(
        "8.6 snapshot marker V1 memory|checkpoint 4..6",
        "8056000014000210000000140000121000000000000000000000000000000004000000000000000600000005",
        True,
        "snapshot_marker",
        {**HELLO_HEADER, "ext_len": 20, "body_len": 20, "cas": 0},
        {
            "marker_version": "1",
            "start_seqno": 4,
            "end_seqno": 6,
            "snapshot_flags": 0x05,
            "max_visible_seqno": None,
            "purge_seqno": None,
        },
    ),
    Example(
        "8.7 snapshot marker V2.0 disk 0..8",
        "8056000001000210000000250000121000000000000000000000000000000000000000000000000008000000"
        "0200000000000000080000000000000007",
        True,
        "snapshot_marker",
        {**HELLO_HEADER, "ext_len": 1, "body_len": 37},
        {
            "marker_version": "2.0",
            "start_seqno": 0,
            "end_seqno": 8,
            "snapshot_flags": 0x02,
            "max_visible_seqno": 8,
            "high_completed_seqno": 7,
            "purge_seqno": None,
        },
    ),
    Example(
        "8.7 snapshot marker V2.2 purge 3",
        "8056000001000210000000350000121000000000000000000200000000000000000000000000000008000000"
        "020000000000000008000000000000000700000000000000030000000000000007",
        True,
        "snapshot_marker",
        {**HELLO_HEADER, "ext_len": 1, "body_len": 53},
        {
            "marker_version": "2.2",
            "start_seqno": 0,
            "end_seqno": 8,
            "snapshot_flags": 0x02,
            "max_visible_seqno": 8,
            "high_completed_seqno": 7,
            "purge_seqno": 3,
            "high_prepared_seqno": 7,
        },
    ),
    Example(
        "8.8 create collection v1 with max TTL",
        "805f000c0d0002100000002d000012100000000000000000000000000000000700000000016d79636f6c6c65"
        "6374696f6e0000000000000002000000000000000800011940",
        True,
        "system_event",
        {**HELLO_HEADER, "key_len": 12, "ext_len": 13, "body_len": 45, "cas": 0},
        {
            "by_seqno": 7,
            "event_id": 0,
            "version": 1,
            "event": "create_collection",
            "manifest_uid": 2,
            "scope_id": 0,
            "collection_id": 8,
            "name": "mycollection",
            "max_ttl": 72000,
        },
    ),
    Example(
        "8.8 create collection v0",
        "805f000c0d00021000000029000012100000000000000000000000000000000700000000006d79636f6c6c65"
        "6374696f6e00000000000000020000000000000008",
        True,
        "system_event",
        {**HELLO_HEADER, "body_len": 41},
        {
            "by_seqno": 7,
            "version": 0,
            "event": "create_collection",
            "manifest_uid": 2,
            "scope_id": 0,
            "collection_id": 8,
            "name": "mycollection",
            "max_ttl": None,
        },
    ),
    Example(
        "8.9 drop collection",
        "805f00000d0002100000001d0000121000000000000000000000000000000009000000010000000000000000"
        "030000000000000008",
        True,
        "system_event",
        {**HELLO_HEADER, "key_len": 0, "body_len": 29},
        {
            "by_seqno": 9,
            "event_id": 1,
            "version": 0,
            "event": "drop_collection",
            "manifest_uid": 3,
            "scope_id": 0,
            "collection_id": 8,
            "name": None,
        },
    ),
    Example(
        "8.9 create scope inventory",
        "805f00090d00021000000022000012100000000000000000000000000000000a0000000300696e76656e746f"
        "7279000000000000000400000009",
        True,
        "system_event",
        {**HELLO_HEADER, "key_len": 9, "body_len": 34},
        {
            "by_seqno": 10,
            "event_id": 3,
            "event": "create_scope",
            "manifest_uid": 4,
            "scope_id": 9,
            "collection_id": None,
            "name": "inventory",
        },
    ),
    Example(
        "8.10 seqno advanced to 12",
        "806400000800021000000008000012100000000000000000000000000000000c",
        True,
        "seqno_advanced",
        {**HELLO_HEADER, "ext_len": 8, "body_len": 8},
        {"by_seqno": 12},
    ),
    Example(
        "8.11 stream end ok",
        "80550000040002100000000400001210000000000000000000000000",
        True,
        "stream_end",
        {**HELLO_HEADER, "ext_len": 4, "stream_id": None},
        {"reason_code": 0, "reason": "ok"},
    ),
    Example(
        "8.11 stream end rollback, stream-id 7",
        "08550300040002100000000700001210000000000000000022000700000006",
        True,
        "stream_end",
        {
            **HELLO_HEADER,
            "magic": 0x08,
            "framing_extras_len": 3,
            "key_len": 0,
            "ext_len": 4,
            "body_len": 7,
            "stream_id": 7,
        },
        {"reason_code": 6, "reason": "rollback"},
    ),
    Example(
        "8.12 OSO start",
        "80650000040002100000000400001210000000000000000000000001",
        True,
        "oso_snapshot",
        {**HELLO_HEADER},
        {"oso_flags": 1},
    ),
    Example(
        "8.12 OSO end",
        "80650000040002100000000400001210000000000000000000000002",
        True,
        "oso_snapshot",
        {**HELLO_HEADER},
        {"oso_flags": 2},
    ),
    Example(
        "8.13 noop from the server",
        "805c000000000000000000000000002a0000000000000000",
        True,
        "noop",
        {"magic": 0x80, "vbucket": 0, "opaque": 0x2A, "body_len": 0},
        {},
    ),
    Example(
        "8.13 noop reply",
        "815c000000000000000000000000002a0000000000000000",
        True,
        "noop",
        {"magic": 0x81, "status": 0, "vbucket": None, "opaque": 0x2A},
        {},
    ),
    Example(
        "8.14 commit",
        "806200061000021000000016000012100000000000000000000000000000000a000000000000000b0868656c"
        "6c6f",
        True,
        "commit",
        {**HELLO_HEADER, "ext_len": 16, "body_len": 22},
        {"prepared_seqno": 10, "commit_seqno": 11, "collection_id": 8, "key": b"hello"},
    ),
]


# Readers the spec has no worked example for: frames laid out by hand from the tables of
# docs/protocol/dcp.md §4.4, §6.1, §6.2, §6.12, §6.13 and §7.6 (plain struct.pack, not dcp_cdc).
EXAMPLES += [
    Example(
        "6.12 prepare, majority",
        "806000061f0102100000002c0000121017a8b0d8e6f70000000000000000000a0000000000000003020000"
        "0600000000000000000000010868656c6c6f7b2261223a317d",
        True,
        "prepare",
        {**HELLO_HEADER, "ext_len": 31, "cas": 0x17A8B0D8E6F70000},
        {
            "by_seqno": 10,
            "rev_seqno": 3,
            "flags": 0x02000006,
            "deleted": 0,
            "durability_level": 1,
            "collection_id": 8,
            "key": b"hello",
            "value": b'{"a":1}',
        },
    ),
    Example(
        "6.12 abort",
        "806300061000021000000016000012100000000000000000000000000000000a000000000000000c0868656c"
        "6c6f",
        True,
        "abort",
        {**HELLO_HEADER, "ext_len": 16},
        {"prepared_seqno": 10, "abort_seqno": 12, "collection_id": 8, "key": b"hello"},
    ),
    Example(
        "4.4 stream request",
        "80530000300002100000003b00000210000000000000000000000000000000000000000000000005ffffffff"
        "ffffffff1122334455667788000000000000000400000000000000057b22756964223a2233227d",
        True,
        "stream_request",
        {"vbucket": 0x0210, "opaque": 0x0210, "ext_len": 48},
        {
            "flags": 0,
            "start_seqno": 5,
            "end_seqno": 0xFFFFFFFFFFFFFFFF,
            "vb_uuid": 0x1122334455667788,
            "snap_start_seqno": 4,
            "snap_end_seqno": 5,
            "value": '{"uid":"3"}',
        },
    ),
    Example(
        "6.1 stream request response, failover log",
        "815300000000000000000020000002100000000000000000aabbccddeeff001100000000000000641122334455"
        "6677880000000000000000",
        True,
        "stream_request_response",
        {"status": 0, "vbucket": None, "opaque": 0x0210},
        {
            "status_name": "success",
            "rollback_seqno": None,
            "failover_log": ((0xAABBCCDDEEFF0011, 100), (0x1122334455667788, 0)),
        },
    ),
    Example(
        "6.1 stream request response, rollback to 42",
        "815300000000002300000008000002100000000000000000000000000000002a",
        True,
        "stream_request_response",
        {"status": 0x23},
        {"status_name": "rollback", "rollback_seqno": 42, "failover_log": None},
    ),
    Example(
        "6.1 stream request response, not my vbucket",
        "815300000000000700000000000002100000000000000000",
        True,
        "stream_request_response",
        {"status": 0x07},
        {"status_name": "not_my_vbucket", "rollback_seqno": None, "failover_log": None},
    ),
    Example(  # the seed's add-stream document (add-stream.md), its two example frames
        "add stream request, takeover",
        "80510000040000050000000400000001000000000000000000000001",
        True,
        "add_stream",
        {"vbucket": 5, "opaque": 1, "ext_len": 4, "body_len": 4, "status": None},
        {"flags": 0x01, "flag_names": ("takeover",)},
    ),
    Example(
        "add stream response, stream opaque 0x1000",
        "81510000040000000000000400000001000000000000000000001000",
        True,
        "add_stream_response",
        {"status": 0, "vbucket": None, "opaque": 1, "ext_len": 4, "body_len": 4},
        {"status_name": "success", "stream_opaque": 0x1000, "value": b""},
    ),
    Example(
        "6.2 get failover log",
        "805400000000021000000000000000990000000000000000",
        True,
        "failover_log_request",
        {"vbucket": 0x0210, "opaque": 0x99},
        {},
    ),
    Example(
        "6.2 failover log response",
        "81540000000000000000001000000099000000000000000011223344556677880000000000000000",
        True,
        "failover_log_response",
        {"status": 0, "opaque": 0x99},
        {"status_name": "success", "failover_log": ((0x1122334455667788, 0),)},
    ),
    Example(  # the capture agent records one at the end of each session (docs: capture)
        "get all vb seqnos, active vbuckets",
        "80480000040000000000000400010009000000000000000000000001",
        True,
        "vb_seqnos_request",
        {"vbucket": 0, "opaque": 0x10009, "ext_len": 4},
        {"vbucket_state": 1, "collection_id": None},
    ),
    Example(
        "get all vb seqnos response, two vbuckets",
        "814800000000000000000014000100090000000000000000000300000000000000070005000000000000002a",
        True,
        "vb_seqnos_response",
        {"status": 0, "opaque": 0x10009, "body_len": 20},
        {"status_name": "success", "high_seqnos": ((3, 7), (5, 42)), "value": b""},
    ),
    Example(
        "get all vb seqnos, every state (no extras)",
        "804800000000000000000000000100090000000000000000",
        True,
        "vb_seqnos_request",
        {"vbucket": 0, "opaque": 0x10009, "ext_len": 0, "body_len": 0},
        {"vbucket_state": None, "collection_id": None},
    ),
    Example(
        "get all vb seqnos of collection 0xa, active vbuckets",
        "804800000800000000000008000100090000000000000000000000010000000a",
        True,
        "vb_seqnos_request",
        {"vbucket": 0, "opaque": 0x10009, "ext_len": 8, "body_len": 8},
        {"vbucket_state": 1, "collection_id": 0xA},
    ),
    Example(
        "get all vb seqnos response, no active vbucket",
        "814800000000000000000000000100090000000000000000",
        True,
        "vb_seqnos_response",
        {"status": 0, "opaque": 0x10009, "body_len": 0},
        {"status_name": "success", "high_seqnos": (), "value": b""},
    ),
    Example(  # u64 seqnos: bronze keeps the same bits in a BIGINT
        "get all vb seqnos response, vbucket 1023 at a seqno above 2^63",
        "81480000000000000000000a00010009000000000000000003ff8000000000000001",
        True,
        "vb_seqnos_response",
        {"status": 0, "opaque": 0x10009, "body_len": 10},
        {"status_name": "success", "high_seqnos": ((1023, 2**63 + 1),), "value": b""},
    ),
    Example(
        "get all vb seqnos response, not supported",
        "8148000000000083000000020001000900000000000000006e6f",
        True,
        "vb_seqnos_response",
        {"status": 0x83, "opaque": 0x10009, "body_len": 2},
        {"status_name": "not_supported", "high_seqnos": None, "value": b"no"},
    ),
    Example(
        "7.6 buffer acknowledgement",
        "805d0000040000000000000400000000000000000000000000010000",
        True,
        "buffer_ack",
        {"vbucket": 0, "ext_len": 4},
        {"buffer_bytes": 65536},
    ),
    Example(
        "6.13 set vbucket state active",
        "805b0000010002100000000100001210000000000000000001",
        True,
        "set_vbucket_state",
        {**HELLO_HEADER},
        {"vbucket_state": 1},
    ),
    Example(
        "DCP_OPEN response: no reader, an unknown frame",
        "815000000000000000000000000000010000000000000000",
        True,
        "unknown",
        {"status": 0, "opcode": 0x50, "opaque": 1},
        {"raw": bytes.fromhex("815000000000000000000000000000010000000000000000")},
    ),
]
