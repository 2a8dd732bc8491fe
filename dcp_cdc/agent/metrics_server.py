"""The HTTP side of a process's :class:`~dcp_cdc.agent.metrics.Monitoring`: ``GET /metrics``
(Prometheus), ``/healthz`` (the process is alive: its event loop answers) and ``/readyz``
(every readiness check passes; 503 and the failing checks otherwise), served by
:class:`MetricsServer` in the agent's own event loop, so that a scrape reads the runs'
counters between two of their steps, never beside them.

A deliberately small HTTP/1.1 server: one request per connection (``Connection: close``),
the request head read within :data:`REQUEST_TIMEOUT_S` and at most :data:`HEAD_BYTES` long,
the answer written within the same time; no body is read. Nothing here authenticates: it
listens on the loopback interface unless the configuration says otherwise
(``metrics_host``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from dcp_cdc.agent.metrics import Monitoring
from dcp_cdc.errors import ConfigError

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 10.0
"""How long a client has to send its request head, and to take the answer."""
HEAD_BYTES = 8192
"""The longest request head read; a longer one is refused (431)."""
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    503: "Service Unavailable",
}
TEXT = "text/plain; charset=utf-8"


class MetricsServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` of ``monitoring`` on ``host:port`` (port 0:
    any free port, :attr:`port` once started). ``role`` starts its log line, ``setting`` names
    the port's setting in the error of a port that cannot be bound (the capture agent's by
    default; follow mode serves its own)."""

    def __init__(
        self,
        monitoring: Monitoring,
        host: str,
        port: int,
        *,
        role: str = "capture",
        setting: str = "capture.metrics_port",
    ) -> None:
        self.monitoring = monitoring
        self.host = host
        self.port = port
        self.role = role
        self.setting = setting
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        """Listen; a port that cannot be bound is a :class:`ConfigError` naming it."""
        try:
            self._server = await asyncio.start_server(
                self._serve, self.host, self.port, limit=HEAD_BYTES
            )
        except OSError as exc:
            raise ConfigError(
                f"{self.setting}: cannot listen on {self.host}:{self.port} ({exc.strerror or exc})"
            ) from None
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("%s: metrics and health on http://%s/metrics", self.role, self.address)

    @property
    def address(self) -> str:
        """``host:port``, an IPv6 host in brackets."""
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(REQUEST_TIMEOUT_S):
                    await self._server.wait_closed()
            self._server = None

    def answer(self, method: str, target: str, accept: str) -> tuple[int, str, bytes]:
        """(status, content type, body) of a request: the routing, without sockets."""
        path = target.split("?", 1)[0]
        if path not in ("/metrics", "/healthz", "/readyz"):
            return 404, TEXT, b"not found: /metrics, /healthz and /readyz are served\n"
        if method not in ("GET", "HEAD"):
            return 405, TEXT, b"only GET and HEAD\n"
        if path == "/metrics":
            body, content_type = self.monitoring.exposition(accept)
            return 200, content_type, body
        if path == "/healthz":
            return 200, TEXT, b"ok\n"
        ready, text = self.monitoring.ready()
        return (200 if ready else 503), TEXT, text.encode()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                status, content_type, body, method = await self._respond(reader)
                head = (
                    f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
                    f"Content-Type: {content_type}\r\n"
                    f"Content-Length: {len(body)}\r\n"
                    "Cache-Control: no-store\r\n"
                    "Connection: close\r\n\r\n"
                )
                writer.write(head.encode("latin-1") + (b"" if method == "HEAD" else body))
                await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away or was too slow: nothing to answer
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await writer.wait_closed()

    async def _respond(self, reader: asyncio.StreamReader) -> tuple[int, str, bytes, str]:
        try:
            raw = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            return 431, TEXT, b"request head too long\n", "GET"
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return 400, TEXT, b"bad request line\n", "GET"
        method, target = parts[0], parts[1]
        accept = ""
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "accept":
                accept = value.strip()
        status, content_type, body = self.answer(method, target, accept)
        return status, content_type, body, method
