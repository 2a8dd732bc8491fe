"""The cluster map (CCCP) a data node returns.

The seed nodes to ask for it come from the connection string, parsed by the configuration
(:func:`dcp_cdc.config.capture.parse_connection_string`). The cluster map
(GET_CLUSTER_CONFIG, a NOT_MY_VBUCKET body, a cluster-map change notification) says which
data node owns each vbucket: ``vBucketServerMap.vBucketMap[vb][0]`` indexes
``vBucketServerMap.serverList`` (plain KV endpoints); ``nodesExt`` gives each node's TLS port.
``$HOST`` in a map stands for the host we dialled. The ids of the collections a capture
names come from the bucket's collections manifest (:func:`collection_ids`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dcp_cdc.config.capture import HostPort
from dcp_cdc.errors import ConfigError, ProtocolError

KV_PORT = 11210
"""The data service's port, where a cluster map's server list names none."""


def _host_port(text: str, default_port: int) -> HostPort:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port``; ValueError when it is none of them."""
    if text.startswith("["):
        close = text.find("]")
        if close < 2:
            raise ValueError(f"unclosed IPv6 bracket in {text!r}")
        host, rest = text[1:close], text[close + 1 :]
        if ":" not in host:
            raise ValueError(f"brackets hold an IPv6 address, got {host!r}")
        if rest and not rest.startswith(":"):
            raise ValueError(f"unexpected {rest!r} after the IPv6 address")
        port_text = rest[1:] if rest else ""
    else:
        host, _, port_text = text.partition(":")
        if ":" in port_text:
            raise ValueError(f"an IPv6 address must be in brackets: {text!r}")
        if not host or any(c in host for c in "/?#@ "):
            raise ValueError(f"bad host {host!r}")
    if not port_text:
        return HostPort(host, default_port)
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"bad port {port_text!r}")
    return HostPort(host, int(port_text))


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """One ``nodesExt`` entry: the host and its KV ports (None when it runs no data service)."""

    host: str
    kv_port: int | None
    kv_tls_port: int | None


@dataclass(frozen=True)
class ClusterMap:
    rev: int
    rev_epoch: int
    bucket: str | None
    bucket_uuid: str | None
    nodes: tuple[NodeInfo, ...]
    servers: tuple[HostPort, ...]
    """``vBucketServerMap.serverList``, plain KV endpoints, ``$HOST`` resolved."""
    owners: tuple[int, ...]
    """Per vbucket, the index of its active node in :attr:`servers`; -1 = none."""

    @property
    def num_vbuckets(self) -> int:
        return len(self.owners)

    @property
    def version(self) -> tuple[int, int]:
        """(revEpoch, rev): a map is newer when this is greater."""
        return (self.rev_epoch, self.rev)

    def endpoint(self, server: int, *, tls: bool) -> HostPort:
        """Where to dial server ``server`` of :attr:`servers` (its TLS port when ``tls``)."""
        plain = self.servers[server]
        if not tls:
            return plain
        for node in self.nodes:
            if node.host == plain.host and node.kv_port == plain.port:
                if node.kv_tls_port is None:
                    break
                return HostPort(node.host, node.kv_tls_port)
        raise ProtocolError(f"cluster map rev {self.rev}: no kvSSL port for data node {plain}")

    def owner(self, vbucket: int, *, tls: bool) -> HostPort | None:
        """The endpoint of the node holding ``vbucket`` active, None when no node does."""
        index = self.owners[vbucket]
        return None if index < 0 else self.endpoint(index, tls=tls)

    def vbuckets_by_owner(
        self, vbuckets: range | tuple[int, ...], *, tls: bool
    ) -> dict[HostPort, list[int]]:
        """Our vbuckets grouped by the endpoint of their active node (ownerless ones left out)."""
        out: dict[HostPort, list[int]] = {}
        for vb in vbuckets:
            if vb < len(self.owners) and self.owners[vb] >= 0:
                out.setdefault(self.endpoint(self.owners[vb], tls=tls), []).append(vb)
        return out


def _int_field(obj: Mapping[str, object], name: str, what: str) -> int:
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ProtocolError(f"cluster map: {what} must be a non-negative integer, got {value!r}")
    return value


def parse_cluster_map(raw: bytes | str | Mapping[str, object], dialled_host: str) -> ClusterMap:
    """A cluster map from its JSON; ``$HOST`` (and a node without a hostname) means
    ``dialled_host``. :class:`ProtocolError` says what is missing or malformed."""
    if isinstance(raw, Mapping):
        data: object = raw
    else:
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ProtocolError(f"cluster map is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ProtocolError("cluster map is not a JSON object")
    rev = _int_field(data, "rev", "rev")
    rev_epoch = _int_field(data, "revEpoch", "revEpoch") if "revEpoch" in data else 0
    nodes: list[NodeInfo] = []
    raw_nodes = data.get("nodesExt", [])
    if not isinstance(raw_nodes, list):
        raise ProtocolError("cluster map: nodesExt must be a list")
    for entry in raw_nodes:
        if not isinstance(entry, dict) or not isinstance(entry.get("services", {}), dict):
            raise ProtocolError(f"cluster map: bad nodesExt entry {entry!r}")
        services = entry.get("services", {})
        host = str(entry.get("hostname") or "$HOST").replace("$HOST", dialled_host)
        kv = services.get("kv")
        kv_tls = services.get("kvSSL")
        nodes.append(
            NodeInfo(
                host,
                kv if isinstance(kv, int) else None,
                kv_tls if isinstance(kv_tls, int) else None,
            )
        )
    vb_map = data.get("vBucketServerMap")
    if not isinstance(vb_map, dict):
        raise ProtocolError("cluster map has no vBucketServerMap (not a couchbase bucket?)")
    server_list = vb_map.get("serverList")
    table = vb_map.get("vBucketMap")
    if not isinstance(server_list, list) or not isinstance(table, list) or not table:
        raise ProtocolError("cluster map: vBucketServerMap needs serverList and vBucketMap")
    try:
        servers = tuple(
            _host_port(str(s).replace("$HOST", dialled_host), KV_PORT) for s in server_list
        )
    except ValueError as exc:
        raise ProtocolError(f"cluster map: bad serverList entry: {exc}") from None
    owners: list[int] = []
    for vb, chain in enumerate(table):
        if not isinstance(chain, list) or not chain or not isinstance(chain[0], int):
            raise ProtocolError(f"cluster map: vBucketMap[{vb}] is not a list of server indexes")
        if not -1 <= chain[0] < len(servers):
            raise ProtocolError(
                f"cluster map: vBucketMap[{vb}] names server {chain[0]}, "
                f"the serverList has {len(servers)}"
            )
        owners.append(chain[0])
    uuid = data.get("uuid")
    name = data.get("name")
    return ClusterMap(
        rev=rev,
        rev_epoch=rev_epoch,
        bucket=name if isinstance(name, str) else None,
        bucket_uuid=uuid if isinstance(uuid, str) and uuid else None,
        nodes=tuple(nodes),
        servers=servers,
        owners=tuple(owners),
    )


def collection_ids(manifest: dict[str, Any], names: tuple[str, ...]) -> tuple[int, ...]:
    """The ids of ``scope.collection`` names in a collections manifest (uids are hex)."""
    known: dict[str, int] = {}
    for scope in manifest.get("scopes", []):
        for coll in scope.get("collections", []):
            known[f"{scope.get('name')}.{coll.get('name')}"] = int(str(coll.get("uid")), 16)
    missing = [n for n in names if n not in known]
    if missing:
        raise ConfigError(
            f"capture collections {missing} are not in the bucket's manifest "
            f"(known: {sorted(known)})"
        )
    return tuple(known[n] for n in names)
