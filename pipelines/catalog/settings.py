"""Which catalog a Spark session of dcp-cdc uses, and the Hive client's settings for it.

In order: the catalog service ``[spark] metastore`` names (a Hive metastore, ``thrift://``, or
a Derby network server, ``derby://``), checked to answer before the session starts; else, for
a local warehouse, the Derby network server recorded for it when one runs
(:mod:`pipelines.catalog.server`); else embedded Derby in ``<warehouse>/metastore_db``, one
process at a time (:mod:`pipelines.catalog.embedded`). Spark's Hive client (Hive 2.3) reaches a
Derby server through its JDO settings: ``javax.jdo.option.ConnectionURL`` (a
``jdbc:derby://`` URL) and ``javax.jdo.option.ConnectionDriverName`` (Derby's client driver,
``derbyclient`` being among the project's jars, on the driver's class path).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from dcp_cdc.config import is_uri, metastore_address
from pipelines.catalog.embedded import METASTORE_DIR_NAME
from pipelines.catalog.server import CLIENT_DRIVER, live_server, serving, unreachable
from pipelines.errors import MetastoreError, MetastoreUnreachableError

if TYPE_CHECKING:
    from dcp_cdc.config import AppConfig
    from pipelines.catalog.server import ServerRecord

SETTING = "[spark] metastore"
_CATALOG_KEYS = (
    "spark.hadoop.hive.metastore.uris",
    "spark.hadoop.javax.jdo.option.ConnectionURL",
)
"""Settings of ``[spark] conf`` that choose a catalog themselves (they win over ours)."""
CLIENT_JAR_PREFIX = "derbyclient-"
REACH_TIMEOUT_S = 5.0
"""How long a session waits for the configured catalog service to accept a connection."""


def derby_client_url(host: str, port: int, database: str) -> str:
    """The JDBC URL of ``database`` (an absolute path on the server's machine) on a Derby
    network server; the database is created on first use."""
    name = f"[{host}]" if ":" in host else host
    return f"jdbc:derby://{name}:{port}/{database};create=true"


def hive_client_conf(metastore: str, warehouse: str | Path, jars: Sequence[Path]) -> dict[str, str]:
    """The Spark settings of a session whose catalog is the service ``metastore``
    (``thrift://`` or ``derby://``); a ``derby://`` address without a database names
    ``<warehouse>/metastore_db``. ``jars``: the session's (``spark.jars``), among them Derby's
    client, which goes on the driver's own class path: the driver class (in ``derbytools``,
    which pyspark ships on that class path) loads the client from there, not from
    ``spark.jars``."""
    address = metastore_address(metastore)
    if address.scheme == "thrift":
        return {"spark.hadoop.hive.metastore.uris": metastore}
    host, port = address.endpoints[0]
    database = address.database or str(Path(warehouse) / METASTORE_DIR_NAME)
    client = [jar for jar in jars if jar.name.startswith(CLIENT_JAR_PREFIX)]
    if not client:
        folders = sorted({str(jar.parent) for jar in jars}) or ["(no jars)"]
        raise MetastoreError(
            f"{SETTING} {metastore!r} is a Derby network server, whose client "
            f"{CLIENT_JAR_PREFIX}<version>.jar is not among the session's jars (in "
            f"{', '.join(folders)}): run `make setup` (build-support/jars resolves it)"
        )
    return {
        "spark.hadoop.javax.jdo.option.ConnectionURL": derby_client_url(host, port, database),
        "spark.hadoop.javax.jdo.option.ConnectionDriverName": CLIENT_DRIVER,
        "spark.driver.extraClassPath": str(client[-1]),
    }


def catalog_service(
    warehouse: str | Path, metastore: str | None, *, check: bool = True
) -> str | None:
    """The catalog service a session on ``warehouse`` (a local folder as a Path) uses:
    ``metastore`` (``[spark] metastore``; with ``check``, it must answer, else
    :class:`MetastoreUnreachableError`), else the live Derby server recorded for a local
    warehouse (as ``derby://HOST:PORT``), else None: embedded Derby."""
    if metastore:
        if check:
            check_reachable(metastore)
        return metastore
    if isinstance(warehouse, Path):
        running = live_server(warehouse)
        if running is not None:
            return running.address
    return None


def check_reachable(metastore: str, *, timeout: float = REACH_TIMEOUT_S) -> None:
    """Raise :class:`MetastoreUnreachableError`, naming the setting, the address and why each
    endpoint failed, when no endpoint of ``metastore`` accepts a connection: a refused one
    fails at once, a silent one after ``timeout`` seconds."""
    address = metastore_address(metastore)
    problems = []
    for host, port in address.endpoints:
        problem = unreachable(host, port, timeout=timeout)
        if problem is None:
            return
        name = f"[{host}]" if ":" in host else host
        problems.append(problem if len(address.endpoints) == 1 else f"{name}:{port} {problem}")
    how = (
        "start it (`dcp-cdc metastore start` serves a local warehouse's catalog there)"
        if address.scheme == "derby"
        else "start the Hive metastore service, or check the address and the network"
    )
    raise MetastoreUnreachableError(
        f"{SETTING} = {metastore!r}: nothing accepts connections at {address} "
        f"({'; '.join(problems)}): {how}, or correct the setting"
    )


def local_default(config: AppConfig) -> Path | None:
    """The local warehouse of ``config`` when its catalog is the local default (no
    ``[spark] metastore``, and no catalog of its own in ``[spark] conf``), else None."""
    if config.spark.metastore or any(key in config.spark.conf for key in _CATALOG_KEYS):
        return None
    if is_uri(config.warehouse) and not config.warehouse.startswith("file:"):
        return None
    location = config.warehouse.removeprefix("file://").removeprefix("file:")
    return Path(location).expanduser().resolve()


def sharing_line(server: ServerRecord) -> str:
    """What a long-running command says about the server it shares the catalog through."""
    return (
        f"catalog: metastore server {server.address} (pid {server.pid}) for "
        f"{server.database}: other processes may use it meanwhile"
    )


@contextlib.contextmanager
def shared_catalog(config: AppConfig, jars: Path) -> Iterator[ServerRecord | None]:
    """For a long-running command (follow mode, the Thrift server): a catalog that other
    processes can use meanwhile. The configured service must answer; on the local default, a
    Derby network server for the warehouse (its ``derbynet`` from ``jars``, the project's jars
    folder), held while the block runs: the one that runs, else one started now on demand,
    which stops when no process holds it any more (:func:`pipelines.catalog.server.serving`).
    Yields the local server, if that is the catalog."""
    if config.spark.metastore:
        check_reachable(config.spark.metastore)
    warehouse = local_default(config)
    if warehouse is None:
        yield None
        return
    with serving(warehouse, jars=jars) as record:
        yield record
