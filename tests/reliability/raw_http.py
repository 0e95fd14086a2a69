"""A client that sends raw bytes to a server on a real socket and reads back every HTTP/1.1 response it answers
with, as the hostile-input tests need it: no client library would send what they send (lying lengths, broken
request lines) or hand back two responses to one request."""

from __future__ import annotations

import json
import socket

from nemotron.reward.transport import ServerHandle


def exchange(handle: ServerHandle, raw: bytes) -> bytes:
    """Send `raw`, half-close, and read until the server closes; b"" also when it reset the connection."""
    chunks = []
    with socket.create_connection((handle.host, handle.port), timeout=10) as conn:
        try:
            conn.sendall(raw)
            conn.shutdown(socket.SHUT_WR)  # EOF: the server never waits for bytes that will not come
        except OSError:
            pass  # it answered (413, 401) and closed before reading everything
        try:
            while chunk := conn.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass
    return b"".join(chunks)


def parse_responses(data: bytes, to_head: bool = False) -> list[tuple[int, dict[str, str], bytes]]:
    """Every HTTP/1.1 response in `data` (a lying Content-Length can make the server see two requests).

    The answer to a HEAD request (`to_head`) has a Content-Length but no body.
    """
    responses: list[tuple[int, dict[str, str], bytes]] = []
    while data:
        if not data.startswith(b"HTTP/"):
            # A request line without a valid version is taken as HTTP/0.9, whose answer is a bare body:
            # http.server's 400, after which it closes the connection.
            assert "error" in json.loads(data), data[:200]
            return [*responses, (400, {}, data)]
        head, sep, rest = data.partition(b"\r\n\r\n")
        assert sep, f"truncated response head: {data[:200]!r}"
        lines = head.decode("latin-1").split("\r\n")
        version, status, _ = (lines[0] + " ").split(" ", 2)
        assert version == "HTTP/1.1" and status.isdigit(), f"bad status line {lines[0]!r}"
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = 0 if to_head else int(headers.get("content-length", "0"))
        assert len(rest) >= length, f"body shorter than its Content-Length: {rest!r}"
        responses.append((int(status), headers, rest[:length]))
        data = rest[length:]
    return responses


def http_request(
    method: str, path: str, body: bytes, headers: dict[str, str], content_length: str | None = None
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines.append(f"Content-Length: {len(body) if content_length is None else content_length}")
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return "\r\n".join(lines).encode("latin-1", "replace") + b"\r\n\r\n" + body
