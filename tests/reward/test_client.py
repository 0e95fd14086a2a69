"""The reward client: retries with backoff until a late server comes up, clear errors naming the URL."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from nemotron.core.procs import free_port
from nemotron.errors import UserError
from nemotron.reward.client import RequestRejected, RewardClient, RewardServerError, normalize_url, wait_ready
from nemotron.reward.scorer import Scorer
from nemotron.reward.server import serve
from nemotron.reward.transport import HTTPSettings, ServerHandle


def length_scorer(sentences: list[str]) -> list[float]:
    return [float(len(s)) for s in sentences]


class FakeServer:
    """A loopback HTTP server answering every request with a fixed status and body; counts requests."""

    def __init__(self, status: int, body: bytes) -> None:
        self.count = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                fake.count += 1
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def garbage_server() -> Iterator[FakeServer]:
    server = FakeServer(200, b"hello, I am not KServe")
    yield server
    server.close()


def test_scores_in_order() -> None:
    with serve(length_scorer) as handle:
        client = RewardClient(handle.url)
        assert client.score(["a", "abc", "ab"]) == [1.0, 3.0, 2.0]
        assert client.score([]) == []


def test_score_tokens_against_a_token_scorer() -> None:
    from nemotron.reward.scorer import Scorer

    scorer = Scorer(length_scorer, score_tokens=lambda rows: [float(sum(r)) for r in rows], vocab_size=100)
    with serve(scorer) as handle:
        # Rows of different lengths are padded with 0 and cut back by sequence_lengths on the server.
        assert RewardClient(handle.url).score_tokens([[1, 2, 3], [40], [5, 6]]) == [6.0, 40.0, 11.0]


def test_reconnects_when_the_server_drops_an_idle_keep_alive_connection() -> None:
    with serve(length_scorer, HTTPSettings(read_timeout_s=0.2)) as handle:
        client = RewardClient(handle.url, retries=0)  # no retries: the reconnect must not need one
        assert client.score(["ab"]) == [2.0]
        time.sleep(0.5)  # the server closes the idle connection after 0.2 s
        assert client.score(["abc"]) == [3.0]


def test_retries_until_a_late_server_comes_up() -> None:
    port = free_port()
    started: list[ServerHandle] = []
    timer = threading.Timer(0.7, lambda: started.append(serve(length_scorer, HTTPSettings(port=port))))
    timer.start()
    try:
        begun = time.monotonic()
        # Backoff 0.1 s doubling (x0.5-1 jitter): 7 retries wait up to 12.7 s, far more than the 0.7 s delay.
        assert RewardClient(f"127.0.0.1:{port}", retries=7, backoff=0.1).score(["abcd"]) == [4.0]
        assert time.monotonic() - begun >= 0.6  # it really had to wait for the server
    finally:
        timer.join()
        for handle in started:
            handle.stop()


def test_clear_error_naming_the_url_when_the_server_is_down() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RewardServerError) as caught:
        RewardClient(url, retries=2, backoff=0.01).score(["a"])
    message = str(caught.value)
    assert url in message and "cannot connect" in message and "after 3 attempts" in message


def test_garbage_answer_is_a_clear_error_and_not_retried(garbage_server: FakeServer) -> None:
    with pytest.raises(RewardServerError, match="invalid inference response") as caught:
        RewardClient(garbage_server.url, retries=3, backoff=0.01).score(["a"])
    assert garbage_server.url in str(caught.value)
    assert garbage_server.count == 1


def test_5xx_is_retried_then_reported() -> None:
    server = FakeServer(503, b'{"error": "overloaded"}')
    try:
        with pytest.raises(RewardServerError, match=r"HTTP 503: overloaded \(after 3 attempts\)") as caught:
            RewardClient(server.url, retries=2, backoff=0.01).score(["a"])
        assert server.count == 3
        assert caught.value.status == 503
    finally:
        server.close()


def test_4xx_is_not_retried() -> None:
    server = FakeServer(401, b'{"error": "wrong token"}')
    try:
        with pytest.raises(RewardServerError, match="HTTP 401: wrong token") as caught:
            RewardClient(server.url, retries=3, backoff=0.01).score(["a"])
        assert server.count == 1 and caught.value.exit_code == 3  # the service is misconfigured
    finally:
        server.close()


def test_400_is_bad_input_with_the_servers_reason() -> None:
    """The server read the request and refuses its content: exit 2, as run_step maps a UserError."""
    server = FakeServer(400, b'{"error": "sequence 0 has a token id outside [0, 100)"}')
    try:
        with pytest.raises(RequestRejected) as caught:
            RewardClient(server.url, retries=3, backoff=0.01).score(["a"])
        assert server.count == 1
        assert isinstance(caught.value, UserError) and isinstance(caught.value, RewardServerError)
        assert caught.value.exit_code == 2 and caught.value.status == 400
        assert caught.value.render() == (
            f"the reward model at {server.url} refused the request as bad input (HTTP 400): "
            "sequence 0 has a token id outside [0, 100)"
        )
    finally:
        server.close()


def test_wrong_number_of_rewards_is_garbage() -> None:
    with serve(length_scorer) as handle:
        client = RewardClient(handle.url)
        with pytest.raises(RewardServerError, match="expected 2 float rewards, got 1"):
            client._rewards(
                {}, b'{"outputs":[{"name":"rewards","datatype":"FP32","shape":[1],"data":[1.0]}]}', 2
            )


def test_wait_ready() -> None:
    with serve(length_scorer) as handle:
        wait_ready(handle.url, timeout=5)
    url = f"http://127.0.0.1:{free_port()}"
    begun = time.monotonic()
    with pytest.raises(RewardServerError, match=r"not ready after 0\.5 s") as caught:
        wait_ready(url, timeout=0.5, interval=0.05)
    assert url in str(caught.value)
    assert time.monotonic() - begun < 3


def test_normalize_url() -> None:
    assert normalize_url("localhost:8000") == "http://localhost:8000"
    assert normalize_url("https://h:1/") == "https://h:1"


def _spans(client: RewardClient, sizes: list[int], padded: bool) -> list[tuple[int, int]]:
    """[start, stop) of each request the client sends for rows of these data sizes (its `_stop`, in turn)."""
    spans: list[tuple[int, int]] = []
    while (start := spans[-1][1] if spans else 0) < len(sizes):
        spans.append((start, client._stop(sizes, start, padded)))
    return spans


def test_requests_are_cut_at_the_row_and_byte_budgets() -> None:
    client = RewardClient("http://127.0.0.1:1")
    client.max_request_rows, client.max_request_bytes = 3, 100
    sizes = [40, 16, 24, 80, 8]
    # padded (token rows): a request costs its rows x its widest row; 2 x 40 fits, 3 x 40 = 120 does not, 2 x 80
    # neither: [0, 2) [2, 3) [3, 4) [4, 5)
    assert _spans(client, sizes, padded=True) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    # unpadded (sentences): the sum; 40 + 16 + 24 = 80 fits, + 80 does not; 80 + 8 = 88 fits
    assert _spans(client, sizes, padded=False) == [(0, 3), (3, 5)]
    client.max_request_rows = 2  # now the rows bind first: 40 + 16, then 24 + 80 > 100 alone
    assert _spans(client, sizes, padded=False) == [(0, 2), (2, 3), (3, 5)]
    assert _spans(client, [500, 1], padded=True) == [(0, 1), (1, 2)]  # a row over the budget goes alone
    assert _spans(client, [], padded=True) == []


def test_a_step_of_many_long_rows_is_scored_within_the_servers_default_budgets() -> None:
    """300 rows of up to 4,000 token ids: 1.2 M ids, 9.6 MB as int64, over the server's default 8 MiB body and
    2**20 ids per request. It was one request, refused with 413 before the body was read, which the client saw
    as a reset connection and retried until it gave up: exit 3, "reward server unreachable"."""
    from nemotron.reward.scorer import Scorer

    rows = [[(i + j) % 50 for j in range(4000 - i % 7)] for i in range(300)]
    scorer = Scorer(length_scorer, score_tokens=lambda batch: [float(sum(r)) for r in batch], vocab_size=50)
    with serve(scorer) as handle, RewardClient(handle.url, retries=0) as client:
        assert client.score_tokens(rows) == [float(sum(r)) for r in rows]
        # sentences the same way: 2,000 of 5,000 characters, 10 MB of text
        assert client.score([f"{i:05d}" * 1000 for i in range(2000)]) == [5000.0] * 2000


def test_a_server_set_below_the_clients_budgets_scores_every_row(caplog: pytest.LogCaptureFixture) -> None:
    """rm/serve with server.max_body_bytes=1 MiB under a client that cuts at 4 MiB: a request over the server's
    limit is answered 413, the client halves its budgets (rows and bytes) and sends it again, once per halving.
    By hand: 1,000 sentences of 4,000 characters are 4,004,000 bytes of data (4 + 4,000 a row), one request under
    4 MiB; 413, then 500 rows (2,002,000 bytes): 413, then 250 rows (1,001,000 bytes), under 1 MiB with the
    request's head. It was an endless "connection reset" before: exit 3, "reward server unreachable"."""
    with (
        serve(length_scorer, HTTPSettings(max_body_bytes=1 << 20)) as handle,
        RewardClient(handle.url, retries=0) as client,
    ):
        assert client.score(["y" * 4000] * 1000) == [4000.0] * 1000
        assert (client.max_request_rows, client.max_request_bytes) == (250, 1_001_000)
        halvings = [r.getMessage() for r in caplog.records if "as too large" in r.getMessage()]
        assert len(halvings) == 2 and "the limit is 1048576" in halvings[0], halvings
    # token rows, padded to the longest, with a fresh client: 300 rows of 1,000 ids are 2,400,000 bytes, one
    # request: 413; 150 rows (1,200,000 bytes): 413; 75 rows (600,000 bytes) go
    rows = [[i % 50] * 1000 for i in range(300)]
    scorer = Scorer(length_scorer, score_tokens=lambda b: [float(sum(r)) for r in b], vocab_size=50)
    with (
        serve(scorer, HTTPSettings(max_body_bytes=1 << 20)) as handle,
        RewardClient(handle.url, retries=0) as client,
    ):
        assert client.score_tokens(rows) == [float(sum(r)) for r in rows]
        assert (client.max_request_rows, client.max_request_bytes) == (75, 600_000)


def test_a_single_row_over_the_servers_limit_is_an_error_naming_it() -> None:
    """One row the server refuses (413) is not halved further: the error says the server's limit."""
    with (
        serve(length_scorer, HTTPSettings(max_body_bytes=1 << 16)) as handle,
        RewardClient(handle.url, retries=0) as client,
    ):
        with pytest.raises(RewardServerError, match=r"HTTP 413: .*the limit is 65536") as raised:
            client.score(["short", "y" * 100_000])
        assert raised.value.status == 413
        assert client.max_request_rows == 1  # halved once: the two rows, then the long one alone


def test_the_clients_cut_is_within_the_default_budgets_of_rm_serve_and_the_server_command() -> None:
    """A default client to a default server never meets a 413 (the halving is for servers set lower): rm/serve's
    schema defaults and those of `python -m nemotron.reward.server`, read where they are set."""
    from pathlib import Path

    from nemotron.catalog import load_schema
    from nemotron.reward.batching import BatchingConfig
    from nemotron.reward.server import MAX_REQUEST_TOKENS
    from nemotron.reward.server_options import server_command_line

    server = load_schema(Path(__file__).resolve().parents[2] / "steps/rm/serve/schema.py")()
    command = server_command_line("server", None, "model", "reward_model").parse_args(["--model", "m"])
    client = RewardClient
    head = 64 << 10  # room for the request's JSON head and its lengths tensor
    for body, rows, tokens in [
        (server.server.max_body_bytes, server.server.max_queue_rows, server.server.max_request_tokens),
        (command.max_body_bytes, BatchingConfig().max_queue_rows, MAX_REQUEST_TOKENS),
    ]:
        assert client.max_request_bytes + head <= body
        assert client.max_request_rows <= rows
        assert client.max_request_bytes // 8 <= tokens  # int64 token ids
