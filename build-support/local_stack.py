"""Airflow under its scheduler and a Spark standalone cluster, on this machine (127.0.0.1).

``up`` starts, in a work folder, and stays in the foreground until Ctrl-C or SIGTERM:

1. PostgreSQL (``initdb`` on first use, ``pg_ctl start``): Airflow's metadata database. As
   root it runs as the ``postgres`` OS user (``runuser``): initdb refuses root. Airflow reaches
   it through psycopg2 and, for its async sessions (the execution API), asyncpg. This is
   the default; ``--database sqlite`` uses one SQLite file instead (aiosqlite), as
   ``airflow standalone`` does: a fallback for a machine without PostgreSQL.
2. ``airflow db migrate``, then ``airflow api-server`` (the UI, the REST API ``/api/v2`` and the
   execution API ``/execution/`` that task processes report to), ``airflow dag-processor``
   (parses ``dags/``) and ``airflow scheduler`` (LocalExecutor).
3. A Spark standalone master and two workers from pyspark's ``spark-class`` (1 core, 1 GiB
   each); the Airflow connection ``dcp_cdc_spark`` points at the master.

When all are ready it writes ``<dir>/stack.json`` (URLs, the Airflow user, where its password
is) and ``<dir>/airflow.env`` (the environment that points the ``airflow`` command at this
deployment; it holds secrets, mode 600). ``down`` stops a running ``up`` (its pid is in
``up.pid``, written first); ``up`` stops everything it started, in reverse order, on any exit.

    python build-support/local_stack.py up --dir work/stack [--config conf/local.toml]
    python build-support/local_stack.py down --dir work/stack
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PG_BIN = Path(os.environ.get("DCP_CDC_PG_BIN", "/usr/lib/postgresql/15/bin"))
BIN = Path(sys.executable).parent
AIRFLOW_USER = "dcp"
SPARK_CONN_ID = "dcp_cdc_spark"
STATE_FILE = "stack.json"
PID_FILE = "up.pid"
STOP_GRACE_S = 30.0


class StackError(Exception):
    """A component did not start, or the stack cannot start as asked."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def as_postgres(command: list[str]) -> list[str]:
    """``command`` as the ``postgres`` OS user when this is root (initdb refuses root)."""
    return ["runuser", "-u", "postgres", "--", *command] if os.geteuid() == 0 else command


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc), children first seen first."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@dataclass
class Component:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        """SIGTERM to its process group and everything below it (a task's spark-submit and
        JVM included), SIGKILL after the grace period."""
        pids = [self.process.pid, *descendants(self.process.pid)]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, sig)
            deadline = time.monotonic() + STOP_GRACE_S
            while any(alive(p) for p in pids) and time.monotonic() < deadline:
                self.process.poll()  # reaps it once it exits
                time.sleep(0.2)
            if not any(alive(p) for p in pids):
                break
        self.process.poll()


@dataclass
class Stack:
    folder: Path
    config: Path
    dags: Path
    env: dict[str, str] = field(default_factory=dict)
    started: list[Component] = field(default_factory=list)
    postgres_data: Path | None = None

    @property
    def logs(self) -> Path:
        return self.folder / "logs"

    def spawn(self, name: str, command: list[str], env: Mapping[str, str]) -> Component:
        log = self.logs / f"{name}.log"
        with log.open("ab") as out:
            process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=dict(env),
                cwd=self.folder,
                start_new_session=True,
            )
        component = Component(name, process, log)
        self.started.append(component)
        print(f"started {name} (pid {process.pid}, log {log})", flush=True)
        return component

    def wait(self, component: Component, ready: str, seconds: float = 300) -> None:
        deadline = time.monotonic() + seconds
        while ready not in component.log.read_text(errors="replace"):
            if component.process.poll() is not None:
                raise StackError(f"{component.name} exited: {component.tail()}")
            if time.monotonic() > deadline:
                raise StackError(f"{component.name}: no {ready!r} in {seconds} s")
            time.sleep(0.5)

    # --- PostgreSQL ---------------------------------------------------------------------

    def start_postgres(self) -> str:
        """The SQLAlchemy URL of a running PostgreSQL with an ``airflow`` database."""
        data = self.folder / "postgres"
        password_file = self.folder / "postgres.password"
        if not password_file.exists():
            password_file.write_text(secrets.token_urlsafe(24))
            password_file.chmod(0o600)
        password = password_file.read_text().strip()
        if os.geteuid() == 0:
            # the postgres user must reach the folder: every parent needs o+x
            for parent in [self.folder, *self.folder.parents]:
                if not parent.stat().st_mode & 0o001:
                    raise StackError(
                        f"{parent} is not traversable by the postgres user (mode "
                        f"{parent.stat().st_mode & 0o777:o}): choose a --dir under a folder "
                        "others can enter, e.g. /tmp or the checkout's work/"
                    )
        if not (data / "PG_VERSION").exists():
            data.mkdir(mode=0o700, exist_ok=True)
            pwfile = self.folder / "postgres.pwfile"
            pwfile.write_text(password + "\n")
            if os.geteuid() == 0:
                shutil.chown(data, "postgres", "postgres")
                shutil.chown(pwfile, "postgres", "postgres")
            try:
                self.run(
                    "initdb",
                    as_postgres(
                        [
                            str(PG_BIN / "initdb"),
                            "-D",
                            str(data),
                            "--username=airflow",
                            f"--pwfile={pwfile}",
                            "--auth=scram-sha-256",
                            "--encoding=UTF8",
                        ]
                    ),
                    os.environ,
                )
            finally:
                pwfile.unlink()
        port = free_port()
        options = f"-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories=''"
        log = self.logs / "postgres.log"
        if os.geteuid() == 0:
            log.touch()
            shutil.chown(log, "postgres", "postgres")
        pg_ctl = [str(PG_BIN / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w"]
        self.run("pg_ctl start", as_postgres([*pg_ctl, "start"]), os.environ)
        self.postgres_data = data
        import psycopg2  # type: ignore[import-untyped]  # the driver Airflow's URL names

        connection = psycopg2.connect(
            host="127.0.0.1", port=port, user="airflow", password=password, dbname="postgres"
        )
        try:
            connection.autocommit = True
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1 FROM pg_database WHERE datname = 'airflow'")
                if cursor.fetchone() is None:
                    cursor.execute("CREATE DATABASE airflow")
        finally:
            connection.close()
        return f"postgresql+psycopg2://airflow:{password}@127.0.0.1:{port}/airflow"

    def stop_postgres(self) -> None:
        if self.postgres_data is None:
            return
        stop = [str(PG_BIN / "pg_ctl"), "-D", str(self.postgres_data), "-m", "fast", "-w", "stop"]
        subprocess.run(as_postgres(stop), capture_output=True, timeout=120, check=False)
        print("stopped postgres", flush=True)

    def run(self, name: str, command: list[str], env: Mapping[str, str]) -> None:
        done = subprocess.run(
            command, capture_output=True, text=True, env=dict(env), timeout=600, cwd=self.folder
        )
        (self.logs / f"{name.replace(' ', '-')}.log").write_text(done.stdout + done.stderr)
        if done.returncode != 0:
            raise StackError(f"{name} failed (exit {done.returncode}): {done.stderr[-3000:]}")

    # --- Spark --------------------------------------------------------------------------

    def start_spark(self, workers: int, cores: int, memory: str) -> str:
        """A standalone master and ``workers`` workers; the master's URL."""
        spec = importlib.util.find_spec("pyspark")
        if spec is None or spec.origin is None:
            raise StackError("pyspark is not installed for this Python")
        spark_class = str(Path(spec.origin).parent / "bin" / "spark-class")
        env = {k: v for k, v in self.env.items() if k != "PYTHONPATH"}
        env |= {"SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}
        port = free_port()
        master_url = f"spark://127.0.0.1:{port}"
        master = self.spawn(
            "spark-master",
            [
                *(spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"),
                *("--port", str(port), "--webui-port", str(free_port())),
            ],
            env,
        )
        self.wait(master, "I have been elected leader")
        for n in range(1, workers + 1):
            worker = self.spawn(
                f"spark-worker-{n}",
                [
                    *(spark_class, "org.apache.spark.deploy.worker.Worker", master_url),
                    *("--host", "127.0.0.1", "--webui-port", str(free_port())),
                    *("--cores", str(cores), "--memory", memory),
                    *("--work-dir", str(self.folder / "spark" / f"worker-{n}")),
                ],
                env,
            )
            self.wait(worker, "Successfully registered with master")
        return master_url

    # --- Airflow ------------------------------------------------------------------------

    def airflow_env(self, database_url: str, api_port: int, master_url: str) -> dict[str, str]:
        """Every Airflow component's settings (the keys of Airflow 3.3's configuration)."""
        home = self.folder / "airflow"
        home.mkdir(exist_ok=True)
        passwords = home / "passwords.json"
        if not passwords.exists():
            passwords.write_text(json.dumps({AIRFLOW_USER: secrets.token_urlsafe(16)}))
            passwords.chmod(0o600)
        base_url = f"http://127.0.0.1:{api_port}"
        host, port = master_url.rsplit(":", 1)
        return {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "4",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database_url,
            "AIRFLOW__API__BASE_URL": base_url,
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base_url}/execution/",
            # the secrets every component must share: the task tokens' signing key, the UI's
            "AIRFLOW__API_AUTH__JWT_SECRET": self.secret("jwt.secret"),
            "AIRFLOW__API__SECRET_KEY": self.secret("api.secret"),
            "AIRFLOW__CORE__AUTH_MANAGER": (
                "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
            ),
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{AIRFLOW_USER}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            "AIRFLOW__SCHEDULER__STANDALONE_DAG_PROCESSOR": "True",
            "AIRFLOW_CONN_DCP_CDC_SPARK": json.dumps(
                {"conn_type": "spark", "host": host, "port": int(port)}
            ),
            "DCP_CDC_CONFIG": str(self.config),
            # spark-submit's driver and the executors run this Python (it has the package)
            "PYSPARK_PYTHON": sys.executable,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    def secret(self, name: str) -> str:
        path = self.folder / name
        if not path.exists():
            path.write_text(secrets.token_urlsafe(64))  # HS512 wants 64 bytes or more
            path.chmod(0o600)
        return path.read_text().strip()

    def start_airflow(self, api_port: int) -> None:
        self.run("airflow db migrate", [str(BIN / "airflow"), "db", "migrate"], self.env)
        api = self.spawn(
            "airflow-api-server",
            [str(BIN / "airflow"), "api-server", "--host", "127.0.0.1", "--port", str(api_port)],
            self.env,
        )
        self.spawn("airflow-dag-processor", [str(BIN / "airflow"), "dag-processor"], self.env)
        self.spawn("airflow-scheduler", [str(BIN / "airflow"), "scheduler"], self.env)
        wait_healthy(f"http://127.0.0.1:{api_port}", api, self.started)

    def stop(self) -> None:
        for component in reversed(self.started):
            component.stop()
            print(f"stopped {component.name}", flush=True)
        self.started.clear()
        self.stop_postgres()


def wait_healthy(base_url: str, api: Component, started: list[Component]) -> None:
    """Until ``/api/v2/monitor/health`` says the scheduler and the DAG processor beat."""
    deadline = time.monotonic() + 300
    health: dict[str, Any] = {}
    while time.monotonic() < deadline:
        for component in started:
            if component.process.poll() is not None:
                raise StackError(f"{component.name} exited: {component.tail()}")
        try:
            with urllib.request.urlopen(f"{base_url}/api/v2/monitor/health", timeout=10) as r:
                health = json.load(r)
        except (urllib.error.URLError, OSError, ValueError):
            health = {}
        states = [(health.get(k) or {}).get("status") for k in ("scheduler", "dag_processor")]
        if states == ["healthy", "healthy"]:
            return
        time.sleep(1)
    raise StackError(f"Airflow not healthy in 300 s: {health or api.tail()}")


def database(asked: str) -> str:
    """``postgres`` (the default) or ``sqlite``, once what PostgreSQL needs is there."""
    if asked != "postgres":
        return asked
    # Airflow 3 opens the database async too (the execution API): PostgreSQL through asyncpg,
    # which is not a dependency of apache-airflow itself
    if importlib.util.find_spec("asyncpg") is None:
        raise StackError(
            "Airflow on PostgreSQL needs the asyncpg package (pip install asyncpg, or "
            "apache-airflow[postgres]); without it use --database sqlite"
        )
    missing = [name for name in ("initdb", "pg_ctl") if not (PG_BIN / name).is_file()]
    if missing:
        raise StackError(
            f"PostgreSQL server programs not found: no {', '.join(missing)} in {PG_BIN} "
            "(set DCP_CDC_PG_BIN to the folder that has them, e.g. "
            "/usr/lib/postgresql/<version>/bin), or use --database sqlite"
        )
    return "postgres"


def up(args: argparse.Namespace) -> int:
    folder = Path(args.dir).resolve()
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    state = folder / STATE_FILE
    state.unlink(missing_ok=True)
    pid_file = folder / PID_FILE
    pid_file.write_text(f"{os.getpid()}\n")
    stack = Stack(folder, Path(args.config).resolve(), Path(args.dags).resolve())
    stopping: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        stopping.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        chosen = database(args.database)
        if chosen == "postgres":
            database_url = stack.start_postgres()
        else:  # one file; Airflow 3's LocalExecutor takes it (airflow standalone does)
            database_url = f"sqlite:///{folder / 'airflow' / 'airflow.db'}"
        api_port = args.api_port or free_port()
        stack.env = dict(os.environ)  # the tasks inherit it: a capture password, for one
        master_url = stack.start_spark(args.workers, args.worker_cores, args.worker_memory)
        airflow = stack.airflow_env(database_url, api_port, master_url)
        stack.env |= airflow
        env_file = folder / "airflow.env"
        env_file.write_text("".join(f"export {k}={_quote(v)}\n" for k, v in airflow.items()))
        env_file.chmod(0o600)
        stack.start_airflow(api_port)
        summary = {
            "pid": os.getpid(),
            "api_url": f"http://127.0.0.1:{api_port}",
            "database": chosen,
            "spark_master": master_url,
            "spark_conn_id": SPARK_CONN_ID,
            "user": AIRFLOW_USER,
            "password_file": airflow["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"],
            "env_file": str(env_file),
            "logs": str(stack.logs),
        }
        state.write_text(json.dumps(summary, indent=2) + "\n")
        print(
            f"ready: Airflow at {summary['api_url']} (user {AIRFLOW_USER!r}, password in "
            f"{summary['password_file']}), Spark at {master_url}; `source {env_file}` for "
            "the airflow command; Ctrl-C or `down` stops everything",
            flush=True,
        )
        while True:
            for component in stack.started:
                if component.process.poll() is not None:
                    raise StackError(f"{component.name} exited: {component.tail()}")
            time.sleep(2)
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM (`down`)
        print(f"stopping (signal {stopping[0] if stopping else 'SIGINT'})", flush=True)
        return 0
    except StackError as error:
        print(f"local_stack: {error}", file=sys.stderr, flush=True)
        return 1
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        state.unlink(missing_ok=True)
        stack.stop()
        pid_file.unlink(missing_ok=True)


def _quote(value: str) -> str:
    return "'" + value.replace("'", "'\"'\"'") + "'"


def down(args: argparse.Namespace) -> int:
    pid_file = Path(args.dir).resolve() / PID_FILE
    try:
        pid = int(pid_file.read_text())
        os.kill(pid, signal.SIGTERM)
    except (FileNotFoundError, ProcessLookupError):
        print(f"local_stack: nothing running ({pid_file} names no live up)", file=sys.stderr)
        return 1
    deadline = time.monotonic() + 300
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    if alive(pid):
        print(f"local_stack: pid {pid} still stopping after 300 s", file=sys.stderr)
        return 1
    print("stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    start = verbs.add_parser("up", help="start everything; stop it on Ctrl-C or SIGTERM")
    stop = verbs.add_parser("down", help="stop what `up` started")
    for verb in (start, stop):
        verb.add_argument("--dir", default=str(REPO / "work" / "stack"), help="the work folder")
    start.add_argument(
        "--config",
        default=os.environ.get("DCP_CDC_CONFIG", str(REPO / "conf" / "local.toml")),
        help="the dcp-cdc configuration the DAGs are made from ($DCP_CDC_CONFIG of every "
        "component; default: $DCP_CDC_CONFIG, else conf/local.toml)",
    )
    start.add_argument("--dags", default=str(REPO / "dags"), help="the DAGs folder")
    start.add_argument(
        "--database",
        choices=("postgres", "sqlite"),
        default="postgres",
        help="Airflow's metadata database (default postgres; sqlite: one file, a fallback "
        "for a machine without PostgreSQL)",
    )
    start.add_argument("--api-port", type=int, default=8080, help="0: a free port")
    start.add_argument("--workers", type=int, default=2, help="Spark workers")
    start.add_argument("--worker-cores", type=int, default=1, help="cores each worker offers")
    start.add_argument("--worker-memory", default="1g", help="memory each worker offers")
    args = parser.parse_args(argv)
    return up(args) if args.verb == "up" else down(args)


if __name__ == "__main__":
    sys.exit(main())
