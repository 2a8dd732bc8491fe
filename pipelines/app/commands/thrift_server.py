"""``dcp-cdc thrift-server``: the catalog served over JDBC/ODBC (the HiveServer2 protocol,
Spark's Thrift server) until stopped. A host other than loopback needs ``[thrift]``
authentication (LDAP or Kerberos), or ``--insecure-open``, which is warned about.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from dcp_cdc.config import ThriftConfig, is_loopback, thrift_settings
from dcp_cdc.errors import DcpError
from pipelines.app.commands.shared import catalog_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``dcp-cdc thrift-server`` besides ``--config`` and ``--warehouse``."""
    parser.add_argument(
        "--port", type=int, help="port to listen on (default: [thrift] port, 10000)"
    )
    parser.add_argument(
        "--host",
        help="address to listen on (default: [thrift] host, 127.0.0.1); any but loopback needs "
        "[thrift] authentication (ldap, kerberos) or --insecure-open",
    )
    parser.add_argument(
        "--insecure-open",
        action="store_true",
        help="serve a non-loopback --host without authentication: anyone who reaches it reads "
        "every table ([thrift] allow_unauthenticated)",
    )


def command(args: argparse.Namespace, out: TextIO) -> int:
    """Serve the catalog over JDBC/ODBC (HiveServer2 protocol) until stopped."""
    from pipelines.catalog import server as metastore_server
    from pipelines.catalog.settings import shared_catalog, sharing_line
    from pipelines.lake.spark_session import delta_jars_dir, properties_text, thrift_server_launch

    config = catalog_config(args)
    thrift = thrift_settings(
        config,
        host=args.host,
        port=args.port,
        allow_unauthenticated=True if args.insecure_open else None,
    )
    # the properties may hold credentials ([spark] conf): a file only its owner reads (0600).
    # Other processes share the catalog meanwhile: on the local default through a metastore
    # server, started on demand if none runs, held while this or its server JVM runs.
    with (
        terminate_through_cleanup(),
        shared_catalog(config, delta_jars_dir(config.spark.jars_dir)) as server,
        tempfile.NamedTemporaryFile("w", suffix=".conf", prefix="dcp-cdc-") as props,
    ):
        if server is not None:
            out.write(f"{sharing_line(server)}\n")
        conf, arguments = thrift_server_launch(config, thrift, props.name)
        props.write(properties_text(conf))
        props.flush()
        where = f"jdbc:hive2://{thrift.host}:{thrift.port}/"
        out.write(
            f"serving {config.warehouse} on {where} ({_who_may_connect(thrift)}; Ctrl-C stops)\n"
        )
        out.flush()
        if thrift.authentication == "none" and not is_loopback(thrift.host):
            print(
                f"dcp-cdc thrift-server: WARNING: {where} has NO AUTHENTICATION "
                "(allow_unauthenticated / --insecure-open): anyone who reaches this address "
                f"reads every table of {config.warehouse}, under any user name",
                file=sys.stderr,
                flush=True,
            )
        # the Thrift server's JVM shares this process's lease on the metastore server
        return subprocess.call(
            [spark_script("spark-submit"), *arguments], pass_fds=metastore_server.lease_fds()
        )


@contextlib.contextmanager
def terminate_through_cleanup() -> Iterator[None]:
    """SIGTERM ends the command through its ``with`` blocks (the server JVM is ended, the
    metastore server it started stopped, the properties file removed), as Ctrl-C does,
    instead of at once with them left behind."""

    def on_terminate(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, on_terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _who_may_connect(thrift: ThriftConfig) -> str:
    if thrift.authentication == "ldap":
        return f"users checked against {thrift.ldap_url}"
    if thrift.authentication == "kerberos":
        return f"Kerberos, service principal {thrift.kerberos_principal}"
    return "no authentication: any user name and password"


def spark_script(name: str) -> str:
    """A launcher script of the installed pyspark (``spark-submit``, ``beeline``, ...)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise DcpError("pyspark is not installed for this Python: run `make setup`")
    return str(Path(spec.origin).parent / "bin" / name)
