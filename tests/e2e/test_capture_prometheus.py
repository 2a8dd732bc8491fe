"""A real Prometheus server scrapes the capture agent while it follows the test producer.

The producer (``python -m dcp_cdc.simulator.server``) and the agent (``dcp-cdc capture
--follow``, its section setting ``metrics_port``) each run in a child process; Prometheus
(Debian's ``prometheus`` package, which ``.ci/run`` installs) runs on 127.0.0.1 on a free port
with a temporary configuration that scrapes the agent every second and loads the project's
alerting rules (``conf/prometheus/dcp-cdc-capture.rules.yml``). What the test knows, it reads
back through Prometheus' HTTP API: the agent up, every vbucket caught up, the counters moving;
then the producer stalls a vbucket (it keeps taking changes and reports them in its high
seqno): its lag of 5 seqnos and the stalled count reach Prometheus, the rules' alert goes
pending, ``/readyz`` fails; the vbucket moves again and all of it recovers. ``promtool check
metrics`` passes on the agent's exposition, ``promtool check rules`` on the rules.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support.capture_harness import agent_command, agent_env, producer, write_config
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "conf" / "prometheus" / "dcp-cdc-capture.rules.yml"
PROMETHEUS, PROMTOOL = shutil.which("prometheus"), shutil.which("promtool")

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    pytest.mark.skipif(
        PROMETHEUS is None or PROMTOOL is None,
        reason="needs the prometheus and promtool binaries (Debian: apt-get install "
        "prometheus, which .ci/run does as root)",
    ),
]


def http_get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@contextmanager
def prometheus(tmp: Path, target_port: int) -> Iterator[str]:
    """A Prometheus server scraping ``127.0.0.1:target_port`` every second, its rules the
    project's; yields its base URL."""
    port = free_port()
    config = tmp / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
        f"rule_files:\n  - {RULES}\n"
        "scrape_configs:\n  - job_name: dcp-cdc-capture\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{target_port}']\n",
        encoding="utf-8",
    )
    log = (tmp / "prometheus.log").open("wb")
    assert PROMETHEUS is not None
    process = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, (tmp / "prometheus.log").read_text()[-3000:]
            try:
                if http_get(f"{base}/-/ready", timeout=2)[0] == 200:
                    break
            except OSError:
                pass  # not listening yet
            assert time.monotonic() < deadline, "prometheus did not become ready"
            time.sleep(0.2)
        yield base
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def query(base: str, promql: str) -> list[dict[str, Any]]:
    """The instant vector of ``promql`` through Prometheus' HTTP API."""
    status, body = http_get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    answer = json.loads(body)
    assert status == 200 and answer["status"] == "success", answer
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


def value(base: str, promql: str) -> float | None:
    """The one value of ``promql``; None when it has none."""
    result = query(base, promql)
    assert len(result) <= 1, result
    return float(result[0]["value"][1]) if result else None


def until(what: str, check: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout:g} s: {what}"
        time.sleep(0.25)


def test_prometheus_reads_the_agents_lag_and_counters(tmp_path: Path) -> None:
    metrics_port = free_port()
    with producer(tmp_path, nodes=2, vbuckets=8, docs=300, ops=0) as prod:
        config = write_config(
            tmp_path / "conf" / "capture.toml",
            landing=tmp_path / "landing",
            warehouse=tmp_path / "warehouse",
            bucket=prod.info["bucket"],
            connection_string=prod.info["connection_string"],
            metrics_port=metrics_port,
            lag_poll_s=0.5,
            stall_after_s=2.0,
            rotate_seconds=0.5,
        )
        agent_log = (tmp_path / "agent.log").open("wb")
        agent = subprocess.Popen(
            agent_command(config, "--follow"),
            env=agent_env(),
            stdout=agent_log,
            stderr=subprocess.STDOUT,
        )
        bucket = prod.info["bucket"]
        try:
            with prometheus(tmp_path, metrics_port) as base:
                mine = f'bucket="{bucket}",agent="agent"'
                until("the agent scraped", lambda: value(base, 'up{job="dcp-cdc-capture"}') == 1)
                until(
                    "every vbucket caught up",
                    lambda: value(base, f"count(dcp_cdc_capture_lag_seqnos{{{mine}}} == 0)") == 8,
                )
                assert value(base, f"dcp_cdc_capture_vbuckets{{{mine}}}") == 8
                assert value(base, f"dcp_cdc_capture_stalled_vbuckets{{{mine}}}") == 0
                for counter in ("received_frames", "received_bytes", "durable_files"):
                    got = value(base, f"dcp_cdc_capture_{counter}_total{{{mine}}}")
                    assert got is not None and got > 0, counter
                nodes = query(base, f"dcp_cdc_capture_flow_control_unacked_bytes{{{mine}}}")
                assert len(nodes) == 2
                assert value(base, f"dcp_cdc_capture_flow_control_buffer_bytes{{{mine}}}") == (
                    16 << 20
                )

                prod.control("too_slow 1")
                stalled_at = int(prod.control("stall 3 5").split()[1])
                assert stalled_at > 0
                until(
                    "the stalled vbucket's lag and count in Prometheus",
                    lambda: (
                        value(base, f'dcp_cdc_capture_lag_seqnos{{{mine},vbucket="3"}}') == 5
                        and value(base, f"dcp_cdc_capture_stalled_vbuckets{{{mine}}}") == 1
                    ),
                )
                status, body = http_get(f"http://127.0.0.1:{metrics_port}/readyz")
                assert status == 503 and b"vbucket 3" in body, body
                until(
                    "the rules' alert pending",
                    lambda: query(base, 'ALERTS{alertname="DcpCdcCaptureStalledVbucket"}'),
                )
                first = value(base, f'dcp_cdc_capture_lag_seconds{{{mine},vbucket="3"}}')
                assert first is not None and first > 0
                until(
                    "the stalled vbucket's lag in seconds grows",
                    lambda: (
                        (value(base, f'dcp_cdc_capture_lag_seconds{{{mine},vbucket="3"}}') or 0)
                        >= first + 2
                    ),
                )
                ends = f'dcp_cdc_capture_stream_ends_total{{{mine},reason="too_slow"}}'
                until("the too_slow end counted", lambda: value(base, ends) == 1)

                prod.control("unstall 3")
                until(
                    "the vbucket caught up again",
                    lambda: (
                        value(base, f'dcp_cdc_capture_lag_seqnos{{{mine},vbucket="3"}}') == 0
                        and value(base, f"dcp_cdc_capture_stalled_vbuckets{{{mine}}}") == 0
                    ),
                )
                assert http_get(f"http://127.0.0.1:{metrics_port}/readyz")[0] == 200
                rate = value(base, f"rate(dcp_cdc_capture_received_frames_total{{{mine}}}[10s])")
                assert rate is not None and rate > 0, "NOOPs and the stalled changes came"

            status, exposition = http_get(f"http://127.0.0.1:{metrics_port}/metrics")
            assert status == 200
            assert PROMTOOL is not None
            checked = subprocess.run(
                [PROMTOOL, "check", "metrics"], input=exposition, capture_output=True
            )
            assert checked.returncode == 0, checked.stdout + checked.stderr
        finally:
            agent.send_signal(signal.SIGTERM)
            try:
                agent.wait(timeout=60)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()
            agent_log.close()
        assert agent.returncode == 0, (tmp_path / "agent.log").read_text()[-3000:]
        log = (tmp_path / "agent.log").read_text()
        assert f"metrics and health on http://127.0.0.1:{metrics_port}/metrics" in log
        assert "vbucket 3 has not moved" in log and "vbucket 3 moves again" in log


def test_the_alerting_rules_pass_promtool() -> None:
    assert PROMTOOL is not None
    checked = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
