"""docs/benchmarks.md's reward-server batching table is what scripts/reward_server_figures.py wrote: rendered
from docs/figures/reward_server_batching.json, which records the date, the CPU, the load and the command
beside the figures. A hand edit of the table, or a figures file the page does not show, fails here."""

from __future__ import annotations

from typing import Any


def test_the_page_shows_the_recorded_figures(script_figures: Any) -> None:
    script, record = script_figures(
        "reward_server_figures", "date", "cpu", "cores", "load", "command", "bench", "runs"
    )
    assert record["command"].startswith("python scripts/reward_server_figures.py")
    assert {(r["scorer"], r["mode"]) for r in record["rows"]} == set(script.LABELS)


def test_summary_takes_the_middle_run_and_the_range(script_module: Any) -> None:
    script = script_module("reward_server_figures")

    def run(cpu_dynamic: float, speedup: float) -> dict[str, object]:
        rows = [
            {
                "scorer": s,
                "mode": m,
                "throughput_rps": cpu_dynamic if (s, m) == ("gpt2-cpu", "dynamic batching") else 100.0,
                "p50_ms": 1.0,
                "p99_ms": 2.0,
                "mean_batch_size": 1.0,
                "server_cpu_ms": 0.1,
                "client_cpu_ms": 0.01,
            }
            for s, m in script.LABELS
        ]
        return {"results": rows, "speedup": {"gpt2-cpu": speedup, "fixed-cost": 30.0}}

    summary = script.summarise([run(900.0, 9.0), run(500.0, 5.0), run(700.0, 7.0)])
    dynamic = next(r for r in summary["rows"] if (r["scorer"], r["mode"]) == ("gpt2-cpu", "dynamic batching"))
    assert (dynamic["throughput_rps"], dynamic["throughput_min"], dynamic["throughput_max"]) == (
        700.0,
        500.0,
        900.0,
    )
    assert summary["speedups"]["gpt2-cpu"] == [5.0, 7.0, 9.0]
