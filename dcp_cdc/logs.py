"""How every dcp-cdc process logs: one line per record on stderr, as text or as one JSON
object (``log_format``), with the bucket, vbucket and run it concerns, and never a secret.

Each entry point (the command line, a job under ``spark-submit``, the capture agent's child
process) calls :func:`configure_logging` once it starts, and :func:`configure_logging_from`
once it has read its configuration; ``$DCP_CDC_LOG_LEVEL`` and ``$DCP_CDC_LOG_FORMAT`` win
over both (:func:`from_environment`), so a deployment switches without editing files.

Where a record comes from: :func:`log_context` names the bucket (vbucket, run) that the code
inside it works on, through a :mod:`contextvars` variable (asyncio tasks started inside it
inherit it; a thread does not, and sets its own); ``extra={"bucket": ...}`` on one call wins
over it.

No secret: every line is masked (:func:`redact`) of the values :func:`register_secret` was
given (a capture password when it is read, the ``[spark.conf]`` keys and passwords), of the
AWS credentials in the environment, and of ``password=...``-like pairs, quoted ``"secret":
"..."`` pairs and a URL's ``user:password@``.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import functools
import json
import logging
import os
import re
import sys
import threading
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal, TextIO, cast, get_args

from dcp_cdc.errors import ConfigError

if TYPE_CHECKING:
    from dcp_cdc.config import AppConfig

LogFormat = Literal["text", "json"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
LEVEL_ENV = "DCP_CDC_LOG_LEVEL"
FORMAT_ENV = "DCP_CDC_LOG_FORMAT"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
MASK = "***"
CONTEXT_FIELDS = ("bucket", "vbucket", "run_id")
SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")
"""The environment's credentials masked wherever they appear (the key id as the
``access.key`` of ``[spark.conf]`` is: it names the account the secret opens)."""

# --- where a record comes from ---------------------------------------------------------

_context: contextvars.ContextVar[Mapping[str, object]] = contextvars.ContextVar(
    "dcp_cdc_log_context", default=MappingProxyType({})
)


@contextlib.contextmanager
def log_context(
    *, bucket: str | None = None, vbucket: int | None = None, run_id: str | None = None
) -> Iterator[None]:
    """Records logged inside carry these fields (those given; the enclosing context's
    others stay)."""
    given = {"bucket": bucket, "vbucket": vbucket, "run_id": run_id}
    token = _context.set({**_context.get(), **{k: v for k, v in given.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


# --- secrets ---------------------------------------------------------------------------

_secrets: set[str] = set()
_secrets_lock = threading.Lock()

_SECRET_NAME = r"[\w.-]*(?:password|passwd|secret|token|access[._-]?key|secret[._-]?key)"
"""A name that ends in a secret's word (``fs.s3a.secret.key``, ``ConnectionPassword``,
``AWS_SESSION_TOKEN``), not one that only mentions it (``password_env``,
``fs.s3a.aws.credentials.provider``, ``delegation.token.binding``)."""
_PAIR = re.compile(
    rf"(?i)(\b{_SECRET_NAME}\s*=\s*)(\"[^\"]*\"|'[^']*'|[^\s,;&'\")\]}}]+)",
)
"""``password=...``, ``spark.hadoop.fs.s3a.secret.key=...`` (quoted or not)."""
_QUOTED_PAIR = re.compile(rf"(?i)([\"']{_SECRET_NAME}[\"']\s*:\s*)([\"'])(?:(?!\2).)*\2")
"""``"password": "..."`` of a JSON text or a Python dict's repr."""
_USERINFO = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://[^\s/:@]+:)([^\s/@]+)(@)")
"""``couchbases://user:password@host``."""
SECRET_CONF = re.compile(rf"(?i)^{_SECRET_NAME}$")
"""Settings whose value is a secret (``[spark.conf]``'s ``fs.s3a.secret.key``, ...)."""


def register_secret(value: str | None) -> None:
    """Mask ``value`` wherever it appears in a log line of this process from now on."""
    if value:
        with _secrets_lock:
            _secrets.add(value)


def register_conf_secrets(conf: Mapping[str, str]) -> None:
    """Register the values of ``conf`` (``[spark.conf]``) whose names say they are secret."""
    for key, value in conf.items():
        if SECRET_CONF.search(key):
            register_secret(value)


def _known_secrets() -> frozenset[str]:
    with _secrets_lock:
        known = set(_secrets)
    known.update(v for v in (os.environ.get(name) for name in SECRET_ENV) if v)
    return frozenset(known)


@functools.lru_cache(maxsize=8)
def _values_pattern(secrets: frozenset[str]) -> re.Pattern[str] | None:
    if not secrets:
        return None
    # longest first: a secret that contains another is masked whole
    return re.compile("|".join(re.escape(s) for s in sorted(secrets, key=len, reverse=True)))


def redact(text: str) -> str:
    """``text`` with every secret this process knows of, and every secret-looking pair,
    masked."""
    values = _values_pattern(_known_secrets())
    if values is not None:
        text = values.sub(MASK, text)
    text = _PAIR.sub(rf"\g<1>{MASK}", text)
    text = _QUOTED_PAIR.sub(rf"\g<1>\g<2>{MASK}\g<2>", text)
    return _USERINFO.sub(rf"\g<1>{MASK}\g<3>", text)


def _text(value: object) -> str:
    """``str(value)``, or its type's name when that fails (a log line never raises)."""
    try:
        return str(value)
    except Exception:
        return f"<{type(value).__name__} that cannot be printed>"


class RedactSecrets(logging.Filter):
    """Masks secrets in a record's message, traceback and stack (:func:`redact`), and gives
    it the fields of :func:`log_context` that ``extra`` did not; in place, so that every
    handler after this one sees the masked record too."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in _context.get().items():
            if getattr(record, name, None) is None:
                setattr(record, name, value)
        try:
            message = record.getMessage()
        except Exception:  # arguments that do not fit the format: both, as they are
            message = f"{_text(record.msg)} {_text(record.args)}"
        record.msg, record.args = redact(message), ()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


# --- the formats -----------------------------------------------------------------------


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: ``time`` (UTC, ISO 8601 with milliseconds),
    ``level``, ``logger``, ``message``; ``bucket``, ``vbucket``, ``run_id`` when the record
    has them; ``exc_type`` and ``exc`` (the traceback) when it carries an exception. Text
    stays as it is (no ``\\u`` escapes); a value JSON has no type for is written as text."""

    def format(self, record: logging.LogRecord) -> str:
        created = dt.datetime.fromtimestamp(record.created, dt.UTC)
        line: dict[str, object] = {
            "time": created.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info and record.exc_info[0] is not None:
            kind = record.exc_info[0]
            line["exc_type"] = (
                kind.__qualname__
                if kind.__module__ == "builtins"
                else f"{kind.__module__}.{kind.__qualname__}"
            )
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exc"] = record.exc_text
        if record.stack_info:
            line["stack"] = record.stack_info
        safe = {
            k: v if isinstance(v, bool | int | float) else redact(_text(v)) for k, v in line.items()
        }
        return json.dumps(safe, ensure_ascii=False, default=_text)


class _Stderr(logging.StreamHandler[TextIO]):
    """A stream handler that writes to ``sys.stderr`` as it is at each record (a test's
    capture, or the process's own), never to a stream that was replaced and closed."""

    def __init__(self, stream: TextIO | None) -> None:
        super().__init__(stream)
        self._fixed = stream
        self.format_name: LogFormat = "text"

    def emit(self, record: logging.LogRecord) -> None:
        if self._fixed is None:
            self.stream = sys.stderr
        super().emit(record)


# --- setting it up ---------------------------------------------------------------------


def from_environment(
    level: str | int, fmt: LogFormat, environ: Mapping[str, str] | None = None
) -> tuple[str | int, LogFormat]:
    """``(level, fmt)`` with ``$DCP_CDC_LOG_LEVEL`` and ``$DCP_CDC_LOG_FORMAT`` over them."""
    env = os.environ if environ is None else environ
    env_level = env.get(LEVEL_ENV, "").strip().upper()
    if env_level:
        if env_level not in get_args(LogLevel):
            raise ConfigError(
                f"{LEVEL_ENV}: expected one of {', '.join(get_args(LogLevel))}, "
                f"got {env[LEVEL_ENV]!r}"
            )
        level = env_level
    env_format = env.get(FORMAT_ENV, "").strip().lower()
    if env_format:
        if env_format not in get_args(LogFormat):
            raise ConfigError(f"{FORMAT_ENV}: expected text or json, got {env[FORMAT_ENV]!r}")
        fmt = cast(LogFormat, env_format)
    return level, fmt


def configure_logging(level: str | int, fmt: LogFormat, stream: TextIO | None = None) -> None:
    """Log records of ``level`` and above to ``stream`` (default: stderr) in ``fmt``, secrets
    masked. Called again, it replaces what it set up before (and nothing else)."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Stderr)]:
        root.removeHandler(old)
    handler = _Stderr(stream)
    handler.format_name = fmt
    handler.addFilter(RedactSecrets())
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root.addHandler(handler)
    root.setLevel(level)


def configure_logging_from(config: AppConfig, default_level: str | int | None = None) -> None:
    """The log settings of a command's configuration: its ``log_format``, its ``log_level``
    (unset: ``default_level``, else the level set at the start), the environment's over
    both; and its ``[spark.conf]`` secrets registered."""
    register_conf_secrets(config.spark.conf)
    level = config.log_level or default_level or logging.getLogger().level
    configure_logging(*from_environment(level, config.log_format))


def current_format() -> LogFormat:
    """The format :func:`configure_logging` set up last ("text" if it has not)."""
    ours = [h for h in logging.getLogger().handlers if isinstance(h, _Stderr)]
    return ours[-1].format_name if ours else "text"
