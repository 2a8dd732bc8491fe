"""A real Prometheus Pushgateway for tests (Debian's ``prometheus-pushgateway`` package, which
``.ci/run`` installs), on 127.0.0.1 on a free port, and what it serves read back."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.support.ports import free_port

PUSHGATEWAY = shutil.which("prometheus-pushgateway") or shutil.which("pushgateway")
MISSING = (
    "needs the Pushgateway binary (Debian: apt-get install prometheus-pushgateway, which "
    ".ci/run does as root)"
)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@contextmanager
def pushgateway(tmp: Path) -> Iterator[str]:
    """A Pushgateway on a free loopback port until the end of the block; yields its URL."""
    assert PUSHGATEWAY is not None, MISSING
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with (tmp / "pushgateway.log").open("wb") as log:
        process = subprocess.Popen(
            [
                PUSHGATEWAY,
                f"--web.listen-address=127.0.0.1:{port}",
                "--persistence.file=",  # Debian's build persists to /var/lib by default
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 30
            while not _answers(f"{url}/-/ready"):
                assert process.poll() is None, (tmp / "pushgateway.log").read_text()
                assert time.monotonic() < deadline, "the Pushgateway did not start in 30 s"
                time.sleep(0.1)
            yield url
        finally:
            process.terminate()
            process.wait(30)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def exposition(url: str) -> str:
    """What Prometheus would scrape from the Pushgateway."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
        return str(answer.read().decode())


def pushed(url: str, prefix: str = "dcp_cdc_") -> Samples:
    """(sample name, labels) -> value of every sample whose name starts with ``prefix``."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(exposition(url))
        for s in family.samples
        if s.name.startswith(prefix)
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The sample ``name`` whose labels include ``labels``; None if there is none, an error if
    there are several."""
    found = [
        amount
        for (n, got), amount in samples.items()
        if n == name and all(pair in got for pair in labels.items())
    ]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None
