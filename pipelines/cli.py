"""The ``dcp-cdc`` command line, above both layers.

Verbs stay thin: they parse arguments and call the library (``decode``, ``simulate``) or a
job. A job's verb has a command module (:mod:`pipelines.commands`) that declares its own
flags (``add_arguments``) and runs the job from the parsed arguments (``command``), importing
the job module (which imports pyspark) only then, so that ``--help`` and the Spark-free verbs
start fast and without Spark. Every ``--config`` and ``--bucket`` of the jobs is declared
here, once. A job's ``python -m`` and ``spark-submit`` entry points come through here too
(:func:`job_main`): the same flags, messages and exit statuses.

Exit status: 0 done, 1 a finding (a malformed frame for ``decode``, a failed quality
expectation for ``check`` and ``run``), 2 a :class:`DcpError` (a one-line message; a bug's
traceback still shows in full).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TextIO

from dcp_cdc.capture import EXTENSION, iter_capture, iter_stream
from dcp_cdc.config import (
    CONFIG_RULE,
    AppConfig,
    ThriftConfig,
    is_loopback,
    load_config,
    thrift_settings,
)
from dcp_cdc.errors import DcpError, MalformedFrameError
from dcp_cdc.events import Event
from dcp_cdc.render import error_to_json, event_to_json

Command = Callable[[argparse.Namespace, TextIO], int]

# Verbs run by a command module (:mod:`pipelines.commands`): ``add_arguments(parser)`` (its
# own flags), ``command(args, out) -> exit status`` and its docstring (the verb's --help);
# every job takes ``--config`` and ``--bucket`` too.
MODULES = {
    "run": "pipelines.commands.run",
    "ingest": "pipelines.commands.ingest",
    "apply": "pipelines.commands.apply",
    "check": "pipelines.commands.check",
    "maintain": "pipelines.commands.maintain",
}


def _capture_paths(paths: Sequence[str]) -> list[Path]:
    """Files named, and the capture files inside folders named, in a stable order."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(p.rglob(f"*{EXTENSION}")))
        else:
            out.append(p)
    return out


def _frames(
    path: Path, *, raw: bool, collections: bool | None
) -> Iterator[Event | MalformedFrameError]:
    if raw:
        with open(path, "rb") as fh:
            yield from iter_stream(fh, collections=bool(collections), file=str(path))
    else:
        yield from iter_capture(path, collections=collections)


def cmd_decode(args: argparse.Namespace, out: TextIO) -> int:
    """One JSON object per frame (JSON Lines); exit 1 if any frame was malformed."""
    failed = False
    for path in _capture_paths(args.paths):
        for item in _frames(path, raw=args.raw, collections=args.collections):
            if isinstance(item, MalformedFrameError):
                failed = True
                record = error_to_json(item)
            else:
                record = event_to_json(item, file=str(path))
            out.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
    return 1 if failed else 0


def cmd_simulate(args: argparse.Namespace, out: TextIO) -> int:
    import time

    from dcp_cdc.simulator import SimConfig, simulate

    config = SimConfig(
        scenario=args.scenario,
        seed=args.seed,
        bucket=args.bucket,
        vbuckets=args.vbuckets,
        collections=args.collections,
        docs=args.docs,
        ops=args.ops,
        max_file_bytes=args.max_file_bytes,
        inject_malformed=args.inject_malformed,
    )
    started = time.perf_counter()
    result = simulate(args.out, config)
    seconds = time.perf_counter() - started
    out.write(
        f"scenario {config.scenario} seed {config.seed}: {result.frames} frames, "
        f"{result.bytes / 1e6:.1f} MB in {len(result.files)} files, {seconds:.1f} s "
        f"({result.frames / seconds:,.0f} events/s)\n"
    )
    for op, count in sorted(result.event_counts.items(), key=lambda kv: (-kv[1], kv[0])):
        out.write(f"  {op:<26}{count:>10}\n")
    out.write(f"captures in {Path(args.out) / 'landing'}, ground truth in {result.truth.parent}\n")
    return 0


def cmd_capture(args: argparse.Namespace, out: TextIO) -> int:
    """Record a bucket's DCP changes into capture files in its landing folder (the bucket's
    ``[buckets.capture]`` section); until now (the high seqnos at the start), or following
    until SIGTERM/SIGINT. Either way the stop is clean: files closed, checkpoint committed."""
    from dcp_cdc.agent.driver import run, settings_from_config
    from dcp_cdc.capture_config import parse_vbucket_range
    from dcp_cdc.errors import ConfigError

    config = load_config(args.config)
    buckets = [b for b in config.bucket(args.bucket) if b.capture is not None]
    if not buckets:
        where = f"bucket {args.bucket!r}" if args.bucket else "no bucket"
        raise ConfigError(f"{where} has a [buckets.capture] section: nothing to capture")
    if len(buckets) > 1:
        names = ", ".join(b.name for b in buckets)
        raise ConfigError(
            f"several buckets have a capture section ({names}): name one with --bucket"
        )
    vbuckets = None
    if args.vbuckets:
        try:
            vbuckets = parse_vbucket_range(args.vbuckets)
        except ValueError as exc:
            raise ConfigError(f"--vbuckets: {exc}") from None
    logging.basicConfig(
        level=os.environ.get("DCP_CDC_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    settings = settings_from_config(config, buckets[0], vbuckets=vbuckets)
    summary = run(settings, mode="follow" if args.follow else "until-now")
    for line in summary.lines():
        out.write(line + "\n")
    return 0


# --- the catalog: sql, tables, spark-conf, thrift-server ---------------------------------


def _load(args: argparse.Namespace) -> AppConfig:
    """``--config`` (None: :data:`~dcp_cdc.config.CONFIG_RULE`, as for every verb), with
    ``--warehouse`` over its warehouse."""
    overrides = {"warehouse": str(Path(args.warehouse).resolve())} if args.warehouse else {}
    return load_config(args.config, **overrides)


def _print_table(out: TextIO, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max([len(c), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    out.write(" | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip() + "\n")
    out.write("-+-".join("-" * w for w in widths) + "\n")
    for r in rows:
        out.write(" | ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() + "\n")


def cmd_sql(args: argparse.Namespace, out: TextIO) -> int:
    """Run one SQL statement against the catalog and print the result as a table."""
    from pipelines.spark_session import session_for

    spark = session_for(_load(args), "dcp-cdc-sql")
    rows = spark.sql(args.query).limit(args.limit + 1).collect()
    columns = rows[0].__fields__ if rows else []
    cells = [[("NULL" if v is None else str(v))[:80] for v in row] for row in rows[: args.limit]]
    _print_table(out, columns, cells)
    more = " (more not shown)" if len(rows) > args.limit else ""
    out.write(f"({len(cells)} rows{more})\n")
    return 0


def cmd_tables(args: argparse.Namespace, out: TextIO) -> int:
    """Bronze, silver and quality tables with their row counts."""
    from pipelines.catalog import list_tables
    from pipelines.spark_session import session_for

    config = _load(args)
    tables = list_tables(session_for(config, "dcp-cdc-tables"))
    _print_table(
        out,
        ["layer", "table", "kind", "rows"],
        [[t.layer, t.name, t.kind, f"{t.rows:,}"] for t in tables],
    )
    out.write(
        f"({len(tables)} tables and views in the catalog of {config.warehouse}; a view "
        "holds a collection's live documents, its _all table tombstones too)\n"
    )
    return 0


def _launch_conf(args: argparse.Namespace, app_name: str) -> dict[str, str]:
    from pipelines.spark_session import launch_conf

    config = _load(args)
    return launch_conf(config, app_name, master=config.spark.master)


def cmd_spark_conf(args: argparse.Namespace, out: TextIO) -> int:
    """The catalog's settings as a Spark properties file, for ``spark-sql``, ``pyspark`` and
    ``spark-submit --properties-file``."""
    from pipelines.spark_session import properties_text

    text = properties_text(_launch_conf(args, "dcp-cdc-shell"))
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
        out.write(
            f"wrote {args.out}: use it with spark-sql, pyspark or spark-submit "
            f"--properties-file {args.out}\n"
        )
    else:
        out.write(text)
    return 0


def cmd_thrift_server(args: argparse.Namespace, out: TextIO) -> int:
    """Serve the catalog over JDBC/ODBC (HiveServer2 protocol) until stopped."""
    import subprocess
    import tempfile

    from pipelines.spark_session import properties_text, thrift_server_launch

    config = _load(args)
    thrift = thrift_settings(
        config,
        host=args.host,
        port=args.port,
        allow_unauthenticated=True if args.insecure_open else None,
    )
    # the properties may hold credentials ([spark] conf): a file only its owner reads (0600)
    with tempfile.NamedTemporaryFile("w", suffix=".conf", prefix="dcp-cdc-") as props:
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
        return subprocess.call([_spark_script("spark-submit"), *arguments])


def _who_may_connect(thrift: ThriftConfig) -> str:
    if thrift.authentication == "ldap":
        return f"users checked against {thrift.ldap_url}"
    if thrift.authentication == "kerberos":
        return f"Kerberos, service principal {thrift.kerberos_principal}"
    return "no authentication: any user name and password"


def _spark_script(name: str) -> str:
    """A launcher script of the installed pyspark (``spark-submit``, ``beeline``, ...)."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise DcpError("pyspark is not installed for this Python: run `make setup`")
    return str(Path(spec.origin).parent / "bin" / name)


# --- the parser --------------------------------------------------------------------------


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

    def populate(name: str) -> bool:
        return verb is None or verb == name

    bucket = _options(lambda p: p.add_argument("--bucket", help="only this bucket"))
    # every verb that reads a configuration finds it by the one rule (CONFIG_RULE)
    job = _options(_config_flag)
    catalog = _options(
        _config_flag,
        lambda p: p.add_argument(
            "--warehouse", help="this warehouse instead of the configuration's"
        ),
    )

    decode = sub.add_parser("decode", help="print every frame of captures as JSON Lines")
    decode.add_argument("paths", nargs="+", help="capture files or folders of them")
    decode.add_argument("--raw", action="store_true", help="headerless stream of frames")
    group = decode.add_mutually_exclusive_group()
    group.add_argument(
        "--collections",
        dest="collections",
        action="store_true",
        default=None,
        help="keys carry a LEB128 collection id (default: from the capture header)",
    )
    group.add_argument("--no-collections", dest="collections", action="store_false")
    decode.set_defaults(func=cmd_decode)

    cap = sub.add_parser(
        "capture",
        parents=[job, bucket],
        help="record a bucket's DCP changes into capture files (its [buckets.capture])",
    )
    until = cap.add_mutually_exclusive_group()
    until.add_argument(
        "--until",
        choices=["now"],
        default="now",
        help="stop once every vbucket reached its high seqno of the start (the default)",
    )
    until.add_argument(
        "--follow", action="store_true", help="keep capturing until SIGTERM or SIGINT"
    )
    cap.add_argument(
        "--vbuckets", metavar="A-B", help="only these vbuckets (default: the section's vbuckets)"
    )
    cap.set_defaults(func=cmd_capture)

    from dcp_cdc.simulator.scenarios import SCENARIOS, SimConfig

    defaults = SimConfig()
    sim = sub.add_parser("simulate", help="simulate a bucket: DCP captures and their truth")
    sim.add_argument("--out", required=True, help="output folder (landing/ and truth/)")
    sim.add_argument("--seed", type=int, default=defaults.seed)
    sim.add_argument("--scenario", choices=SCENARIOS, default=defaults.scenario)
    sim.add_argument("--bucket", default=defaults.bucket)
    sim.add_argument("--vbuckets", type=int, default=defaults.vbuckets)
    sim.add_argument("--collections", type=int, default=defaults.collections)
    sim.add_argument("--docs", type=int, default=defaults.docs, help="documents loaded first")
    sim.add_argument("--ops", type=int, default=defaults.ops, help="changes after the load")
    sim.add_argument("--max-file-bytes", type=int, default=defaults.max_file_bytes)
    sim.add_argument(
        "--inject-malformed",
        type=int,
        default=0,
        metavar="N",
        help="write N corrupted frames (reported in the truth)",
    )
    sim.set_defaults(func=cmd_simulate)

    _module_verb(
        sub,
        "run",
        "the main job (embedded sample data unless --config)",
        [bucket],
        populate=populate("run"),
    )
    _module_verb(
        sub,
        "ingest",
        "new capture files into bronze Delta tables",
        [job, bucket],
        populate=populate("ingest"),
    )
    _module_verb(
        sub,
        "apply",
        "bronze events into silver tables (MERGE)",
        [job, bucket],
        populate=populate("apply"),
    )
    _module_verb(
        sub,
        "check",
        "data-quality suites; exit 1 if an error expectation fails",
        [job, bucket],
        populate=populate("check"),
    )

    sql = sub.add_parser("sql", parents=[catalog], help="run a SQL query against the catalog")
    sql.add_argument("query")
    sql.add_argument("--limit", type=int, default=50, help="rows to print")
    sql.set_defaults(func=cmd_sql)

    tables = sub.add_parser(
        "tables", parents=[catalog], help="bronze, silver and quality tables with row counts"
    )
    tables.set_defaults(func=cmd_tables)

    _module_verb(
        sub,
        "maintain",
        "OPTIMIZE, VACUUM, tombstone purge, retention",
        [job, bucket],
        populate=populate("maintain"),
    )

    conf = sub.add_parser(
        "spark-conf",
        parents=[catalog],
        help="the catalog's Spark settings for spark-sql, pyspark, spark-submit",
    )
    conf.add_argument("--out", help="write them to this properties file (default: print)")
    conf.set_defaults(func=cmd_spark_conf)

    thrift = sub.add_parser(
        "thrift-server", parents=[catalog], help="serve the catalog over JDBC (Spark Thrift server)"
    )
    thrift.add_argument(
        "--port", type=int, help="port to listen on (default: [thrift] port, 10000)"
    )
    thrift.add_argument(
        "--host",
        help="address to listen on (default: [thrift] host, 127.0.0.1); any but loopback needs "
        "[thrift] authentication (ldap, kerberos) or --insecure-open",
    )
    thrift.add_argument(
        "--insecure-open",
        action="store_true",
        help="serve a non-loopback --host without authentication: anyone who reaches it reads "
        "every table ([thrift] allow_unauthenticated)",
    )
    thrift.set_defaults(func=cmd_thrift_server)
    return parser


def _verb(argv: Sequence[str]) -> str:
    """The verb of a command line ("" if none): its first word that is not an option (the
    command itself has no option that takes a value)."""
    return next((a for a in argv if not a.startswith("-")), "")


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(_verb(argv)).parse_args(argv)
    try:
        return int(args.func(args, out or sys.stdout))
    except DcpError as exc:
        print(f"dcp-cdc {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `dcp-cdc decode x | head`
        return 0


def job_main(verb: str, argv: Sequence[str] | None = None) -> int:
    """A job's ``python -m`` and ``spark-submit`` entry point: ``dcp-cdc <verb> ARGS`` with
    the jobs' log lines (level ``$DCP_CDC_LOG_LEVEL``, default INFO) on stderr."""
    logging.basicConfig(
        level=os.environ.get("DCP_CDC_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    return main([verb, *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
