"""Where a running server step says it is. A server step runs one process per node, and each writes
`<job dir>/servers/node-<i>.json` (i: the node's index in the job); node 0's is also `<job dir>/server.json`,
the one file a one-node job (every local run) has. Each file is replaced atomically once the server answers."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

SERVER_FILE = "server.json"
SERVERS_DIR = "servers"
_WILDCARD = {"0.0.0.0", "::", "[::]", ""}


@dataclass(frozen=True)
class Node:
    """This process's node within its job: index, how many, and the name other nodes reach it by."""

    index: int = 0
    count: int = 1
    name: str = "localhost"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Node:
        """srun sets SLURM_NODEID, SLURM_NNODES and SLURMD_NODENAME for every task; elsewhere one node."""
        env: Mapping[str, str] = os.environ if environ is None else environ
        name = env.get("SLURMD_NODENAME") or socket.gethostname()
        return cls(int(env.get("SLURM_NODEID", "0")), int(env.get("SLURM_NNODES", "1")), name)


def reachable_url(url: str, node: Node) -> str:
    """A server bound to every interface (0.0.0.0) is announced under its node's name, so that clients on
    other nodes can use the URL; a loopback server stays loopback (reachable from its own node only)."""
    parts = urlsplit(url)
    if (parts.hostname or "") not in _WILDCARD:
        return url
    return urlunsplit(parts._replace(netloc=f"{node.name}:{parts.port}"))


def announce_server(job_dir: Path, url: str, node: Node | None = None, **info: Any) -> dict[str, Any]:
    """Write this node's entry (url, node, node_index, nodes, pid and `info`) and return it."""
    node = node or Node.from_env()
    entry = {
        "url": reachable_url(url, node),
        "node": node.name,
        "node_index": node.index,
        "nodes": node.count,
        "pid": os.getpid(),
        **info,
    }
    targets = [job_dir / SERVERS_DIR / f"node-{node.index}.json"] + (
        [job_dir / SERVER_FILE] if node.index == 0 else []
    )
    for path in targets:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(entry))
        os.replace(tmp, path)
    return entry


def announced_servers(job_dir: Path) -> list[dict[str, Any]]:
    """Every entry written so far, by node index. The job's servers are all up when there are `nodes` of them."""
    entries = [json.loads(p.read_text()) for p in (job_dir / SERVERS_DIR).glob("node-*.json")]
    return sorted(entries, key=lambda e: int(e["node_index"]))
