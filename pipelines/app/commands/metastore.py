"""``dcp-cdc metastore start|stop|status``: the Derby network server through which several
processes share a local warehouse's catalog (``dcp-cdc sql`` while ``dcp-cdc run --follow``
runs, the Thrift server beside a job). ``start`` serves ``<warehouse>/metastore_db``, or the
database ``[spark] metastore = "derby://HOST:PORT/ABS/PATH"`` names (the way for a warehouse
on object storage), on 127.0.0.1 and returns (the server runs detached, recorded beside the
database, until ``stop``; a server follow mode started on demand is kept from then on);
every Spark session of dcp-cdc on that warehouse then uses it. ``status`` exits 1
when no server answers. With ``[spark] metastore = "derby://127.0.0.1:PORT"`` in the
configuration, the server listens on that port.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from dcp_cdc.config import AppConfig, is_uri, metastore_address
from dcp_cdc.errors import ConfigError
from pipelines.app.commands.shared import catalog_config
from pipelines.catalog.embedded import METASTORE_DIR_NAME

if TYPE_CHECKING:
    from pipelines.catalog.server import ServerRecord


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``dcp-cdc metastore`` besides ``--config`` and ``--warehouse``."""
    parser.add_argument("action", choices=("start", "stop", "status"))
    parser.add_argument(
        "--port",
        type=int,
        help="start: the port to listen on (default: the port of [spark] metastore when it "
        "is derby://, else a free port, recorded for the sessions to find)",
    )


def command(args: argparse.Namespace, out: TextIO) -> int:
    """Start, stop or report the warehouse's metastore server."""
    from pipelines.catalog import server as metastore_server
    from pipelines.lake.spark_session import delta_jars_dir

    config = catalog_config(args)
    warehouse, database = _served(config)
    jars = delta_jars_dir(config.spark.jars_dir)
    if args.action == "start":
        host, port = _listen_on(config, args.port)
        before = metastore_server.read_record(warehouse)
        record, started = metastore_server.start(
            warehouse, host=host, port=port, jars=jars, database=database
        )
        verb = "started" if started else "already running:"
        kept = (
            " (started on demand; kept from now on, until `dcp-cdc metastore stop`)"
            if not started and before is not None and before.on_demand
            else ""
        )
        out.write(
            f"{verb} metastore server {record.address} (pid {record.pid}) for "
            f"{record.database}{kept}\n"
        )
        return 0
    if args.action == "stop":
        stopped = metastore_server.stop(warehouse, jars=jars)
        if stopped is None:
            out.write(f"no metastore server was running for {warehouse}\n")
        else:
            out.write(f"stopped metastore server {stopped.address} (pid {stopped.pid})\n")
        return 0
    recorded = metastore_server.read_record(warehouse)
    if recorded is None:
        out.write(f"no metastore server recorded for {warehouse}\n")
        return 1
    return _status(recorded, warehouse, jars, out)


def _status(record: ServerRecord, warehouse: Path, jars: Path, out: TextIO) -> int:
    from pipelines.catalog import server as metastore_server

    if metastore_server.ping(record, jars):
        lifetime = "on demand: it stops when no process uses it" if record.on_demand else "kept"
        out.write(
            f"running: metastore server {record.address} (pid {record.pid}, since "
            f"{record.started}, {lifetime}) for {record.database}\n"
        )
        return 0
    out.write(
        f"not answering: metastore server {record.address} (pid {record.pid}) recorded in "
        f"{metastore_server.record_path(warehouse)}; `dcp-cdc metastore stop` clears it\n"
    )
    return 1


def _served(config: AppConfig) -> tuple[Path, Path]:
    """The folder of the server's record, lock and log, and the database it serves: the
    database ``[spark] metastore = "derby://HOST:PORT/ABS/PATH"`` names (beside which the
    record goes), else ``<warehouse>/metastore_db`` of a local warehouse. A warehouse on
    object storage needs the path: its catalog is a local Derby database all the same."""
    metastore = config.spark.metastore
    address = metastore_address(metastore) if metastore is not None else None
    if address is not None and address.scheme == "thrift":
        raise ConfigError(
            f"[spark] metastore = {metastore!r} is a Hive metastore, which dcp-cdc does not "
            "run: `dcp-cdc metastore` serves a Derby catalog (derby://)"
        )
    if address is not None and address.database:
        database = Path(address.database).resolve()
        return database.parent, database
    location = config.warehouse.removeprefix("file://").removeprefix("file:")
    if is_uri(location):  # the configuration refuses it first (AppConfig._catalog_reachable)
        raise ConfigError(
            f"warehouse {config.warehouse!r} is not a local folder: name the catalog's path in "
            '[spark] metastore = "derby://127.0.0.1:PORT/ABSOLUTE/PATH"'
        )
    warehouse = Path(location).expanduser().resolve()
    return warehouse, warehouse / METASTORE_DIR_NAME


def _listen_on(config: AppConfig, port: int | None) -> tuple[str, int | None]:
    """Where the server listens: ``--port``, else the configured ``derby://`` address."""
    from pipelines.catalog.server import DEFAULT_HOST

    metastore = config.spark.metastore
    if metastore is None:
        return DEFAULT_HOST, port
    host, configured = metastore_address(metastore).endpoints[0]
    if port is not None and port != configured:
        raise ConfigError(
            f"--port {port} differs from the port of [spark] metastore = {metastore!r}: "
            "sessions would look for the server there"
        )
    return host, configured
