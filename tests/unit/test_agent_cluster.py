"""Connection strings, the cluster map and vbucket positions of the capture agent."""

from __future__ import annotations

import json

import pytest

from dcp_cdc.agent.cluster import parse_cluster_map
from dcp_cdc.agent.positions import VbPosition, prune_log, uuid_at
from dcp_cdc.config.capture import HostPort, parse_connection_string
from dcp_cdc.errors import CheckpointError, ConfigError, ProtocolError


@pytest.mark.parametrize(
    ("text", "tls", "seeds"),
    [
        ("couchbase://h1", False, [("h1", 11210)]),
        ("couchbase://h1,h2:12000", False, [("h1", 11210), ("h2", 12000)]),
        ("couchbases://h1,h2", True, [("h1", 11207), ("h2", 11207)]),
        ("couchbase://[::1]:11300,[fe80::2]", False, [("::1", 11300), ("fe80::2", 11210)]),
        ("couchbase://10.0.0.1/", False, [("10.0.0.1", 11210)]),
        ("couchbase://a;b", False, [("a", 11210), ("b", 11210)]),
    ],
)
def test_connection_strings(text: str, tls: bool, seeds: list[tuple[str, int]]) -> None:
    cs = parse_connection_string(text)
    assert cs.tls is tls
    assert [(s.host, s.port) for s in cs.seeds] == seeds


@pytest.mark.parametrize(
    "text",
    [
        "http://h1",
        "h1:11210",
        "couchbase://",
        "couchbase://h1,,h2",
        "couchbase://h1/bucket",
        "couchbase://h1?network=external",
        "couchbase://user@h1",
        "couchbase://h1:0",
        "couchbase://h1:99999",
        "couchbase://h1:port",
        "couchbase://::1",
        "couchbase://[::1",
        "couchbase://[::1]x",
    ],
)
def test_bad_connection_strings_name_the_string(text: str) -> None:
    with pytest.raises(ConfigError, match="connection string") as info:
        parse_connection_string(text)
    if "@" in text:  # the part before the @ may be a password: not echoed
        assert text not in str(info.value) and "credentials" in str(info.value)
    else:
        assert repr(text) in str(info.value)


def test_ipv6_label_is_bracketed() -> None:
    assert HostPort("::1", 11210).label == "[::1]:11210"
    assert HostPort("h", 1).label == "h:1"


def _map(**overrides: object) -> dict[str, object]:
    """The shape of a Couchbase Server 7.x terse bucket config (as gocbcore's testdata)."""
    data: dict[str, object] = {
        "rev": 1073,
        "revEpoch": 2,
        "name": "travel-sample",
        "uuid": "3f32f5a3d15ac1d6e0e0a9a9c0a11b2d",
        "nodeLocator": "vbucket",
        "bucketCapabilitiesVer": "",
        "bucketCapabilities": ["collections", "durableWrite", "dcp", "cccp", "xattr"],
        "nodes": [
            {"couchApiBase": "http://$HOST:8092/travel-sample", "hostname": "$HOST:8091",
             "ports": {"direct": 11210}},
            {"couchApiBase": "http://10.0.0.2:8092/travel-sample", "hostname": "10.0.0.2:8091",
             "ports": {"direct": 11210}},
        ],
        "nodesExt": [
            {"services": {"mgmt": 8091, "mgmtSSL": 18091, "kv": 11210, "kvSSL": 11207,
                          "capi": 8092, "projector": 9999}, "thisNode": True},
            {"services": {"mgmt": 8091, "mgmtSSL": 18091, "kv": 11210, "kvSSL": 11207},
             "hostname": "10.0.0.2"},
            {"services": {"mgmt": 8091, "n1ql": 8093}, "hostname": "10.0.0.3"},
        ],
        "vBucketServerMap": {
            "hashAlgorithm": "CRC",
            "numReplicas": 1,
            "serverList": ["$HOST:11210", "10.0.0.2:11210"],
            "vBucketMap": [[0, 1], [1, 0], [1, -1], [-1, -1]],
        },
        "clusterCapabilitiesVer": [1, 0],
    }  # fmt: skip
    data.update(overrides)
    return data


def test_cluster_map_owners_and_host_substitution() -> None:
    cmap = parse_cluster_map(json.dumps(_map()).encode(), "10.0.0.1")
    assert cmap.version == (2, 1073)
    assert cmap.bucket == "travel-sample"
    assert cmap.bucket_uuid == "3f32f5a3d15ac1d6e0e0a9a9c0a11b2d"
    assert cmap.num_vbuckets == 4
    assert cmap.servers == (HostPort("10.0.0.1", 11210), HostPort("10.0.0.2", 11210))
    assert cmap.owner(0, tls=False) == HostPort("10.0.0.1", 11210)
    assert cmap.owner(1, tls=True) == HostPort("10.0.0.2", 11207)
    assert cmap.owner(3, tls=False) is None
    assert cmap.nodes[2].kv_port is None
    grouped = cmap.vbuckets_by_owner(range(4), tls=False)
    assert grouped == {HostPort("10.0.0.1", 11210): [0], HostPort("10.0.0.2", 11210): [1, 2]}


def test_cluster_map_without_rev_epoch_is_epoch_zero() -> None:
    data = _map()
    del data["revEpoch"]
    assert parse_cluster_map(data, "h").version == (0, 1073)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rev": "1"}, "rev"),
        ({"vBucketServerMap": None}, "vBucketServerMap"),
        ({"vBucketServerMap": {"serverList": ["a:1"], "vBucketMap": [[3]]}}, r"vBucketMap\[0\]"),
        ({"vBucketServerMap": {"serverList": ["a:x"], "vBucketMap": [[0]]}}, "serverList"),
        ({"nodesExt": "x"}, "nodesExt"),
    ],
)
def test_bad_cluster_maps_are_protocol_errors(change: dict[str, object], message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        parse_cluster_map(_map(**change), "h")
    with pytest.raises(ProtocolError, match="not JSON"):
        parse_cluster_map(b"{", "h")


def test_tls_endpoint_needs_kv_ssl() -> None:
    data = _map(nodesExt=[{"services": {"kv": 11210}, "hostname": "$HOST"}])
    cmap = parse_cluster_map(data, "10.0.0.1")
    with pytest.raises(ProtocolError, match="kvSSL"):
        cmap.owner(0, tls=True)


def test_failover_log_rules() -> None:
    log = ((0xBBB, 100), (0xAAA, 0))
    assert uuid_at(log, 50) == 0xAAA
    assert uuid_at(log, 100) == 0xBBB
    assert uuid_at((), 7) == 0
    assert prune_log(log, 99) == ((0xAAA, 0),)


def test_position_json_round_trip() -> None:
    pos = VbPosition(5, 120, 2**63 + 5, ((2**63 + 5, 100), (7, 0)), manifest_uid=3, purge_seqno=9)
    data = json.loads(json.dumps(pos.to_json()))
    assert data["vb_uuid"] == 2**63 + 5
    assert VbPosition.from_json(data) == pos


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"seqno": 1, "vb_uuid": "0"}, "'vbucket' is missing"),
        ({"vbucket": 1, "seqno": -1, "vb_uuid": "0"}, "position field 'seqno'"),
        ({"vbucket": 1, "seqno": 1, "vb_uuid": "x"}, "vb_uuid"),
        ({"vbucket": 1, "seqno": 1, "vb_uuid": "0", "failover_log": [[1]]}, "failover_log"),
        ({"vbucket": True, "seqno": 1, "vb_uuid": "0"}, "vbucket"),
    ],
)
def test_bad_positions_are_checkpoint_errors(data: dict[str, object], message: str) -> None:
    with pytest.raises(CheckpointError, match=message):
        VbPosition.from_json(data)
