"""What the W&B tracker's two choices cost: W&B's own checksum of a `file://` reference artifact against none (the
tracker logs checkpoints without it; our sha256 is in the metadata), and how long `wandb.init` waits for a server
that does not answer, with the tracker's timeout and with wandb's default.

Run: python bench/wandb_tracker_costs.py --mib 256             (the checksum figure, a few seconds)
     python bench/wandb_tracker_costs.py --mib 0 --down          (+ the down-server waits, about 2 minutes)
"""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
import time
from pathlib import Path

import wandb

from nemotron.tracking.wandb_tracker import INIT_TIMEOUT_S


def checksum_cost(mib: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "checkpoint"
        ckpt.mkdir()
        for i in range(4):  # a checkpoint's few large shards
            (ckpt / f"shard-{i}.safetensors").write_bytes(os.urandom(mib * 2**20 // 4))
        for checksum in (False, True, False, True):  # alternate, so other load skews both alike
            began = time.perf_counter()
            art = wandb.Artifact("bench", type="policy")
            art.add_reference(ckpt.as_uri(), checksum=checksum)
            took = time.perf_counter() - began
            print(
                f"add_reference checksum={checksum!s:5}  {mib} MiB  {took:6.3f} s  ({took / mib * 1024:.2f} s/GiB)"
            )


def down_server_wait(timeout_s: float | None) -> None:
    silent = socket.socket()  # accepts connections (the kernel's backlog) and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    os.environ["WANDB_BASE_URL"] = f"http://127.0.0.1:{silent.getsockname()[1]}"
    os.environ.setdefault("WANDB_API_KEY", "x" * 40)
    settings = (
        wandb.Settings(silent=True)
        if timeout_s is None
        else wandb.Settings(silent=True, init_timeout=timeout_s)
    )
    with tempfile.TemporaryDirectory() as tmp:
        began = time.perf_counter()
        try:
            wandb.init(project="bench", mode="online", dir=tmp, reinit="create_new", settings=settings)
            outcome = "started (unexpected)"
        except wandb.Error as e:
            outcome = type(e).__name__
        label = "wandb default" if timeout_s is None else f"init_timeout={timeout_s}"
        print(
            f"wandb.init against a silent server, {label}: {outcome} after {time.perf_counter() - began:.1f} s"
        )
    silent.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--mib", type=int, default=256, help="checkpoint size for the checksum figure (0: skip)"
    )
    parser.add_argument("--down", action="store_true", help="also time wandb.init against a silent server")
    args = parser.parse_args()
    if args.mib:
        checksum_cost(args.mib)
    if args.down:
        down_server_wait(INIT_TIMEOUT_S)
        down_server_wait(None)


if __name__ == "__main__":
    main()
