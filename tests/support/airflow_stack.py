"""The local Airflow deployment of ``build-support/local_stack.py`` for tests: started as the
user starts it (its ``up`` command, a child process), read through Airflow's REST API
(``/api/v2``, a bearer token from the simple auth manager's ``/auth/token``), and stopped with
everything it started, also when the test fails."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "build-support" / "local_stack.py"
FINISHED = ("success", "failed")


def stack_settings(capture: Mapping[str, str], spark_conf: Mapping[str, str] = {}) -> str:
    """The TOML sections of a configuration whose DAG runs under :func:`local_stack`: the
    bucket's capture section, jobs small enough for its two 1-core workers (plus
    ``spark_conf``), and a DAG that runs only when triggered, with no retries."""
    from pipelines.lake.spark_session import C1_ONLY

    conf = {
        "spark.cores.max": "2",
        "spark.executor.cores": "1",
        "spark.executor.memory": "512m",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.pyspark.python": sys.executable,
        "spark.driver.extraJavaOptions": f"{C1_ONLY} -XX:+UseSerialGC",
        "spark.executor.extraJavaOptions": f"{C1_ONLY} -XX:+UseSerialGC",
        **spark_conf,
    }
    lines = ["[buckets.capture]", *(f'{k} = "{v}"' for k, v in capture.items())]
    lines += ["[spark.conf]", *(f'"{k}" = "{v}"' for k, v in conf.items())]
    lines += ["[airflow]", 'schedule = ""', "retries = 0", "execution_timeout_minutes = 20"]
    return "\n".join([*lines, 'driver_memory = "1g"', ""])


@dataclass
class AirflowApi:
    """Airflow's public REST API as the stack's admin user."""

    url: str
    token: str

    @classmethod
    def login(cls, url: str, user: str, password: str) -> AirflowApi:
        answer = _request("POST", f"{url}/auth/token", {"username": user, "password": password})
        return cls(url, answer["access_token"])

    def call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        return _request(method, f"{self.url}/api/v2{path}", body, token=self.token)

    def wait_for_dag(self, dag_id: str, seconds: float = 300) -> None:
        """Until the DAG processor has parsed ``dag_id`` into the database."""
        deadline = time.monotonic() + seconds
        while True:
            try:
                self.call("GET", f"/dags/{dag_id}")
                return
            except urllib.error.HTTPError as error:
                if error.code != 404 or time.monotonic() > deadline:
                    raise
            time.sleep(2)

    def trigger(self, dag_id: str, conf: Mapping[str, Any] | None = None) -> str:
        """Unpause ``dag_id`` and start a run now; the run's id."""
        self.call("PATCH", f"/dags/{dag_id}", {"is_paused": False})
        run = self.call(
            "POST", f"/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf or {}}
        )
        return str(run["dag_run_id"])

    def wait_for_run(self, dag_id: str, run_id: str, seconds: float) -> dict[str, Any]:
        deadline = time.monotonic() + seconds
        while True:
            run: dict[str, Any] = self.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}")
            if run["state"] in FINISHED or time.monotonic() > deadline:
                return run
            time.sleep(5)

    def task_states(self, dag_id: str, run_id: str) -> dict[str, str | None]:
        found = self.call("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")
        return {ti["task_id"]: ti["state"] for ti in found["task_instances"]}


def _request(
    method: str, url: str, body: Mapping[str, Any] | None, *, token: str | None = None
) -> Any:
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.load(response)


@dataclass
class Stack:
    folder: Path
    info: dict[str, Any]
    api: AirflowApi

    def task_logs(self, chars: int = 4000) -> str:
        """The tails of every task's log (Airflow writes them under its home)."""
        home = Path(self.info["password_file"]).parent
        tails = []
        for log in sorted((home / "logs").rglob("*.log")):
            tails.append(f"--- {log.relative_to(home)}\n{log.read_text(errors='replace')[-chars:]}")
        return "\n".join(tails)


@contextmanager
def local_stack(
    folder: Path, *, config: Path, env: Mapping[str, str], database: str = "postgres"
) -> Iterator[Stack]:
    """``local_stack.py up`` in ``folder`` until it is ready; SIGTERM (its ``down``) at the end,
    which stops every process it started."""
    folder.mkdir(parents=True, exist_ok=True)
    state = folder / "stack.json"
    out = (folder / "up.log").open("wb")
    command = [sys.executable, str(SCRIPT), "up", "--dir", str(folder), "--config", str(config)]
    command += ["--api-port", "0", "--database", database]
    process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=dict(env))
    try:
        deadline = time.monotonic() + 900
        while not state.exists():
            log = (folder / "up.log").read_text(errors="replace")
            assert process.poll() is None, f"local_stack up exited: {log[-5000:]}"
            assert time.monotonic() < deadline, f"local_stack up not ready in 900 s: {log[-5000:]}"
            time.sleep(1)
        info = json.loads(state.read_text())
        password = json.loads(Path(info["password_file"]).read_text())[info["user"]]
        yield Stack(folder, info, AirflowApi.login(info["api_url"], info["user"], password))
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=300)
        except subprocess.TimeoutExpired as error:
            process.kill()  # what it started then stays: say so
            process.wait()
            raise AssertionError(
                f"local_stack up did not stop in 300 s; see {folder}/up.log"
            ) from error
        out.close()
