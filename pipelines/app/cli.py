"""The ``dcp-cdc`` command line, above both layers.

Verbs stay thin: they parse arguments and call the library (``decode``, ``simulate``) or a
job. Each verb has a command module (:mod:`pipelines.app.commands`) that declares its own flags
(``add_arguments``) and runs from the parsed arguments (``command``); a job's imports the job
module (which imports pyspark) only then, so that ``--help`` and the Spark-free verbs start
fast and without Spark. This module holds the parser and the entry points: every
``--config``, ``--bucket`` and ``--warehouse`` is declared here, once. A job's ``python -m`` and ``spark-submit`` entry points come through here too
(:func:`job_main`): the same flags, messages and exit statuses.

Exit status: 0 done, 1 a finding (a malformed frame for ``decode``, a failed quality
expectation for ``check`` and ``run``), 2 a :class:`DcpError`: one line, ``dcp-cdc VERB:
error: ClassName: message``, which names the error's class as the docs do (a bug's traceback
still shows in full).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence
from typing import TextIO

from dcp_cdc.config import CONFIG_RULE
from dcp_cdc.errors import DcpError
from dcp_cdc.logs import configure_logging, current_format, from_environment

Command = Callable[[argparse.Namespace, TextIO], int]

# Every verb is run by a command module (:mod:`pipelines.app.commands`): ``add_arguments(parser)``
# (its own flags), ``command(args, out) -> exit status`` and its docstring (the verb's
# --help); the options several verbs share (--config, --bucket, --warehouse) are declared in
# build_parser, once.
MODULES = {
    "decode": "pipelines.app.commands.decode",
    "capture": "pipelines.app.commands.capture",
    "simulate": "pipelines.app.commands.simulate",
    "run": "pipelines.app.commands.run",
    "ingest": "pipelines.app.commands.ingest",
    "apply": "pipelines.app.commands.apply",
    "check": "pipelines.app.commands.check",
    "sql": "pipelines.app.commands.sql",
    "tables": "pipelines.app.commands.tables",
    "maintain": "pipelines.app.commands.maintain",
    "spark-conf": "pipelines.app.commands.spark_conf",
    "thrift-server": "pipelines.app.commands.thrift_server",
    "beeline": "pipelines.app.commands.beeline",
    "metastore": "pipelines.app.commands.metastore",
    "status": "pipelines.app.commands.status",
    "landing": "pipelines.app.commands.landing",
}


def _options(*declare: Callable[[argparse.ArgumentParser], object]) -> argparse.ArgumentParser:
    """A parent parser: options several verbs share, declared once."""
    parser = argparse.ArgumentParser(add_help=False)
    for add in declare:
        add(parser)
    return parser


def _module_verb(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    verb: str,
    summary: str,
    parents: list[argparse.ArgumentParser],
    *,
    populate: bool,
) -> None:
    """The sub-parser of a verb a module runs; with its flags (which imports the module) only
    when ``populate``."""
    if not populate:
        sub.add_parser(verb, help=summary, parents=parents)
        return
    module = importlib.import_module(MODULES[verb])
    parser = sub.add_parser(
        verb,
        help=summary,
        parents=parents,
        description=module.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    module.add_arguments(parser)
    command: Command = module.command
    parser.set_defaults(func=command)


def _config_flag(parser: argparse.ArgumentParser) -> None:
    default = CONFIG_RULE.removeprefix("--config FILE, else ")
    parser.add_argument("--config", metavar="FILE", help=f"a TOML file (default: {default})")


def build_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """Every verb; a module's verb has its own flags only when it is ``verb`` (``None``: all
    of them), since a job's module imports pyspark."""
    parser = argparse.ArgumentParser(
        prog="dcp-cdc",
        description="Couchbase DCP change data capture into Delta Lake.",
        epilog=f"Every verb that reads a configuration takes it from {CONFIG_RULE}.",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    bucket = _options(lambda p: p.add_argument("--bucket", help="only this bucket"))
    # every verb that reads a configuration finds it by the one rule (CONFIG_RULE)
    job = _options(_config_flag)
    catalog = _options(
        _config_flag,
        lambda p: p.add_argument(
            "--warehouse", help="this warehouse instead of the configuration's"
        ),
    )
    verbs: list[tuple[str, str, list[argparse.ArgumentParser]]] = [  # as --help lists them
        ("decode", "print every frame of captures as JSON Lines", []),
        (
            "capture",
            "record a bucket's DCP changes into capture files (its [buckets.capture])",
            [job, bucket],
        ),
        ("simulate", "simulate a bucket: DCP captures and their truth", []),
        ("run", "the main job (embedded sample data unless --config)", [bucket]),
        ("ingest", "new capture files into bronze Delta tables", [job, bucket]),
        ("apply", "bronze events into silver tables (MERGE)", [job, bucket]),
        ("check", "data-quality suites; exit 1 if an error expectation fails", [job, bucket]),
        ("sql", "run a SQL query against the catalog", [catalog]),
        ("tables", "bronze, silver and quality tables with row counts", [catalog]),
        ("maintain", "OPTIMIZE, VACUUM, tombstone purge, retention", [job, bucket]),
        (
            "status",
            "per bucket: each stage's lag behind the one before, the last quality check",
            [catalog, bucket],
        ),
        (
            "landing",
            "skip: declare a lost capture file, so its session's later files are ingested",
            [job, bucket],
        ),
        (
            "spark-conf",
            "the catalog's Spark settings for spark-sql, pyspark, spark-submit",
            [catalog],
        ),
        ("thrift-server", "serve the catalog over JDBC (Spark Thrift server)", [catalog]),
        ("beeline", "Spark's JDBC shell, connected to the Thrift server", [job]),
        (
            "metastore",
            "start, stop or check the server that shares the catalog between processes",
            [catalog],
        ),
    ]
    for name, summary, parents in verbs:
        _module_verb(sub, name, summary, parents, populate=verb is None or verb == name)
    return parser


def _verb(argv: Sequence[str]) -> str:
    """The verb of a command line ("" if none): its first word that is not an option (the
    command itself has no option that takes a value)."""
    return next((a for a in argv if not a.startswith("-")), "")


def main(
    argv: Sequence[str] | None = None, out: TextIO | None = None, *, log_level: str = "WARNING"
) -> int:
    """``dcp-cdc ARGS``; log lines on stderr from ``log_level`` up (a verb's configuration and
    the environment may say otherwise: :mod:`dcp_cdc.logs`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(_verb(argv)).parse_args(argv)
    try:
        configure_logging(*from_environment(log_level, "text"))
        return int(args.func(args, out or sys.stdout))
    except DcpError as exc:
        message = f"dcp-cdc {args.command}: error: {type(exc).__name__}: {exc}"
        if current_format() == "json":  # a log line like the others, for the log's reader
            logging.getLogger("dcp_cdc.cli").error(message)
        else:
            print(message, file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `dcp-cdc decode x | head`
        return 0


def job_main(verb: str, argv: Sequence[str] | None = None) -> int:
    """A job's ``python -m`` and ``spark-submit`` entry point: ``dcp-cdc <verb> ARGS`` with
    the jobs' log lines (from INFO up, unless the configuration or ``$DCP_CDC_LOG_LEVEL`` says
    otherwise) on stderr."""
    return main([verb, *(sys.argv[1:] if argv is None else argv)], log_level="INFO")


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
