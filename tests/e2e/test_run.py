"""``dcp-cdc run`` end to end, as a newcomer runs it (its own process, JVM and warehouse),
then ``dcp-cdc status`` on it (no JVM), and the same warehouse served over JDBC by the Spark
Thrift server and queried with beeline."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dcp_cdc.config import CONFIG_ENV
from tests.support.jvm_trap import jvm_trap
from tests.support.ports import free_port

pytestmark = pytest.mark.e2e
# the command of the code under test (the venv's dcp-cdc script runs what is installed)
CLI = [sys.executable, "-m", "pipelines.app.cli"]
PROMPT = re.compile(r"^\d+: jdbc:hive2://\S+> ")


REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Demo:
    cwd: Path  # a folder laid out like a checkout: conf/local.toml, the demo's data in work/
    workdir: Path
    stdout: str
    env: dict[str, str]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    """``dcp-cdc run`` as ``make run`` runs it: no options, in a folder with the checkout's
    ``conf/local.toml`` (whose data go to ``work/`` beside ``conf/``)."""
    cwd = tmp_path_factory.mktemp("cwd")
    (cwd / "conf").mkdir()
    shutil.copy2(REPO / "conf" / "local.toml", cwd / "conf" / "local.toml")
    env = {k: v for k, v in os.environ.items() if k != CONFIG_ENV}
    done = subprocess.run(
        [*CLI, "run"], capture_output=True, text=True, timeout=1200, cwd=cwd, env=env
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # nothing but the demo's data: no spark-warehouse/, metastore_db/, derby.log
    assert sorted(p.name for p in cwd.iterdir()) == ["conf", "work"], "the run wrote beside work/"
    return Demo(cwd, cwd / "work", done.stdout, env)


def test_run_simulates_ingests_applies_checks_and_summarizes(demo: Demo) -> None:
    out = demo.stdout
    assert (
        "[1/5] capturing bucket 'travel-sample' over DCP from 4 simulated data nodes on "
        "127.0.0.1 (live workload, seed 1) ... done"
    ) in out
    # the capture agent followed a failover (a rollback) and a rebalance (a moved vbucket)
    assert re.search(r"followed 2,000 live changes .*\([1-9]\d* rollbacks, [1-9]\d* moved", out)
    assert "16 vbuckets up to now" in out
    assert "bronze ingest of bucket 'travel-sample': run 1:" in out
    assert " 0 quarantined" in out  # the agent writes whole frames only
    assert "silver apply of bucket 'travel-sample'" in out
    assert "Events in bronze.travel_sample_a8560dff_events by type:" in out
    assert "Documents in silver by collection:" in out
    assert "Open snapshots:" in out
    assert "Quality" in out and ".html" in out
    # each step is one line in a log (no terminal redraws); the hints need no options, since
    # the demo's warehouse is the default configuration's
    assert out.count("[1/5]") == 1, out
    assert 'sql "SELECT op, count(*) AS n FROM bronze.travel_sample_a8560dff_events' in out, out
    assert (demo.workdir / "warehouse" / "metastore_db").is_dir()


def test_status_on_the_demo_starts_no_jvm(demo: Demo, tmp_path: Path) -> None:
    """`dcp-cdc status` with no options on the demo's warehouse: its stages and quality
    check, in seconds, with a ``java`` that fails and records each call as the only one it
    could start (a verb that needs Spark shows that the trap holds), and without pyspark."""
    trap = jvm_trap(tmp_path / "jdk")
    env = trap.env(demo.env)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLI, *args], capture_output=True, text=True, timeout=300, cwd=demo.cwd, env=env
        )

    refused = cli("sql", "SELECT 1")
    assert refused.returncode != 0 and trap.called, refused.stdout + refused.stderr[-3000:]
    tried = len(trap.called)

    started = time.monotonic()
    done = cli("status", "--no-cluster", "--json")
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert len(trap.called) == tried, trap.called
    assert elapsed < 10, f"{elapsed:.1f} s"  # about 1 s; a JVM alone takes 20 s or more here
    (shown,) = json.loads(done.stdout)["buckets"]
    stages = {s["stage"]: s for s in shown["stages"]}
    assert list(stages) == ["cluster", "capture", "bronze", "silver"]
    assert stages["cluster"]["note"] == "not asked (--no-cluster)"
    assert [stages[s]["vbuckets"] for s in ("capture", "bronze", "silver")] == [16, 16, 16]
    seqnos = stages["capture"]["seqnos"]
    assert seqnos > 2000 and stages["bronze"]["behind"]["seqnos"] == 0  # every file ingested
    if "Open snapshots: none" in demo.stdout:
        assert stages["silver"]["seqnos"] == seqnos and stages["silver"]["behind"]["seqnos"] == 0
    passed = re.search(r"Quality: PASSED, (\d+) of \d+ expectations met", demo.stdout)
    assert passed is not None, demo.stdout
    quality = shown["quality"]
    assert quality["passed"] and quality["expectations"] == int(passed.group(1))
    assert quality["report"] == str(
        demo.workdir / "warehouse" / "quality" / "travel_sample_a8560dff" / "summary.html"
    )
    assert shown["held_back"] == [] and shown["newest_change_at"]

    screen = cli("status", "--no-cluster")
    assert screen.returncode == 0 and len(trap.called) == tried, screen.stderr[-3000:]
    assert re.search(rf"^  silver +16 +{stages['silver']['seqnos']:,} ", screen.stdout, re.M)

    imported = subprocess.run(
        [sys.executable, "-c", _NO_PYSPARK],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=demo.cwd,
        env=env,
    )
    assert imported.returncode == 0, imported.stdout + imported.stderr[-3000:]
    assert imported.stdout.strip() == "0 []"


_NO_PYSPARK = """
import io, sys
from pipelines.app import cli
code = cli.main(["status", "--no-cluster"], io.StringIO())
print(code, sorted({m.split(".")[0] for m in sys.modules if m.startswith(("pyspark", "py4j"))}))
"""


@pytest.mark.long
def test_check_with_the_default_configuration_passes_on_the_demo(demo: Demo) -> None:
    """`dcp-cdc check` with no options (conf/local.toml as it is) judges the demo's warehouse
    as the demo did."""
    done = subprocess.run(
        [*CLI, "check"], capture_output=True, text=True, timeout=600, cwd=demo.cwd, env=demo.env
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Quality: PASSED" in demo.stdout
    assert "quality check of bucket 'travel-sample': passed" in done.stdout, done.stdout


def _wait_listening(port: int, process: subprocess.Popen[bytes], log: Path, seconds: int) -> None:
    deadline = time.monotonic() + seconds
    while True:
        assert process.poll() is None, log.read_text()[-3000:]
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        assert time.monotonic() < deadline, f"nothing listened on {port} in {seconds} s"
        time.sleep(0.5)


@dataclass(frozen=True)
class Directory:
    """An OpenLDAP server of this test alone, on loopback, with one user."""

    url: str
    base_dn: str
    user: str
    password: str


SLAPD_CONF = """\
modulepath /usr/lib/ldap
moduleload back_mdb
include /etc/ldap/schema/core.schema
include /etc/ldap/schema/cosine.schema
include /etc/ldap/schema/inetorgperson.schema
pidfile {folder}/slapd.pid
database mdb
maxsize 10485760
suffix "dc=dcp,dc=test"
directory {folder}/db
access to attrs=userPassword by anonymous auth by * none
access to * by * read
"""
DIRECTORY_LDIF = """\
dn: dc=dcp,dc=test
objectClass: dcObject
objectClass: organization
o: dcp
dc: dcp

dn: ou=people,dc=dcp,dc=test
objectClass: organizationalUnit
ou: people

dn: uid={user},ou=people,dc=dcp,dc=test
objectClass: inetOrgPerson
uid: {user}
cn: {user}
sn: {user}
userPassword: {password}
"""


@pytest.fixture(scope="module")
def directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Directory | None]:
    """slapd (Debian's, which .ci/run installs) on a free loopback port; None without it."""
    slapd = shutil.which("slapd", path=f"{os.environ.get('PATH', '')}:/usr/sbin")
    if slapd is None or not Path("/usr/lib/ldap").is_dir():
        yield None
        return
    folder = tmp_path_factory.mktemp("ldap")
    (folder / "db").mkdir()
    conf = folder / "slapd.conf"
    conf.write_text(SLAPD_CONF.format(folder=folder))
    user, password = "analyst", "right-pw-7"
    (folder / "data.ldif").write_text(DIRECTORY_LDIF.format(user=user, password=password))
    subprocess.run(
        [str(Path(slapd).with_name("slapadd")), "-f", str(conf), "-l", str(folder / "data.ldif")],
        check=True,
        capture_output=True,
        timeout=60,
    )
    port = free_port()
    url = f"ldap://127.0.0.1:{port}"
    log = folder / "slapd.log"
    with log.open("w") as out:
        # -d 0: in the foreground, so that the fixture owns and ends it
        server = subprocess.Popen(
            [slapd, "-f", str(conf), "-h", f"{url}/", "-d", "0"], stdout=out, stderr=out
        )
    try:
        _wait_listening(port, server, log, 30)
        yield Directory(url, "ou=people,dc=dcp,dc=test", user, password)
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.fixture(scope="module")
def thrift_server(demo: Demo, directory: Directory | None) -> Iterator[int]:
    """``dcp-cdc thrift-server`` over the demo's warehouse (its Derby catalog: no other JVM
    may hold it) for the tests that follow, checking users against ``directory`` when there
    is one (else unauthenticated, on loopback)."""
    port = free_port()
    config = demo.cwd / "thrift.toml"
    config.write_text(
        (REPO / "conf" / "local.toml").read_text().split("[thrift]")[0]
        + (
            f'[thrift]\nauthentication = "ldap"\nldap_url = "{directory.url}"\n'
            f'ldap_base_dn = "{directory.base_dn}"\n'
            if directory
            else ""
        )
    )
    log_path = demo.workdir / "thrift-server.log"
    log = log_path.open("w")
    server = subprocess.Popen(
        [
            *CLI,
            "thrift-server",
            "--config",
            str(config),
            "--warehouse",
            str(demo.workdir / "warehouse"),
            "--port",
            str(port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=demo.env,
    )
    try:
        _wait_listening(port, server, log_path, 300)
        yield port
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
        log.close()
        # the catalog was shared while it served, through a metastore server it started and
        # stopped on SIGTERM (pipelines.catalog.server)
        assert "catalog: metastore server derby://127.0.0.1:" in log_path.read_text()
        assert not (demo.workdir / "warehouse" / "metastore_db.server.json").exists()


def _beeline(port: int, user: str, password: str, query: str) -> subprocess.CompletedProcess[str]:
    from pipelines.app.commands.thrift_server import spark_script

    return subprocess.run(
        [
            spark_script("beeline"),
            "-u",
            f"jdbc:hive2://127.0.0.1:{port}/",
            "-n",
            user,
            "-p",
            password,
            "--silent=true",
            "--outputformat=csv2",
            "-e",
            query,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_beeline_queries_silver_over_jdbc(
    demo: Demo, thrift_server: int, directory: Directory | None
) -> None:
    """One JDBC query of a collection's view through beeline (as the directory's user, with
    the right password, when the server checks users) returns what delta-rs reads from its
    tables (the ``_all`` table and the live layer): the catalog the run wrote outlives its
    process, and another Spark process (the Thrift server) finds its views and tables."""
    from tests.support import delta_rs

    shown = delta_rs.silver_tables(demo.workdir / "warehouse" / "silver.db", ["_deleted"])
    table, rows = next((t, rows) for t, rows in shown.items() if rows)
    expected = sorted(r["key"] for r in rows if not r["_deleted"])[:5]
    view = table.removesuffix("_all")
    query = f"SELECT key FROM silver.{view} ORDER BY key LIMIT 5"
    user, password = (directory.user, directory.password) if directory else ("dcp", "any")
    done = _beeline(thrift_server, user, password, query)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    # beeline echoes its prompt before the first line of output when it is not on a terminal
    lines = [PROMPT.sub("", line) for line in done.stdout.splitlines() if line.strip()]
    assert lines == ["key", *expected]


def test_ldap_refuses_a_wrong_password_and_an_unknown_user(
    demo: Demo, thrift_server: int, directory: Directory | None
) -> None:
    if directory is None:
        pytest.skip("no slapd (.ci/run installs Debian's slapd as root)")
    for user, password in [(directory.user, "wrong-pw"), ("mallory", directory.password)]:
        done = _beeline(thrift_server, user, password, "SHOW TABLES IN silver")
        assert done.returncode != 0, (user, done.stdout[-2000:])
        # the server's SASL PLAIN check failed (it logs "Error validating LDAP user")
        assert "Error validating the login" in done.stderr + done.stdout, done.stderr[-2000:]
        assert "_all" not in done.stdout  # no table name reached the client
    log = (demo.workdir / "thrift-server.log").read_text()
    assert "Error validating LDAP user" in log  # refused by the directory, not by a fault
    assert "wrong-pw" not in log and directory.password not in log
