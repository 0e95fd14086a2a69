"""Where a server step says it is: one entry per node under servers/, node 0's also as server.json."""

from __future__ import annotations

import json
from pathlib import Path

from nemotron.reward.address import Node, announce_server, announced_servers, reachable_url


def test_node_comes_from_srun_and_defaults_to_one_node() -> None:
    srun = {"SLURM_NODEID": "1", "SLURM_NNODES": "2", "SLURMD_NODENAME": "node2"}
    assert Node.from_env(srun) == Node(1, 2, "node2")
    alone = Node.from_env({})
    assert (alone.index, alone.count) == (0, 1) and alone.name


def test_a_wildcard_bind_is_announced_under_the_node_name_and_loopback_stays_loopback() -> None:
    node = Node(1, 2, "node2")
    assert reachable_url("http://0.0.0.0:5555", node) == "http://node2:5555"
    assert reachable_url("http://[::]:5555", node) == "http://node2:5555"
    assert reachable_url("http://127.0.0.1:5555", node) == "http://127.0.0.1:5555"


def test_each_node_writes_its_own_entry_and_only_node_0_writes_server_json(tmp_path: Path) -> None:
    second = announce_server(tmp_path, "http://0.0.0.0:5555", Node(1, 2, "node2"), model="rm", mode="reward")
    assert not (tmp_path / "server.json").exists()  # a client of server.json waits for node 0
    first = announce_server(tmp_path, "http://0.0.0.0:5555", Node(0, 2, "node1"), model="rm", mode="reward")
    assert json.loads((tmp_path / "server.json").read_text()) == first
    assert announced_servers(tmp_path) == [first, second]
    assert [(e["url"], e["node_index"], e["nodes"]) for e in announced_servers(tmp_path)] == [
        ("http://node1:5555", 0, 2),
        ("http://node2:5555", 1, 2),
    ]
    assert sorted(p.name for p in (tmp_path / "servers").iterdir()) == [
        "node-0.json",
        "node-1.json",
    ]  # no temp files
