"""A loopback stub of the Lepton workspace API: the endpoints leptonai's APIClient calls for NeMo-Run's
LeptonExecutor (node groups, jobs, replicas, logs) and LeptonRayJob (rayclusters, and Ray's job API behind a
cluster's dashboard path: version, working_dir packages, jobs, stop, logs), recording every request.

Jobs named `data-mover-*` (NeMo-Run copies the job dir with them) complete at once; other jobs are Running
until the test sets their state. Point the SDK at it with LEPTON_WORKSPACE_URL/_ID/_TOKEN (`stub.env`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

NODE_GROUP = {"name": "my-node-group", "id": "ng-0123"}
NODES = ["node-a", "node-b"]
TOKEN = "stub-token-0123456789"
RAY_VERSION = "2.60.0"


@dataclass
class Recorded:
    method: str
    path: str
    body: Any
    authorization: str


@dataclass
class LeptonStub:
    url: str = ""
    requests: list[Recorded] = field(default_factory=list)
    states: dict[str, str] = field(default_factory=dict)
    logs: dict[str, str] = field(default_factory=dict)
    # a job of several pods: each replica's log (replica i is `<job>-<i>-abcde`), and how many pods failed
    replica_logs: dict[str, list[str]] = field(default_factory=dict)
    failed: dict[str, int] = field(default_factory=dict)
    clusters: dict[str, dict[str, Any]] = field(default_factory=dict)  # RayCluster id -> its spec
    packages: dict[str, bytes] = field(default_factory=dict)  # Ray working_dir packages, by name
    ray_jobs: dict[str, dict[str, Any]] = field(default_factory=dict)  # submission id -> job details
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def env(self) -> dict[str, str]:
        return {
            "LEPTON_WORKSPACE_URL": self.url,
            "LEPTON_WORKSPACE_ID": "stubws",
            "LEPTON_WORKSPACE_TOKEN": TOKEN,
        }

    def created_jobs(self) -> list[dict[str, Any]]:
        return [r.body for r in self.requests if r.method == "POST" and r.path == "/jobs"]

    def finish(self, submission_id: str, returncode: int, log: str) -> None:
        """The Ray job's entrypoint ended with `returncode` after writing `log`, as Ray's job supervisor reports it:
        SUCCEEDED on 0, else FAILED with the exit code in its message; the log stays readable while the cluster
        does."""
        job = self.ray_jobs[submission_id]
        job["status"] = "SUCCEEDED" if returncode == 0 else "FAILED"
        job["message"] = (
            "Job finished successfully."
            if returncode == 0
            else f"Job entrypoint command failed with exit code {returncode}, last available logs: {log[-200:]}"
        )
        self.logs[submission_id] = log

    def calls(self, method: str, prefix: str) -> list[Recorded]:
        return [r for r in self.requests if r.method == method and r.path.startswith(prefix)]


def _job(job_id: str, state: str, spec: dict[str, Any] | None = None, failed: int = 0) -> dict[str, Any]:
    running = 1 if state == "Running" else 0
    return {
        "metadata": {"id": job_id, "name": job_id},
        "spec": spec or {},
        "status": {"state": state, "ready": running, "active": running, "failed": failed},
    }


def _handler(stub: LeptonStub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _reply(self, payload: Any, status: int = 200, raw: bytes | None = None) -> None:
            body = raw if raw is not None else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json" if raw is None else "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _record(self) -> tuple[str, Any]:
            path = urlsplit(self.path).path
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:  # a Ray working_dir package (zip bytes)
                body = raw
            with stub.lock:
                stub.requests.append(
                    Recorded(self.command, path, body, self.headers.get("Authorization", ""))
                )
            return path, body

        def do_GET(self) -> None:
            path, _ = self._record()
            parts = path.strip("/").split("/")
            if parts[0] == "rayclusters":
                return self._raycluster_get(parts)
            if path == "/dedicated-node-groups":
                return self._reply([{"metadata": NODE_GROUP, "spec": {}, "status": {}}])
            if parts[0] == "dedicated-node-groups" and parts[-1] == "nodes":
                return self._reply(
                    [{"metadata": {"id": n}, "spec": {"unschedulable": False}, "status": None} for n in NODES]
                )
            if parts[0] == "jobs" and len(parts) == 2:
                state = stub.states.get(parts[1])
                if state is None:
                    return self._reply({"error": "not found"}, 404)
                return self._reply(_job(parts[1], state, failed=stub.failed.get(parts[1], 0)))
            if parts[0] == "jobs" and parts[-1] == "replicas":
                ids = [f"{parts[1]}-{i}-abcde" for i in range(len(stub.replica_logs.get(parts[1], [""])))]
                return self._reply([{"metadata": {"id": i}, "id": i} for i in ids])
            if parts[0] == "jobs" and parts[-1] == "log":
                if parts[1] in stub.replica_logs:
                    index = int(parts[3].removeprefix(f"{parts[1]}-").split("-")[0])
                    return self._reply(None, raw=stub.replica_logs[parts[1]][index].encode())
                return self._reply(None, raw=stub.logs.get(parts[1], "").encode())
            return self._reply({"error": f"no route {path}"}, 404)

        def do_POST(self) -> None:
            path, body = self._record()
            parts = path.strip("/").split("/")
            if path == "/rayclusters":
                stub.clusters[body["metadata"]["id"]] = body
                return self._reply({})
            if parts[0] == "rayclusters" and parts[2:4] == ["dashboard", "api"]:
                return self._ray_post(parts[4:], body)
            if path == "/jobs":
                job_id = body["metadata"]["id"]
                stub.states[job_id] = "Completed" if job_id.startswith("data-mover") else "Running"
                return self._reply(_job(job_id, stub.states[job_id], body.get("spec")))
            return self._reply({"error": f"no route {path}"}, 404)

        def do_PATCH(self) -> None:
            self._record()
            return self._reply({})

        def do_PUT(self) -> None:
            path, body = self._record()
            stub.packages[path.rsplit("/", 1)[-1]] = body
            return self._reply({})

        def _raycluster_get(self, parts: list[str]) -> None:
            name = parts[1] if len(parts) > 1 else ""
            if len(parts) == 2:
                if name not in stub.clusters:
                    return self._reply({"code": "not_found", "message": f"raycluster {name} not found"}, 404)
                return self._reply({**stub.clusters[name], "status": {"state": "Ready"}})
            api = parts[4:]  # rayclusters/<name>/dashboard/api/...
            if name not in stub.clusters:  # its dashboard went with it
                return self._reply({"code": "not_found", "message": f"raycluster {name} not found"}, 404)
            if api == ["version"]:
                return self._reply({"version": "4", "ray_version": RAY_VERSION, "ray_commit": "stub"})
            if api[:1] == ["packages"]:
                return self._reply({}, 200 if api[-1] in stub.packages else 404)
            if api == ["jobs"]:
                return self._reply(list(stub.ray_jobs.values()))
            if api[:1] == ["jobs"] and len(api) == 2:
                return self._reply(stub.ray_jobs[api[1]])
            if api[:1] == ["jobs"] and api[-1] == "logs":
                return self._reply({"logs": stub.logs.get(api[1], "")})
            return self._reply({"error": f"no route {parts}"}, 404)

        def _ray_post(self, api: list[str], body: Any) -> None:
            if api == ["jobs"]:
                sid = body["submission_id"]
                stub.ray_jobs[sid] = {
                    "type": "SUBMISSION",
                    "job_id": None,
                    "submission_id": sid,
                    "status": "RUNNING",
                    "entrypoint": body["entrypoint"],
                    "runtime_env": body.get("runtime_env"),
                }
                return self._reply({"job_id": sid, "submission_id": sid})
            if api[:1] == ["jobs"] and api[-1] == "stop":
                stub.ray_jobs[api[1]]["status"] = "STOPPED"
                return self._reply({"stopped": True})
            return self._reply({"error": f"no route {api}"}, 404)

        def do_DELETE(self) -> None:
            path, _ = self._record()
            parts = path.strip("/").split("/")
            if parts[0] == "rayclusters":
                stub.clusters.pop(parts[1], None)
                return self._reply({})
            job_id = parts[1]
            if stub.states.get(job_id) == "Running":
                stub.states[job_id] = "Stopped"
            return self._reply({})

    return Handler


@pytest.fixture
def lepton_api() -> Iterator[LeptonStub]:
    stub = LeptonStub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(stub))
    server.daemon_threads = True
    stub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield stub
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def nemotron(home: Path, lepton_api: LeptonStub, run_cli: Any) -> Any:
    """`run_cli` pointed at the stub: `python -m nemotron ARGS` in the test's own $NEMOTRON_HOME."""

    def run(*args: str) -> Any:
        return run_cli(*args, env=lepton_api.env, timeout=180)

    return run


@pytest.fixture
def submitted(nemotron: Any) -> Callable[..., str]:
    """`nemotron steps run ARGS` against the stub, which must succeed: the job id it printed last."""

    def run(*args: str) -> str:
        done = nemotron("steps", "run", *args)
        assert done.code == 0, done.err[-4000:]
        return str(done.out.strip().splitlines()[-1])

    return run
