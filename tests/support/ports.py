"""Loopback ports for the servers tests start."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port of 127.0.0.1 that nothing listened on a moment ago (bound, then released): for a
    server that must be told its port, or an address where nothing answers."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port
