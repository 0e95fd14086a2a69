"""Request smuggling against both servers over raw sockets: a request whose body has no single length gets one
400 with `Connection: close`, then EOF, so the request hidden in its body is never answered (RFC 9112 6.1, 6.3).
An honest chunked body is still read, and its connection stays open."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest
import torch

from nemotron.core.paths import shipped_root
from nemotron.models.checkpoint import load_policy, load_tokenizer
from nemotron.reward.chat_server import HFChatModel, serve_chat
from nemotron.reward.server import serve
from nemotron.reward.transport import HTTPSettings, ServerHandle

# If a server took the framing the way the attacker's proxy did not, it would answer this too: 404.
SMUGGLED = b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n"
PATHS = {"reward": b"/score", "chat": b"/v1/chat/completions"}
HONEST = {
    "reward": b'{"sentences": ["ab", "abcd"]}',
    "chat": b'{"model": "judge", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}',
}


def chunked(body: bytes) -> bytes:
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)


EMPTY_THEN_SMUGGLED = b"0\r\n\r\n" + SMUGGLED  # a chunked reader sees an empty body, then a request
CL_TE = b"Content-Length: %d" % len(EMPTY_THEN_SMUGGLED)
# (head lines, body, HTTP version, what the error names)
FORMS: dict[str, tuple[list[bytes], bytes, bytes, str]] = {
    "CL.TE": ([CL_TE, b"Transfer-Encoding: chunked"], EMPTY_THEN_SMUGGLED, b"1.1", "together"),
    "TE.CL": (
        [b"Transfer-Encoding: chunked", b"Content-Length: 3"],
        chunked(b"abc" + SMUGGLED),
        b"1.1",
        "together",
    ),
    "a tab before the TE value": (
        [CL_TE, b"Transfer-Encoding:\tchunked"],
        EMPTY_THEN_SMUGGLED,
        b"1.1",
        "together",
    ),
    "upper case": ([CL_TE.upper(), b"TRANSFER-ENCODING: CHUNKED"], EMPTY_THEN_SMUGGLED, b"1.1", "together"),
    "lower case": ([b"transfer-encoding: chunked", CL_TE.lower()], EMPTY_THEN_SMUGGLED, b"1.1", "together"),
    "an underscore": (
        [CL_TE, b"Transfer_Encoding: chunked"],
        EMPTY_THEN_SMUGGLED,
        b"1.1",
        "Transfer_Encoding",
    ),
    "a space before the colon": (
        [CL_TE, b"Transfer-Encoding : chunked"],
        EMPTY_THEN_SMUGGLED,
        b"1.1",
        "looks like",
    ),
    "repeated TE": ([b"Transfer-Encoding: chunked"] * 2, EMPTY_THEN_SMUGGLED, b"1.1", "single 'chunked'"),
    "TE chunked, then identity": (
        [b"Transfer-Encoding: chunked", b"Transfer-Encoding: identity"],
        EMPTY_THEN_SMUGGLED,
        b"1.1",
        "single 'chunked'",
    ),
    "a TE list": ([b"Transfer-Encoding: gzip, chunked"], EMPTY_THEN_SMUGGLED, b"1.1", "single 'chunked'"),
    "TE on HTTP/1.0": ([b"Transfer-Encoding: chunked"], EMPTY_THEN_SMUGGLED, b"1.0", "HTTP/1.0"),
    "chunk size not hex": (
        [b"Transfer-Encoding: chunked"],
        b"zz\r\nabc\r\n" + EMPTY_THEN_SMUGGLED,
        b"1.1",
        "chunk",
    ),
    "chunk size negative": (
        [b"Transfer-Encoding: chunked"],
        b"-1\r\na\r\n" + EMPTY_THEN_SMUGGLED,
        b"1.1",
        "chunk",
    ),
    "chunk size 0x-prefixed": (
        [b"Transfer-Encoding: chunked"],
        b"0x3\r\nabc\r\n" + SMUGGLED,
        b"1.1",
        "chunk",
    ),
    "chunk size of 21 digits": ([b"Transfer-Encoding: chunked"], b"1" * 21 + b"\r\na\r\n", b"1.1", "chunk"),
    "chunk data longer than its size": (
        [b"Transfer-Encoding: chunked"],
        b"1\r\nab\r\n0\r\n\r\n",
        b"1.1",
        "chunk",
    ),
    "CL 1, 1": ([b"Content-Length: 1, 1"], b"a" + SMUGGLED, b"1.1", "not one non-negative integer"),
    "CL twice, equal": (
        [b"Content-Length: 1", b"Content-Length: 1"],
        b"a" + SMUGGLED,
        b"1.1",
        "more than once",
    ),
    "CL twice, differing": (
        [b"Content-Length: 1", b"Content-Length: 2"],
        b"ab" + SMUGGLED,
        b"1.1",
        "more than once",
    ),
    "CL negative": ([b"Content-Length: -1"], b"a" + SMUGGLED, b"1.1", "not one non-negative integer"),
    "CL with a sign": ([b"Content-Length: +1"], b"a" + SMUGGLED, b"1.1", "not one non-negative integer"),
    "CL empty": ([b"Content-Length:"], b"a" + SMUGGLED, b"1.1", "not one non-negative integer"),
    "CL in hex": ([b"Content-Length: 0x1"], b"a" + SMUGGLED, b"1.1", "not one non-negative integer"),
}


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, ServerHandle]]:
    """The reward server (a length scorer) and the chat server on the shipped tiny SFT policy."""
    policy = shipped_root() / "tiny" / "sft_policy"
    model = load_policy(policy, device=torch.device("cpu"), dtype=torch.float32)
    chat_model = HFChatModel(model, load_tokenizer(policy), max_context=64)
    with (
        serve(lambda texts: [float(len(t)) for t in texts], HTTPSettings()) as reward,
        serve_chat(chat_model, HTTPSettings()) as chat,
    ):
        yield {"reward": reward, "chat": chat}


def responses_until_eof(handle: ServerHandle, raw: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Send `raw` on a new connection, read until the server closes it (a reset fails), and split what came
    into responses; each must have a Content-Length, and nothing may follow the last."""
    data = b""
    with socket.create_connection((handle.host, handle.port), timeout=10) as sock:
        sock.sendall(raw)
        while chunk := sock.recv(65536):  # a timeout here: the connection was left open
            data += chunk
    responses = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        assert sep and head.startswith(b"HTTP/1.1 "), data[:200]
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers["content-length"])
        responses.append((int(lines[0].split(" ")[1]), headers, rest[:length]))
        data = rest[length:]
    return responses


def error_message(body: bytes) -> str:
    error = json.loads(body)["error"]
    return error if isinstance(error, str) else error["message"]  # the chat server's is OpenAI's object


@pytest.mark.parametrize("server", ["reward", "chat"])
@pytest.mark.parametrize("form", FORMS)
def test_a_framing_error_gets_one_400_then_the_connection_closes(
    servers: dict[str, ServerHandle], server: str, form: str
) -> None:
    lines, body, version, names = FORMS[form]
    head = b"POST %s HTTP/%s\r\nHost: x\r\n%s\r\n\r\n" % (PATHS[server], version, b"\r\n".join(lines))
    responses = responses_until_eof(servers[server], head + body)
    assert len(responses) == 1, [status for status, _, _ in responses]  # the smuggled GET was not answered
    status, headers, answer = responses[0]
    assert (status, headers.get("connection")) == (400, "close"), answer
    assert names in error_message(answer)


@pytest.mark.parametrize("server", ["reward", "chat"])
def test_an_honest_chunked_body_is_read_and_the_connection_lives_on(
    servers: dict[str, ServerHandle], server: str
) -> None:
    post = b"POST %s HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" % PATHS[server]
    after = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    responses = responses_until_eof(servers[server], post + chunked(HONEST[server]) + after)
    assert [status for status, _, _ in responses] == [200, 200]
    if server == "reward":
        assert json.loads(responses[0][2]) == {"rewards": [2.0, 4.0]}
    else:
        assert json.loads(responses[0][2])["object"] == "chat.completion"
