"""``dcp-cdc beeline``: Spark's JDBC shell (beeline, from the installed pyspark) connected to
the configuration's Thrift server (``dcp-cdc thrift-server``, ``[thrift] host`` and ``port``)
unless ``-u`` names another. It runs pyspark's own launcher, which finds Spark by its own
path: no ``PATH`` or ``SPARK_HOME`` is needed. Beeline's other options follow ``--``.
"""

from __future__ import annotations

import argparse
import subprocess
from typing import TextIO

from dcp_cdc.config import ThriftConfig, thrift_settings
from dcp_cdc.config.capture import WILDCARD_HOSTS
from pipelines.app.commands.shared import command_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``dcp-cdc beeline`` besides ``--config``: beeline's own, by its names."""
    parser.add_argument(
        "-u", dest="url", metavar="URL", help="the JDBC URL (default: the [thrift] server's)"
    )
    parser.add_argument("-n", dest="user", metavar="USER", help="the user name")
    parser.add_argument(
        "-w",
        dest="password_file",
        metavar="FILE",
        help="a file holding the password (LDAP); kept off the command line, which `ps` shows",
    )
    parser.add_argument(
        "-e", dest="queries", action="append", metavar="QUERY", help="run QUERY, then exit"
    )
    parser.add_argument(
        "-f", dest="script", metavar="FILE", help="run FILE's statements, then exit"
    )
    parser.add_argument("more", nargs="*", metavar="-- OPTION", help="more of beeline's options")


def server_url(thrift: ThriftConfig) -> str:
    """The JDBC URL of the Thrift server ``thrift`` describes, as a client on this machine
    reaches it (a server listening on every interface answers on loopback)."""
    host = "127.0.0.1" if thrift.host in WILDCARD_HOSTS else thrift.host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"jdbc:hive2://{host}:{thrift.port}/"


def beeline_arguments(args: argparse.Namespace, thrift: ThriftConfig) -> list[str]:
    """Beeline's command line (after the launcher) for the parsed ``args``."""
    arguments = ["-u", args.url or server_url(thrift)]
    if args.user:
        arguments += ["-n", args.user]
    if args.password_file:
        arguments += ["-w", args.password_file]
    for query in args.queries or []:
        arguments += ["-e", query]
    if args.script:
        arguments += ["-f", args.script]
    return [*arguments, *args.more]


def command(args: argparse.Namespace, out: TextIO) -> int:
    """Run beeline against the Thrift server; its exit status is the command's."""
    from pipelines.app.commands.thrift_server import spark_script

    thrift = thrift_settings(command_config(args.config))
    return subprocess.call([spark_script("beeline"), *beeline_arguments(args, thrift)])
