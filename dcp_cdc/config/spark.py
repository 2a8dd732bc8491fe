"""The Spark sessions (``[spark]``), the catalog service they share (a Hive metastore or a
Derby network server) and the Thrift server over the catalog (``[thrift]``)."""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from dcp_cdc.config.base import ConfigModel


@dataclass(frozen=True, slots=True)
class MetastoreAddress:
    """A catalog service of ``[spark] metastore``: ``scheme`` is ``thrift`` (a Hive metastore;
    ``endpoints`` may be several) or ``derby`` (a Derby network server, ``database`` its path
    on the server's machine when the address names one)."""

    scheme: Literal["thrift", "derby"]
    endpoints: tuple[tuple[str, int], ...]
    database: str | None = None

    def __str__(self) -> str:
        hosts = ",".join(
            f"{self.scheme}://{f'[{host}]' if ':' in host else host}:{port}"
            for host, port in self.endpoints
        )
        return hosts + (self.database or "")


_METASTORE_ENDPOINT = re.compile(
    r"(thrift|derby)://(\[[0-9a-fA-F:.]+\]|[^:/\[\]\s,]+):(\d{1,5})(/.*)?"
)


def metastore_address(value: str) -> MetastoreAddress:
    """``value`` (``[spark] metastore``) parsed; a ValueError says what was expected."""
    expected = (
        "expected thrift://HOST:PORT (a Hive metastore; several separated by commas) or "
        f"derby://HOST:PORT[/ABSOLUTE/PATH] (a Derby network server), got {value!r}"
    )
    parts = [part.strip() for part in value.split(",")]
    found = [_METASTORE_ENDPOINT.fullmatch(part) for part in parts]
    matches = [m for m in found if m is not None and 0 < int(m.group(3)) < 65536]
    if not parts or len(matches) != len(parts):
        raise ValueError(expected)
    schemes = {m.group(1) for m in matches}
    if len(schemes) != 1:
        raise ValueError(expected)
    scheme = matches[0].group(1)
    database = matches[0].group(4)
    if scheme == "derby" and (len(matches) > 1 or database == "/"):
        raise ValueError(expected)
    if scheme == "thrift" and any(m.group(4) for m in matches):
        raise ValueError(expected)
    endpoints = tuple((m.group(2).strip("[]"), int(m.group(3))) for m in matches)
    return MetastoreAddress("thrift" if scheme == "thrift" else "derby", endpoints, database)


class SparkConfig(ConfigModel):
    """Spark sessions of the jobs."""

    master: str = "local[2]"
    """The master of sessions a job builds itself (``dcp-cdc``, ``python -m``); under
    ``spark-submit`` (and so under Airflow) the submitter's ``--master`` wins."""
    shuffle_partitions: Annotated[int, Field(ge=1)] = 4
    """``spark.sql.shuffle.partitions``."""
    metastore: str | None = None
    """A catalog service several processes share: a Hive metastore (``thrift://host:9083``,
    several separated by commas) or a Derby network server (``derby://127.0.0.1:1527``, which
    ``dcp-cdc metastore start`` runs; its database ``<warehouse>/metastore_db`` unless the
    address ends in ``/<absolute path>``). Default: the Derby network server recorded for a
    local warehouse when one runs (follow mode and the Thrift server start one), else an
    embedded Derby database in ``<warehouse>/metastore_db``, one process at a time."""
    conf: dict[str, str] = Field(default_factory=dict)
    """Any other Spark settings, applied last (e.g. ``spark.hadoop.fs.s3a.*``, which the
    landing location's reader takes its S3 credentials and endpoint from too)."""
    py_files: str | None = "auto"
    """The code of ``dcp_cdc`` and ``pipelines`` shipped to the executors by every entry
    point (``dcp-cdc``, ``python -m``, ``spark-submit``, the DAGs): a path or URI of a zip
    (``make pyfiles``), ``auto`` (with a master that is not local, a zip of the installed
    packages, built once per content) or empty (the executors' Python has the package)."""
    interpreted_below_bytes: Annotated[int, Field(ge=0)] = 2 * 1024 * 1024
    """The size of a bucket's bronze events table (from its Delta log) below which the quality
    check and ``dcp-cdc run``'s overview, where Spark computes them (from
    ``quality.on_driver_below_bytes`` on: below it the driver does, without Spark), evaluate
    Spark's expressions interpreted instead of generating and compiling Java code for each
    query (``spark.sql.codegen.factoryMode`` and ``wholeStage``): on a small bucket the
    compiling costs more than the rows. 0: always compiled."""
    jars_dir: str | None = None
    """The folder of the Delta Lake jars. Default: ``$DCP_CDC_JARS_DIR``, else the checkout's
    ``.cache/jars`` (``make setup``) when running from one."""

    @field_validator("metastore")
    @classmethod
    def _metastore_address(cls, value: str | None) -> str | None:
        if value is not None:
            metastore_address(value)  # a ValueError names what was expected
        return value


LOOPBACK_NAMES = frozenset({"localhost", "ip6-localhost", "ip6-loopback"})


def is_loopback(host: str) -> bool:
    """True for an address only this machine reaches: 127.0.0.0/8, ``::1``, ``localhost``.
    A host name is not resolved: any other name counts as reachable from outside."""
    name = host.strip().strip("[]").lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class ThriftConfig(ConfigModel):
    """The JDBC/ODBC server of the catalog (``dcp-cdc thrift-server``, Spark's Thrift server,
    HiveServer2 protocol). Its ``--host``, ``--port`` and ``--insecure-open`` override these."""

    host: str = "127.0.0.1"
    """Address to listen on. Any address but loopback (127.0.0.0/8, ``::1``, ``localhost``)
    needs ``authentication`` ``ldap`` or ``kerberos``, or ``allow_unauthenticated = true``."""
    port: Annotated[int, Field(ge=1, le=65535)] = 10000
    """Port to listen on."""
    authentication: Literal["none", "ldap", "kerberos"] = "none"
    """``none``: any user name and password is accepted (loopback only, unless
    ``allow_unauthenticated``); ``ldap``: the password is checked by binding to ``ldap_url`` as
    the user (``hive.server2.authentication = LDAP``); ``kerberos``: clients need a ticket for
    ``kerberos_principal`` (``hive.server2.authentication = KERBEROS``)."""
    ldap_url: str | None = None
    """``ldap://host:389`` or ``ldaps://host:636`` (``hive.server2.authentication.ldap.url``);
    several separated by spaces."""
    ldap_base_dn: str | None = None
    """A user ``u`` binds as ``uid=u,<ldap_base_dn>``
    (``hive.server2.authentication.ldap.baseDN``)."""
    ldap_user_dn_pattern: str | None = None
    """Instead of ``ldap_base_dn``: DN patterns with ``%s`` for the user, separated by ``:``
    (``uid=%s,ou=people,dc=example,dc=com``; ``hive.server2.authentication.ldap.userDNPattern``)."""
    ldap_domain: str | None = None
    """Appended as ``user@<ldap_domain>`` to names without one (Active Directory;
    ``hive.server2.authentication.ldap.Domain``)."""
    kerberos_principal: str | None = None
    """The server's principal, ``hive/_HOST@REALM``
    (``hive.server2.authentication.kerberos.principal``)."""
    kerberos_keytab: str | None = None
    """The keytab file of ``kerberos_principal``
    (``hive.server2.authentication.kerberos.keytab``)."""
    allow_unauthenticated: bool = False
    """Serve a non-loopback ``host`` without authentication: anyone who reaches it reads
    every table, under any name (the server logs a warning at start)."""

    @model_validator(mode="after")
    def _authenticated_unless_loopback(self) -> ThriftConfig:
        if self.authentication == "ldap" and not self.ldap_url:
            raise ValueError('ldap_url: required with authentication = "ldap"')
        if self.ldap_url and not all(
            url.startswith(("ldap://", "ldaps://")) for url in self.ldap_url.split()
        ):
            raise ValueError(f"ldap_url: expected ldap://... or ldaps://..., got {self.ldap_url!r}")
        if self.authentication == "kerberos" and not (
            self.kerberos_principal and self.kerberos_keytab
        ):
            raise ValueError(
                'kerberos_principal, kerberos_keytab: both required with authentication = "kerberos"'
            )
        unused = [
            name
            for name, method in _AUTH_FIELDS.items()
            if getattr(self, name) is not None and method != self.authentication
        ]
        if self.allow_unauthenticated and self.authentication != "none":
            unused.append("allow_unauthenticated")
        if unused:
            raise ValueError(
                f"{', '.join(unused)}: set, but authentication is {self.authentication!r}"
            )
        if (
            self.authentication == "none"
            and not self.allow_unauthenticated
            and not is_loopback(self.host)
        ):
            raise ValueError(
                f"authentication: host {self.host!r} is not loopback, so the server needs "
                'authentication = "ldap" or "kerberos", or allow_unauthenticated = true '
                "(dcp-cdc thrift-server --insecure-open) to serve every table to anyone"
            )
        return self


_AUTH_FIELDS = {
    "ldap_url": "ldap",
    "ldap_base_dn": "ldap",
    "ldap_user_dn_pattern": "ldap",
    "ldap_domain": "ldap",
    "kerberos_principal": "kerberos",
    "kerberos_keytab": "kerberos",
}
