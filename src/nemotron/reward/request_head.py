"""What the servers check in a raw request head beyond h11: its size, obsolete line folding, and whether it frames
its body in exactly one way (RFC 9112 6). h11 parses the head, but it keeps no raw copy and smooths over what
framing needs: it reads a body chunked when Content-Length is there too, and folds repeated lengths into one.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from nemotron.reward.messages import HTTPError

MAX_HEAD_BYTES = 65536  # request line and headers together; more: 431 (414 while the request line has no end)
MAX_HEADERS = 100  # more: 431

HEAD_END = re.compile(rb"\n\r?\n")
_OBS_FOLD = re.compile(rb"\n[ \t]")  # a header line that continues the one before it (RFC 9112 5.2)
# A framing header's line, its name spelled as some proxy might still read it: any case, "_" for "-", blanks
# around the name (one of those makes it no valid header, so h11 and the proxy may not agree on it).
_FRAMING_LINE = re.compile(
    rb"\n([ \t]*)(content[-_]length|transfer[-_]encoding)([ \t]*):([^\r\n]*)", re.IGNORECASE
)


def head_of(data: bytes | bytearray) -> bytes:
    """The request head at the start of `data`: up to its blank line, or all of `data` when it has none yet."""
    end = HEAD_END.search(data)
    return bytes(data[: end.start() + 1] if end is not None else data)


def too_long(head: bytes | bytearray) -> HTTPError | None:
    """414 or 431 when a request head (complete or not) is over the limit; h11 checks only incomplete ones."""
    end = HEAD_END.search(head)
    size = end.start() if end is not None else len(head)
    if size <= MAX_HEAD_BYTES:
        return None
    if head.find(b"\n", 0, MAX_HEAD_BYTES) < 0:
        return HTTPError(414, f"the request line is longer than {MAX_HEAD_BYTES} bytes")
    return HTTPError(431, f"the request headers are larger than {MAX_HEAD_BYTES} bytes")


def folded(head: bytes | bytearray) -> HTTPError | None:
    if _OBS_FOLD.search(head):
        return HTTPError(400, "obsolete line folding in a header (RFC 9112 5.2); send one line per header")
    return None


def framing_error(head: bytes) -> str | None:
    """Why the body of the request with this head (cut by `head_of`) has no single length, or None when it has
    one (RFC 9112 6.1, 6.3): Content-Length and Transfer-Encoding together, in any spelling or case;
    Transfer-Encoding in HTTP/1.0, repeated, or anything but `chunked`; a Content-Length repeated or other than one
    non-negative integer.

    A front proxy that reads the other length would take the rest of this body for a request of its own
    (request smuggling), so the connection answers 400 and closes rather than guess.
    """
    lengths: list[bytes] = []
    codings: list[bytes] = []
    for before, name, after, value in _FRAMING_LINE.findall(head):
        if before or after or b"_" in name:  # a proxy may read it as the real header, or h11 not
            spelled = name.lower().replace(b"_", b"-").decode()
            return f"the header {(before + name + after).decode()!r} looks like {spelled} but is not"
        (codings if name.lower().startswith(b"t") else lengths).append(value.strip())
    if codings and lengths:
        return "Content-Length and Transfer-Encoding together (RFC 9112 6.1); send one of them"
    if codings and head.split(b"\n", 1)[0].rstrip(b"\r").endswith(b"HTTP/1.0"):
        return "Transfer-Encoding in an HTTP/1.0 request (RFC 9112 6.1); send Content-Length"
    if len(codings) > 1 or (codings and codings[0].lower() != b"chunked"):
        listed = ", ".join(c.decode("latin-1") for c in codings)
        return f"Transfer-Encoding {listed!r}: the only one accepted is a single 'chunked'"
    if len(lengths) > 1:
        return "Content-Length sent more than once"
    if lengths and not lengths[0].isdigit():
        return f"Content-Length {lengths[0].decode('latin-1')!r} is not one non-negative integer"
    return None


def split_target(target: str) -> tuple[str, str]:
    """A request target -> (path, query); HTTP 400 for one urlsplit refuses (e.g. "http://[::1/score")."""
    if target.startswith("//"):  # a path, not a network location: never read "//host/x" as host "host"
        target = "/" + target.lstrip("/")
    try:
        url = urlsplit(target)
    except ValueError as exc:
        raise HTTPError(400, f"bad request target: {exc}") from exc
    return url.path, url.query
