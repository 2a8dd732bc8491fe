"""The capture agent's lag, metrics and health: the tracker with times the test decides, the
collector's exposition, the readiness checks, the HTTP endpoints, and a run following the
test producer while one vbucket stalls (``/readyz`` fails, its lag grows, both recover).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dcp_cdc.agent.driver import capture
from dcp_cdc.agent.metrics import METRICS, Monitoring
from dcp_cdc.agent.metrics_server import MetricsServer
from dcp_cdc.agent.progress import LagTracker, RunReport, VbLag, cas_seconds
from dcp_cdc.errors import AgentUsageError, ConfigError
from dcp_cdc.simulator.server import ProducerServer
from dcp_cdc.simulator.state import SimConfig
from tests.support.capture_harness import in_process_settings as settings
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
# 2026-01-05T09:30:00Z in ns with a counter of 7 in the low 16 bits (docs/protocol/dcp.md §1.5)
CAS = (1_767_605_400_000_000_000 & ~0xFFFF) | 7
CAS_TIME = (1_767_605_400_000_000_000 & ~0xFFFF) / 1e9


def test_cas_reads_as_a_time_without_its_counter() -> None:
    assert cas_seconds(CAS) == CAS_TIME
    assert 1_767_605_399.999 < CAS_TIME <= 1_767_605_400.0


def test_the_lag_and_a_stall_from_positions_and_high_seqnos() -> None:
    lag = LagTracker(stall_after_s=10.0)
    lag.start({0: 5, 1: 0}, now=100.0)
    assert lag.lag(0, wall=0.0) == VbLag(0, None, None), "no node has answered yet"
    lag.cluster({0: 9, 1: 0, 7: 50})  # vbucket 7 is not this run's
    assert set(lag.high) == {0, 1}
    lag.observe({0: 5}, {}, now=101.0)
    assert lag.lag(0, wall=0.0) == VbLag(0, 4, None), "behind, but nothing to date it by"
    assert lag.lag(1, wall=0.0) == VbLag(1, 0, 0.0)
    lag.observe({0: 7}, {0: CAS}, now=102.0)  # moved: the stall clock starts again
    assert lag.lag(0, wall=CAS_TIME + 30) == VbLag(0, 2, 30.0)
    lag.observe({}, {0: 0}, now=111.9)  # left out: keeps its position and its CAS
    assert lag.seqno[0] == 7 and lag.cas[0] == CAS
    assert lag.stalled_now(111.9, [0, 1]) == []
    assert lag.stall_changes(112.0, [0, 1]) == ([0], [])
    assert lag.stall_changes(113.0, [0, 1]) == ([], []), "said once"
    assert lag.stalled_now(113.0, [1]) == [], "only among the vbuckets still to stream"
    assert lag.stuck_for(0, 113.0) == 11.0
    lag.observe({0: 9}, {}, now=114.0)
    assert lag.lag(0, wall=CAS_TIME + 99) == VbLag(0, 0, 0.0)
    assert lag.stall_changes(114.0, [0, 1]) == ([], [0])


def test_a_quiet_vbucket_that_falls_behind_is_judged_from_then() -> None:
    lag = LagTracker(stall_after_s=10.0)
    lag.start({0: 5}, now=0.0)
    lag.cluster({0: 5})
    lag.observe({0: 5}, {}, now=3600.0)  # a quiet hour, caught up all along
    lag.cluster({0: 6})  # a change the agent has not received yet
    lag.observe({0: 5}, {}, now=3601.0)
    # from the last time it was seen in step (3600), not from its last change (0)
    assert not lag.is_stalled(0, 3601.0) and not lag.is_stalled(0, 3609.9)
    assert lag.is_stalled(0, 3610.0)


def report(**changes: object) -> RunReport:
    base: dict[str, object] = {
        "bucket": "travel-sample",
        "agent_id": "east",
        "vbuckets": 3,
        "frames_received": 1200,
        "bytes_received": 96_000,
        "stream_ends": {"too_slow": 2, "unknown": 1},
        "rollbacks": 1,
        "reconnects": 3,
        "files_durable": 4,
        "bytes_durable": 90_000,
        "checkpoint_age_s": 1.5,
        "buffer_bytes": 1 << 20,
        "flow_control_unacked": {"127.0.0.1:11210": 512, "[::1]:11210": 0},
        "lag": (VbLag(0, 0, 0.0), VbLag(1, 40, 12.5), VbLag(2, None, None)),
        "stalled": (1,),
        "stall_after_s": 300.0,
    }
    base.update(changes)
    return RunReport(**base)  # type: ignore[arg-type]


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) -> value of an exposition, read by prometheus_client's
    own parser."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_the_exposition_names_each_metric_once_with_bounded_labels() -> None:
    monitoring = Monitoring(process_metrics=False)
    with (
        monitoring.attach("travel-sample/east", lambda: report()),
        monitoring.attach("beer/agent", lambda: report(bucket="beer", agent_id="agent")),
        monitoring.attach("idle/agent", lambda: None),
    ):
        body, content_type = monitoring.exposition()
        text = body.decode()
    assert content_type.startswith("text/plain; version=0.0.4")
    for spec in METRICS:
        assert text.count(f"# TYPE {spec.name} {spec.kind}\n") == 1
    got = samples(text)
    east = (("agent", "east"), ("bucket", "travel-sample"))
    assert got[("dcp_cdc_capture_received_frames_total", east)] == 1200
    assert got[("dcp_cdc_capture_durable_files_total", east)] == 4
    assert got[("dcp_cdc_capture_stream_ends_total", (*east, ("reason", "unknown")))] == 1
    assert got[("dcp_cdc_capture_lag_seqnos", (*east, ("vbucket", "1")))] == 40
    assert got[("dcp_cdc_capture_lag_seconds", (*east, ("vbucket", "1")))] == 12.5
    assert ("dcp_cdc_capture_lag_seqnos", (*east, ("vbucket", "2"))) not in got, "unknown yet"
    node = ("node", "[::1]:11210")
    assert got[("dcp_cdc_capture_flow_control_unacked_bytes", (*east, node))] == 0
    assert got[("dcp_cdc_capture_stalled_vbuckets", east)] == 1
    beer = (("agent", "agent"), ("bucket", "beer"))
    assert got[("dcp_cdc_capture_rollbacks_total", beer)] == 1
    assert not [key for key in got if ("bucket", "idle") in key[1]]
    openmetrics, kind = monitoring.exposition("application/openmetrics-text; version=1.0.0")
    assert kind.startswith("application/openmetrics-text") and openmetrics.endswith(b"# EOF\n")


def test_every_metric_is_in_the_docs() -> None:
    page = (ROOT / "docs" / "metrics.md").read_text(encoding="utf-8")
    missing = [spec.name for spec in METRICS if f"`{spec.name}`" not in page]
    assert not missing, f"docs/metrics.md does not list {missing}"


def test_readiness_is_every_named_check() -> None:
    monitoring = Monitoring(process_metrics=False)
    assert monitoring.ready() == (True, "readyz check passed\n")
    monitoring.readiness.add("later", lambda: None)
    with pytest.raises(AgentUsageError, match="'later' exists"):
        monitoring.readiness.add("later", lambda: "again")
    with monitoring.attach("travel-sample/east", lambda: report()):
        ready, text = monitoring.ready()
        assert not ready
        assert text.splitlines() == [
            "[-]capture:travel-sample/east failed: bucket travel-sample: vbucket 1 behind the "
            "cluster without moving for 300 s or more",
            "[+]later ok",
            "readyz check failed",
        ]
    with monitoring.attach("travel-sample/east", lambda: None):
        assert "not started" in monitoring.ready()[1]
    assert monitoring.ready()[0], "a run's check leaves with it"

    def broken() -> str | None:
        raise KeyError("vbucket")

    monitoring.readiness.add("broken", broken)
    ready, text = monitoring.ready()
    assert not ready and "[-]broken failed: the check raised KeyError: 'vbucket'" in text
    many = report(stalled=tuple(range(20)))
    assert many.not_ready() is not None and "15 and 4 more" in many.not_ready()  # type: ignore[operator]


async def http(port: int, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """One request over a fresh connection: (status, headers, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    async with asyncio.timeout(10):
        data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split(" ")[1]), headers, body


async def get(port: int, path: str) -> tuple[int, bytes]:
    status, _, body = await http(port, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return status, body


def test_the_endpoints_over_http() -> None:
    async def scenario() -> None:
        monitoring = Monitoring()
        server = MetricsServer(monitoring, "127.0.0.1", 0)
        await server.start()
        try:
            port = server.port
            assert await get(port, "/healthz") == (200, b"ok\n")
            assert await get(port, "/readyz?verbose") == (200, b"readyz check passed\n")
            status, headers, body = await http(port, b"GET /metrics HTTP/1.1\r\n\r\n")
            assert status == 200 and headers["Content-Type"].startswith("text/plain; version=")
            assert b"process_cpu_seconds_total" in body
            assert int(headers["Content-Length"]) == len(body)
            status, headers, body = await http(port, b"HEAD /metrics HTTP/1.1\r\n\r\n")
            assert (status, body) == (200, b"") and int(headers["Content-Length"]) > 0
            with monitoring.attach("b/a", lambda: report(stalled=(7,))):
                status, body = await get(port, "/readyz")
                assert status == 503 and b"vbucket 7 behind" in body
            assert (await get(port, "/"))[0] == 404
            assert (await http(port, b"POST /metrics HTTP/1.1\r\n\r\n"))[0] == 405
            assert (await http(port, b"nonsense\r\n\r\n"))[0] == 400
            long = b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 9000 + b"\r\n\r\n"
            assert (await http(port, long))[0] == 431
            taken = MetricsServer(monitoring, "127.0.0.1", port)
            with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
                await taken.start()
        finally:
            await server.close()

    asyncio.run(scenario())


def metric(text: str, name: str, **labels: str) -> float | None:
    for (sample, got), value in samples(text).items():
        if sample == name and all((k, v) in got for k, v in labels.items()):
            return value
    return None


async def until(what: str, check: object, timeout: float = 30.0) -> None:
    """Poll the coroutine function ``check`` until it returns true."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, f"not within {timeout:g} s: {what}"
        await asyncio.sleep(0.1)


def test_a_stalled_vbucket_fails_readyz_and_its_lag_grows_until_it_moves(tmp_path: Path) -> None:
    """The test producer stops sending vbucket 3 while it takes 5 changes and reports them in
    its high seqno: within ``stall_after_s`` (plus a poll) ``/readyz`` fails and vbucket 3's
    lag is 5 seqnos and growing seconds; once it moves again, both recover."""
    port = free_port()
    scraped: list[str] = []

    async def scenario() -> None:
        config = SimConfig(scenario="mixed", docs=200, ops=0, vbuckets=8)
        async with ProducerServer(config, nodes=2) as server:
            s = settings(
                tmp_path,
                server.connection_string,
                metrics_port=port,
                lag_poll_s=0.2,
                stall_after_s=1.0,
            )
            stop = asyncio.Event()
            follow = asyncio.create_task(capture(s, mode="follow", stop=stop))

            async def text() -> str:
                status, body = await get(port, "/metrics")
                assert status == 200
                scraped.append(body.decode())
                return scraped[-1]

            async def caught_up() -> bool:
                try:
                    t = await text()
                except ConnectionRefusedError:  # not listening yet
                    return False
                lags = [metric(t, "dcp_cdc_capture_lag_seqnos", vbucket=str(v)) for v in range(8)]
                return lags == [0] * 8

            await until("every vbucket caught up", caught_up)
            assert (await get(port, "/readyz"))[0] == 200
            assert (await get(port, "/healthz")) == (200, b"ok\n")

            server.too_slow(1)  # a stream end the agent counts, and reopens from
            server.stall(3, changes=5)

            async def not_ready() -> bool:
                return (await get(port, "/readyz"))[0] == 503

            await until("/readyz fails", not_ready, timeout=10)
            _, body = await get(port, "/readyz")
            assert b"[-]capture:travel-sample/agent failed" in body and b"vbucket 3" in body
            first = await text()
            assert metric(first, "dcp_cdc_capture_lag_seqnos", vbucket="3") == 5
            assert metric(first, "dcp_cdc_capture_stalled_vbuckets") == 1
            assert metric(first, "dcp_cdc_capture_lag_seqnos", vbucket="2") == 0
            assert metric(first, "dcp_cdc_capture_stream_ends_total", reason="too_slow") == 1
            seconds = metric(first, "dcp_cdc_capture_lag_seconds", vbucket="3")
            await asyncio.sleep(0.5)
            later = metric(await text(), "dcp_cdc_capture_lag_seconds", vbucket="3")
            assert seconds is not None and later is not None and later >= seconds + 0.4

            server.unstall(3)

            async def ready() -> bool:
                return (await get(port, "/readyz"))[0] == 200

            await until("/readyz passes again", ready, timeout=10)
            assert await caught_up()
            last = scraped[-1]
            assert metric(last, "dcp_cdc_capture_stalled_vbuckets") == 0
            assert metric(last, "dcp_cdc_capture_lag_seconds", vbucket="3") == 0
            for name in ("received_frames_total", "received_bytes_total", "durable_files_total"):
                assert (metric(last, f"dcp_cdc_capture_{name}") or 0) > 0, name
            assert (metric(last, "dcp_cdc_capture_durable_bytes_total") or 0) > 0
            assert metric(last, "dcp_cdc_capture_vbuckets") == 8
            assert metric(last, "dcp_cdc_capture_flow_control_buffer_bytes") == 1 << 16
            assert metric(last, "process_resident_memory_bytes") is not None
            stop.set()
            summary = await asyncio.wait_for(follow, 30)
            assert summary.frames_received > 0 and summary.bytes_received > 0
            assert summary.stream_ends["too_slow"] == 1
            assert summary.bytes_durable == sum(Path(p).stat().st_size for p in summary.files)
        with pytest.raises(OSError):  # the endpoint ends with the run
            await get(port, "/healthz")

    asyncio.run(scenario())
    promtool = shutil.which("promtool")
    if promtool is not None:  # the test of the real server (tests/e2e) skips without it
        checked = subprocess.run(
            [promtool, "check", "metrics"], input=scraped[-1], capture_output=True, text=True
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_shared_monitoring_serves_the_run_it_is_given(tmp_path: Path) -> None:
    async def scenario() -> None:
        monitoring = Monitoring()
        server = MetricsServer(monitoring, "127.0.0.1", 0)
        await server.start()
        try:
            config = SimConfig(scenario="mixed", docs=50, ops=0, vbuckets=4)
            async with ProducerServer(config, nodes=1) as producer:
                s = settings(tmp_path, producer.connection_string, metrics_port=1)
                stop = asyncio.Event()
                run = asyncio.create_task(
                    capture(s, mode="follow", stop=stop, monitoring=monitoring)
                )

                async def attached() -> bool:
                    text = (await get(server.port, "/metrics"))[1].decode()
                    return metric(text, "dcp_cdc_capture_vbuckets", bucket="travel-sample") == 4

                await until("the run's metrics are served", attached)
                assert (await get(server.port, "/readyz"))[0] == 200
                stop.set()
                await asyncio.wait_for(run, 30)
                # gone with the run; its own port (1) was never opened: the caller serves
                assert "travel-sample" not in (await get(server.port, "/metrics"))[1].decode()
        finally:
            await server.close()

    asyncio.run(scenario())


def test_the_kubernetes_example_probes_the_port_its_configuration_sets(tmp_path: Path) -> None:
    import yaml  # type: ignore[import-untyped]  # PyYAML, an Airflow dependency

    from dcp_cdc.config import load_config

    documents = list(
        yaml.safe_load_all((ROOT / "conf" / "kubernetes" / "capture-agent.yaml").read_text())
    )
    kinds = {d["kind"]: d for d in documents}
    toml = tmp_path / "cluster.toml"
    toml.write_text(kinds["ConfigMap"]["data"]["cluster.toml"])
    capture_section = load_config(toml).buckets[0].capture
    assert capture_section is not None
    assert (capture_section.metrics_port, capture_section.metrics_host) == (9464, "0.0.0.0")
    deployment = kinds["Deployment"]
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["ports"] == [{"name": "metrics", "containerPort": 9464}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == "9464"
    health = (ROOT / "conf" / "systemd" / "dcp-cdc-capture-health@.service").read_text()
    assert "DCP_CDC_METRICS_PORT=9464" in health and "/healthz" in health
