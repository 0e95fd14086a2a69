"""One sibling server per node under torchrun: local rank 0 starts it, the node's other ranks use it, and it
stops only once every rank has finished with it."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from nemotron.core.paths import shipped_root
from nemotron.reward.client import RewardClient, RewardServerError
from nemotron.reward.sibling import NodeShare, sibling_server

TORCHRUN = {
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "TORCHELASTIC_RUN_ID": "abc",
    "TORCHELASTIC_RESTART_COUNT": "0",
}


def test_share_comes_from_torchrun_and_names_node_run_and_attempt(tmp_path: Path) -> None:
    env = {**TORCHRUN, "LOCAL_RANK": "1", "NEMOTRON_JOB_DIR": str(tmp_path)}
    share = NodeShare.from_env("chat_server", env)
    assert share == NodeShare(tmp_path / "siblings" / "chat_server-node1-abc-0-0.json", 1, 2)
    assert not share.owner
    assert NodeShare.from_env("chat_server", {**env, "LOCAL_WORLD_SIZE": "1"}) is None  # one rank: its own
    assert (
        NodeShare.from_env("chat_server", {k: v for k, v in env.items() if k != "NEMOTRON_JOB_DIR"}) is None
    )
    restarted = NodeShare.from_env("chat_server", {**env, "TORCHELASTIC_RESTART_COUNT": "1"})
    assert (
        restarted is not None and restarted.path != share.path
    )  # never the address of a dead attempt's server


def test_a_rank_without_an_address_fails_naming_the_file(tmp_path: Path) -> None:
    share = NodeShare(tmp_path / "siblings" / "server-node0-x.json", 1, 2)
    with (
        pytest.raises(RewardServerError, match="local rank 0 did not publish"),
        sibling_server("unused", share=share, startup_timeout=0.1),
    ):
        pass


@pytest.mark.slow
def test_two_local_ranks_share_one_server_started_by_local_rank_0(tmp_path: Path) -> None:
    model = shipped_root() / "tiny" / "reward_model"
    path = tmp_path / "siblings" / "server-node0-run.json"
    log = tmp_path / "server.log"
    urls: dict[int, str] = {}
    owner_left = threading.Event()
    errors: list[BaseException] = []
    published: list[str] = []

    def rank(local_rank: int) -> None:
        try:
            with sibling_server(model, log_path=log, share=NodeShare(path, local_rank, 2)) as (url, token):
                urls[local_rank] = url
                published.append(oct(path.stat().st_mode & 0o777)) if local_rank == 0 else None
                client = RewardClient(url, token, timeout=30, retries=0)
                if local_rank == 1:
                    # the owner has finished; the server must still answer this rank until it says it is done
                    while not (owner_left.is_set() or errors):
                        time.sleep(0.05)
                    time.sleep(0.3)
                assert len(client.score_tokens([[3, 4, 5]])) == 1
            if local_rank == 0:
                urls[-1] = "owner returned"
        except BaseException as e:  # surfaced below
            errors.append(e)

    owner = threading.Thread(target=rank, args=(0,))
    owner.start()
    peer = threading.Thread(target=rank, args=(1,))
    peer.start()
    # the owner's `with` body ends at once; its exit waits for the peer's done mark
    deadline = time.monotonic() + 120
    while 0 not in urls and not errors and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    owner_left.set()
    owner.join(180)
    peer.join(180)
    assert not errors, errors
    assert urls[0] == urls[1] and urls[-1] == "owner returned"
    assert log.read_text().count("serving on") == 1  # one server process for the two ranks
    assert sorted(published) == ["0o600"]  # the address file carries the token
    assert not list(path.parent.iterdir())  # address and done marks removed with the server
