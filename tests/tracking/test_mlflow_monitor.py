"""MLflow's own system-metrics monitor says nothing of its own when the server goes: the job's one tracker warning
(tracking.fanout, naming `jobs sync`) is the only one. A real SystemMetricsMonitor against a port nothing listens on,
beside one started without our tracker (the control: it does warn)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import logging, sys, time
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor
    from nemotron.config.stepconfig import MlflowTracking
    from nemotron.tracking.mlflow_tracker import MlflowTracker

    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(name)s: %(message)s")
    uri = sys.argv[1]
    if sys.argv[2] == "ours":
        tracker = MlflowTracker(MlflowTracking(), uri)
        tracker.run_id, tracker._reopened = "0" * 32, False
        tracker._start_system_metrics()
        monitor = tracker._system
    else:
        monitor = SystemMetricsMonitor("0" * 32, sampling_interval=0.2, tracking_uri=uri)
        monitor.start()
    monitor._process.join(60)
    print("stopped" if not monitor._process.is_alive() else "still running")
    """
)


def _run(how: str) -> subprocess.CompletedProcess[str]:
    with socket.socket() as s:  # a port nothing listens on: the server is gone
        s.bind(("127.0.0.1", 0))
        uri = f"http://127.0.0.1:{s.getsockname()[1]}"
    env = {
        **os.environ,
        "MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL": "0.2",
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
    }
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, uri, how], capture_output=True, text=True, env=env, timeout=120
    )


def test_the_monitor_stops_without_a_warning_of_its_own_when_the_server_is_gone() -> None:
    control = _run("plain")
    assert control.stdout.strip() == "stopped", control.stderr[-2000:]
    assert "Failed to get mlflow run" in control.stderr  # what MLflow says on its own: the test can fail

    ours = _run("ours")
    assert ours.stdout.strip() == "stopped", ours.stderr[-2000:]
    assert "Failed to" not in ours.stderr and "Traceback" not in ours.stderr, ours.stderr
