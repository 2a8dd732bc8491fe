"""The capture section of a bucket (``[buckets.capture]``): the capture agent's settings, its
connection string (parsed here, once: the agent reads the result) and the folders it writes.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import tempfile
from pathlib import Path
from typing import Annotated, NamedTuple

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from dcp_cdc.config.base import ConfigModel
from dcp_cdc.errors import ConfigError

CAPTURE_DIR = ".dcp-cdc-capture"
"""The capture agent's folder inside a landing folder: its staging files (``*.partial``, never
listed by bronze; the same file system, so the rename into landing is atomic) and, by default,
its checkpoints."""
OBJECT_STORE_SCHEMES = ("s3", "s3a")
"""Landing locations the capture agent writes to through an object store's API."""
MAX_VBUCKET = 1023
DEFAULT_PORTS = {"couchbase": 11210, "couchbases": 11207}
_CONNECTION = re.compile(r"^(couchbases?)://([^/?#]+)/?$")
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(?::([0-9]{1,5}))?$")
_VBUCKETS = re.compile(r"^\s*([0-9]{1,4})\s*-\s*([0-9]{1,4})\s*$")
_COLLECTION_NAME = r"[A-Za-z0-9_%-]{1,251}"
COLLECTION_PATTERN = rf"^{_COLLECTION_NAME}\.{_COLLECTION_NAME}$"
"""A ``scope.collection`` name."""
_COLLECTION = re.compile(COLLECTION_PATTERN)
_MANAGER_PORTS = {8091, 18091}
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_HOSTNAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}))*$")
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::"})
"""Listen addresses that stand for every interface."""


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def listen_host(value: str) -> str:
    """``value`` if it is an IP address or a host name to listen on (a ``metrics_host``),
    else ValueError (pydantic names the field)."""
    if not (_is_ip(value) or _HOSTNAME.match(value)):
        raise ValueError(f"expected an IP address or a host name, got {value!r}")
    return value


class HostPort(NamedTuple):
    """A data node's address."""

    host: str
    port: int

    @property
    def label(self) -> str:
        """``host:port``, IPv6 hosts in brackets: how errors name a node."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def __str__(self) -> str:
        return self.label


class ConnectionString(NamedTuple):
    """A parsed connection string: TLS or not, and the seed nodes, default ports filled in."""

    tls: bool
    seeds: tuple[HostPort, ...]

    @property
    def scheme(self) -> str:
        return "couchbases" if self.tls else "couchbase"

    def __str__(self) -> str:
        return f"{self.scheme}://" + ",".join(s.label for s in self.seeds)


def parse_connection_string(text: str) -> ConnectionString:
    """The seeds of ``couchbase://h1,h2:11210`` or ``couchbases://...`` (TLS), hosts separated
    by ``,`` or ``;``; a host without a port gets the data service's (11210, 11207 with TLS).
    IPv6 hosts are written in brackets. The one parser of connection strings: the
    configuration validates with it and the capture agent dials what it returns.
    :class:`ConfigError` says what is wrong, naming the string unless it may hold a secret."""
    if "@" in text:  # not echoed: the part before the @ may be a password
        raise ConfigError(
            "credentials do not belong in the connection string: set username, and "
            "password_env or password_file"
        )
    match = _CONNECTION.match(text.strip())
    if not match:
        raise ConfigError(
            f"connection string {text!r}: expected couchbase://host[:port][,host[:port]...] "
            "or couchbases://... (TLS)"
        )
    scheme, hosts = match.groups()
    seeds = []
    for item in re.split("[,;]", hosts):
        host = _HOST.match(item.strip())
        if not host:
            raise ConfigError(
                f"connection string {text!r}: {item.strip()!r} is not a host or host:port"
            )
        port = int(host.group(2)) if host.group(2) else DEFAULT_PORTS[scheme]
        if not 1 <= port <= 65535:
            raise ConfigError(
                f"connection string {text!r}: port {port} of {item.strip()!r} is not 1..65535"
            )
        if port in _MANAGER_PORTS:
            raise ConfigError(
                f"connection string {text!r}: port {port} is the cluster manager's HTTP port; "
                "the agent talks to the data service (11210, or 11207 with couchbases://)"
            )
        seeds.append(HostPort(host.group(1).strip("[]"), port))
    return ConnectionString(scheme == "couchbases", tuple(dict.fromkeys(seeds)))


def is_object_store(location: object) -> bool:
    """True for an ``s3://`` or ``s3a://`` location (a string; a :class:`Path` is local)."""
    if not isinstance(location, str) or "://" not in location:
        return False
    return location.split("://", 1)[0].lower() in OBJECT_STORE_SCHEMES


def default_staging(landing: str) -> Path:
    """The local staging folder of an agent whose landing is an object store: one folder per
    landing below the system's temporary folder (what is lost with it was never
    checkpointed; ``staging_dir`` puts it elsewhere)."""
    digest = hashlib.sha256(landing.rstrip("/").encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / "dcp-cdc-staging" / digest


def parse_vbucket_range(text: str) -> tuple[int, int]:
    """``(first, last)`` of ``"A-B"``, both within 0..1023 and ``A <= B``."""
    match = _VBUCKETS.match(text)
    if not match:
        raise ValueError(f"expected a range of vbuckets like '0-511', got {text!r}")
    first, last = int(match.group(1)), int(match.group(2))
    if last > MAX_VBUCKET or first > last:
        raise ValueError(f"expected 0 <= A <= B <= {MAX_VBUCKET} in 'A-B', got {text!r}")
    return first, last


class CaptureConfig(ConfigModel):
    """The capture agent of this bucket (``dcp-cdc capture``): a DCP consumer that records the
    bucket's changes into capture files in its landing folder. The password is never written
    here: ``password_env`` or ``password_file`` says where it is read from, when it is used.
    With a client certificate (``tls_cert_file`` and ``tls_key_file``) the nodes authenticate
    the user the certificate maps to, and no password is set."""

    connection_string: str
    """``couchbase://host1,host2`` or ``couchbases://...`` (TLS): the cluster's data nodes to
    start from, each ``host`` or ``host:port`` (default 11210, 11207 with TLS; IPv6 in
    brackets). The agent learns the other nodes from the cluster map."""
    username: str | None = Field(default=None, min_length=1)
    """The user the agent authenticates as; it needs the Data DCP Reader role on the bucket.
    Required, unless a client certificate names the user (then it only labels messages)."""
    password_env: str | None = None
    """The environment variable holding the password (exactly one of ``password_env`` and
    ``password_file``; neither with a client certificate)."""
    password_file: str | None = None
    """A file holding the password (one trailing newline is ignored); relative to the
    configuration file's folder."""
    tls_ca_file: str | None = None
    """With ``couchbases://``: the PEM file of the CA that signed the cluster's certificates
    (default: the system's trust store); relative to the configuration file's folder."""
    tls_cert_file: str | None = None
    """With ``couchbases://``: a client certificate (PEM; its chain may follow it) the agent
    presents to every node (mutual TLS). The node authenticates the user the certificate maps
    to (the cluster's client-certificate settings), so no password is set. Relative to the
    configuration file's folder."""
    tls_key_file: str | None = None
    """The private key of ``tls_cert_file`` (PEM, not encrypted; keep it ``chmod 600``);
    relative to the configuration file's folder."""
    buffer_bytes: Annotated[int, Field(ge=1 << 16, le=1 << 30)] = 16 << 20
    """DCP flow control: the bytes a node may send before the agent acknowledges them
    (``connection_buffer_size``). The agent's memory is about this × the number of nodes."""
    noop_interval_s: Annotated[int, Field(ge=1, le=3600)] = 120
    """Seconds between the nodes' DCP_NOOPs (``set_noop_interval``): a node that hears no
    reply in time drops the connection, and the agent reconnects."""
    rotate_bytes: Annotated[int, Field(ge=1 << 12)] = 64 << 20
    """A capture file is closed (made durable and renamed into landing) once it holds this
    many bytes."""
    rotate_seconds: Annotated[float, Field(ge=0.01)] = 300.0
    """A capture file is also closed this many seconds after its first frame: the longest a
    change waits in staging before an ingest can see it."""
    vbuckets: str | None = None
    """``"A-B"`` (within 0–1023): capture only these vbuckets, so that several agents (each
    its own ``agent_id``) share a bucket. Default: every vbucket."""
    collections: list[str] | None = None
    """Capture only these collections, ``["scope.collection", ...]``. Default: all."""
    state_dir: str | None = None
    """Where the checkpoint ``<bucket>.<agent_id>.checkpoint.json`` is kept: a folder, or an
    ``s3://bucket/prefix``. Default: ``<landing>/.dcp-cdc-capture`` (with an ``s3://``
    landing, that prefix in the store); relative to the configuration file's folder."""
    staging_dir: str | None = None
    """With an ``s3://`` (``s3a://``) landing: the local folder where files are written
    before their upload (it may be lost: no checkpoint covers it). Default: a folder per
    landing below the system's temporary folder. A local landing stages in
    ``<landing>/.dcp-cdc-capture`` (the same file system, for the atomic rename) and refuses
    this setting."""
    agent_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9_]{1,64}$")] = "agent"
    """Names this agent's checkpoint and capture sessions; agents splitting a bucket need
    different ids."""
    connect_timeout_s: Annotated[float, Field(ge=0.1, le=600)] = 10.0
    """Seconds to connect, handshake and authenticate with a node before giving up on it."""
    reconnect_timeout_s: Annotated[float, Field(ge=0, le=86400)] = 60.0
    """Seconds a node that went away (a restart, an upgrade, a failover) is tried again,
    with a growing pause and jitter between attempts, before the capture gives up on it and
    exits with an error. The node's vbuckets wait meanwhile; the others go on."""
    metrics_port: Annotated[int | None, Field(ge=1, le=65535)] = None
    """Serve the agent's Prometheus metrics (``/metrics``) and its health (``/healthz``,
    ``/readyz``) over HTTP on this port (docs/metrics.md). Default: off. Buckets whose
    agents share a host need different ports."""
    metrics_host: Annotated[str, Field(min_length=1, max_length=253)] = "127.0.0.1"
    """The address ``metrics_port`` listens on: the loopback interface by default, so that
    only this host reaches it; ``0.0.0.0`` (or ``::``) for every interface, e.g. in a
    container scraped from outside it. The endpoint has no authentication."""
    lag_poll_s: Annotated[float, Field(ge=0.1, le=3600)] = 10.0
    """Seconds between the agent's requests for every node's high seqnos
    (GET_ALL_VB_SEQNOS): the cluster's side of the lag the agent reports per vbucket."""
    stall_after_s: Annotated[float, Field(ge=0.1, le=86400)] = 300.0
    """A vbucket whose position has not moved for this many seconds while the cluster has
    newer seqnos for it is stalled: the agent logs it, counts it in its metrics, and
    ``/readyz`` fails until it moves again."""

    @model_validator(mode="before")
    @classmethod
    def _no_literal_password(cls, data: object) -> object:
        if isinstance(data, dict) and "password" in data:
            raise ValueError(
                "password: a password is never written in the configuration; put it in an "
                "environment variable (password_env) or a file (password_file)"
            )
        return data

    _connection: ConnectionString = PrivateAttr()

    @field_validator("connection_string")
    @classmethod
    def _connection_string(cls, value: str) -> str:
        try:
            parse_connection_string(value)
        except ConfigError as exc:  # pydantic names the field and the file
            raise ValueError(str(exc)) from None
        return value

    @field_validator("password_env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME.match(value):
            # not echoed: a password pasted here by mistake must not reach the message
            raise ValueError("expected an environment variable's name (letters, digits, _)")
        return value

    @field_validator("password_file")
    @classmethod
    def _file_name(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be empty")
        return value

    @field_validator("tls_ca_file", "tls_cert_file", "tls_key_file")
    @classmethod
    def _tls_file(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        connection = info.data.get("connection_string")
        if connection is not None and not parse_connection_string(connection).tls:
            raise ValueError("set, but the connection string is not couchbases://")
        if not Path(value).expanduser().is_file():
            raise ValueError(f"{value} is not a file")
        return value

    @field_validator("metrics_host")
    @classmethod
    def _metrics_host(cls, value: str) -> str:
        return listen_host(value)

    @field_validator("vbuckets")
    @classmethod
    def _vbuckets(cls, value: str | None) -> str | None:
        if value is not None:
            parse_vbucket_range(value)
        return value

    @field_validator("collections")
    @classmethod
    def _collections(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("list at least one collection, or leave collections out for all")
        bad = [name for name in value if not _COLLECTION.match(name)]
        if bad:
            raise ValueError(f"expected 'scope.collection' names, got {bad}")
        return value

    @model_validator(mode="after")
    def _credentials(self) -> CaptureConfig:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError(
                "tls_cert_file, tls_key_file: set both (the client certificate and its "
                "private key) or neither"
            )
        if self.client_certificate:
            if self.password_env is not None or self.password_file is not None:
                raise ValueError(
                    "password_env, password_file: not used with a client certificate "
                    "(tls_cert_file): the nodes authenticate the user the certificate maps "
                    "to, and a connection so authenticated takes no password; remove them"
                )
            return self
        if self.username is None:
            raise ValueError(
                "username: required (the user the agent authenticates as), unless a client "
                "certificate (tls_cert_file, tls_key_file) authenticates the agent"
            )
        if (self.password_env is None) == (self.password_file is None):
            raise ValueError(
                "password_env, password_file: set exactly one (the environment variable or "
                "the file the password is read from)"
            )
        return self

    def model_post_init(self, context: object, /) -> None:
        self._connection = parse_connection_string(self.connection_string)

    @property
    def connection(self) -> ConnectionString:
        """The connection string, parsed (when the section was validated)."""
        return self._connection

    @property
    def tls(self) -> bool:
        """True for ``couchbases://``."""
        return self._connection.tls

    @property
    def client_certificate(self) -> bool:
        """True when the agent authenticates by a client certificate (mutual TLS)."""
        return self.tls_cert_file is not None

    @property
    def seed_nodes(self) -> tuple[HostPort, ...]:
        """The connection string's ``(host, port)`` pairs, default ports filled in."""
        return self._connection.seeds

    def vbucket_range(self) -> tuple[int, int] | None:
        """``(first, last)`` of ``vbuckets``; None: every vbucket."""
        return None if self.vbuckets is None else parse_vbucket_range(self.vbuckets)

    def password(self) -> str:
        """The password, read at each call from ``password_env`` or ``password_file``
        (:func:`read_password`). A :class:`ConfigError` names the variable or the file,
        never the secret."""
        if self.password_env is None and self.password_file is None:
            raise ConfigError(
                "capture password: none is set (a client certificate, tls_cert_file, "
                "authenticates the agent)"
            )
        return read_password(self.password_env, self.password_file)


def read_password(
    password_env: str | None,
    password_file: str | None,
    *,
    what: str = "capture password",
    settings: tuple[str, str] = ("password_env", "password_file"),
) -> str:
    """A password read at each call from the environment variable ``password_env``, else from
    the file ``password_file`` (UTF-8, one trailing newline ignored). A :class:`ConfigError`
    says ``what`` and names the variable or the file and its setting (``settings``: the names
    of the two), never the secret."""
    env_setting, file_setting = settings
    if password_env is not None:
        value = os.environ.get(password_env)
        if value is None:
            raise ConfigError(
                f"{what}: the environment variable {password_env} ({env_setting}) is not set"
            )
        where = f"the environment variable {password_env}"
    elif password_file is not None:
        where = f"{file_setting} {password_file}"
        try:
            raw = Path(password_file).expanduser().read_bytes()
        except FileNotFoundError:
            raise ConfigError(f"{what}: {where} not found") from None
        except OSError as exc:
            raise ConfigError(f"{what}: {where} cannot be read ({exc.strerror})") from None
        try:
            value = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ConfigError(f"{what}: {where} is not UTF-8 text") from None
        value = value.removesuffix("\r\n") if value.endswith("\r\n") else value.removesuffix("\n")
    else:
        raise ConfigError(f"{what}: neither {env_setting} nor {file_setting} is set")
    if not value:
        raise ConfigError(f"{what}: {where} is empty")
    return value


class CaptureDirs(NamedTuple):
    """The folders of a bucket's capture agent (:meth:`dcp_cdc.config.AppConfig.capture_dirs`)."""

    landing: Path | str
    """Where its capture files are published, once durable: a folder, or ``s3://...``."""
    staging: Path
    """The local files it is writing (``*.partial``): ``<landing>/.dcp-cdc-capture``, or
    ``capture.staging_dir`` (an object store's landing)."""
    state: Path | str
    """Where its checkpoint is kept: ``capture.state_dir``, else the landing's
    ``.dcp-cdc-capture`` (a folder, or a prefix in the store)."""
