"""The bearer token on a real reward server and a real chat judge on 127.0.0.1: every endpoint but the health
checks answers 401 to any authorization but the token's, sent as raw bytes on a socket (tests/reliability/raw_http.py),
hypothesis drawing the wrong ones."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.reliability.raw_http import exchange, http_request, parse_responses

from nemotron.reward.chat_server import ChatRequest, Completion, serve_chat
from nemotron.reward.scorer import Scorer
from nemotron.reward.server import serve
from nemotron.reward.transport import HTTPSettings, ServerHandle

TOKEN = "fuzz-token-123"
INFER = "/v2/models/reward_model/infer"
# "METHOD path" per server; the unknown paths and wrong methods say only 401 too, so a stranger can neither map
# the server nor learn its model's name.
PUBLIC = {
    "reward": "GET /v2/health/live|GET /v2/health/ready|GET /health",
    "chat": "GET /health|GET /v2/health/ready|GET /v2/health/live",
}
PRIVATE = {
    "reward": f"GET /v2|GET /metrics|POST /score|GET /v2/models/reward_model|GET /v2/models/reward_model/config|"
    f"POST {INFER}|POST /v2/models/reward_model/versions/1/infer|GET /v2/models/reward_model/versions/1|"
    f"GET /nowhere|POST /v2/models/other/infer|PUT /score|GET {INFER}|"
    # A model's readiness needs the token too: else 200 for the right name and 401 for a guess tell them apart.
    "GET /v2/models/reward_model/ready|GET /v2/models/reward_model/versions/1/ready|GET /v2/models/guess/ready",
    "chat": "POST /v1/chat/completions|GET /v1/models|GET /metrics|GET /nowhere",
}
ENDPOINTS = [
    (server, *line.split(" "), public)
    for public, table in ((True, PUBLIC), (False, PRIVATE))
    for server, lines in table.items()
    for line in lines.split("|")
]


class EchoChat:
    def complete(self, request: ChatRequest) -> Completion:
        return Completion("ok", "stop", 1, 1)


@pytest.fixture(scope="module")
def token_servers() -> Iterator[dict[str, ServerHandle]]:
    with (
        serve(Scorer(score_sentences=lambda texts: [0.0] * len(texts)), HTTPSettings(token=TOKEN)) as reward,
        serve_chat(EchoChat(), HTTPSettings(token=TOKEN)) as chat,
    ):
        yield {"reward": reward, "chat": chat}


def _status(handle: ServerHandle, method: str, path: str, authorization: str | None) -> int:
    headers = {"Authorization": authorization} if authorization is not None else {}
    body = b'{"sentences": ["good"]}' if method in ("POST", "PUT") else b""
    responses = parse_responses(exchange(handle, http_request(method, path, body, headers)))
    assert len(responses) == 1
    return responses[0][0]


@pytest.mark.parametrize(("server", "method", "path", "public"), ENDPOINTS)
def test_every_endpoint_but_health_needs_the_token(
    token_servers: dict[str, ServerHandle], server: str, method: str, path: str, public: bool
) -> None:
    handle = token_servers[server]
    for authorization in (None, "", "Bearer", "Bearer wrong", f"Basic {TOKEN}", TOKEN, f"Bearer {TOKEN}x"):
        status = _status(handle, method, path, authorization)
        assert status == 200 if public else status == 401, authorization
    assert _status(handle, method, path, f"Bearer {TOKEN}") != 401


def test_any_other_authorization_is_401(token_servers: dict[str, ServerHandle]) -> None:
    @settings(max_examples=150, deadline=None, database=None)
    @given(
        authorization=st.text(st.characters(min_codepoint=32, max_codepoint=255), max_size=40)
        | st.sampled_from([TOKEN.upper(), TOKEN[:-1], TOKEN + "\x00", TOKEN + "-"]).map(
            lambda t: "Bearer " + t
        )
    )
    def prop(authorization: str) -> None:
        # A NUL is no valid header value (RFC 9110 5.5): 400 from the parser, before auth is asked.
        assert _status(token_servers["reward"], "POST", INFER, authorization) == (
            400 if "\x00" in authorization else 401
        )

    prop()
