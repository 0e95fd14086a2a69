"""Client of the reward server (or any KServe v2 / Triton server with the same tensors).

Sends the binary tensor data extension, retries connection errors and 5xx with exponential backoff,
and raises `RewardServerError` naming the URL when the server is down or answers garbage.
"""

from __future__ import annotations

import http.client
import json
import logging
import math
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Self
from urllib.parse import urlsplit

import numpy as np

from nemotron.errors import ServiceError, UserError
from nemotron.reward.kserve import (
    HEADER_LENGTH,
    Array,
    KServeError,
    decode_infer_response,
    encode_infer_request,
)

logger = logging.getLogger(__name__)

_RETRYABLE_STATUS = frozenset({500, 502, 503, 504})


class RewardServerError(ServiceError):
    """A reward (or judge) server is unreachable, refused the request, or answered something unusable.

    When `url` is given the message names it: "reward server at http://...: <detail>".
    """

    def __init__(
        self,
        detail: str,
        *,
        url: str | None = None,
        status: int | None = None,
        service: str = "reward server",
    ) -> None:
        super().__init__(f"{service} at {url}: {detail}" if url else detail)
        self.detail, self.url, self.status = detail, url, status


class RequestRejected(UserError, RewardServerError):
    """The server answered 400: it read the request and says its content is wrong, e.g. a token id outside the
    reward model's vocabulary (the policy's tokenizer is not the reward model's). That is bad input (exit 2), not a
    service failure (exit 3): re-sending, or a resume against the same server, would get the same answer.

    Still a `RewardServerError`, so code that handles any failure of the server handles this one too."""

    exit_code = 2

    def __init__(self, detail: str, *, url: str, status: int, service: str) -> None:
        RewardServerError.__init__(self, detail, url=url, status=status, service=service)
        who = _REJECTED_BY.get(service, service)
        # Worded apart from "reward server ...", which the manifests' "unreachable" known errors match.
        self.message = f"the {who} at {url} refused the request as bad input (HTTP {status}): {detail}"
        self.problems, self.hint = [], None
        self.args = (self.message,)

    def __str__(self) -> str:
        return self.message


_REJECTED_BY = {"reward server": "reward model", "judge server": "judge"}


def normalize_url(url: str) -> str:
    """'host:port' or 'http://host:port/' -> 'http://host:port'."""
    url = url.strip().rstrip("/")
    return url if "://" in url else f"http://{url}"


class _RetryableError(Exception):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


def _error_message(body: bytes) -> str:
    try:
        payload = json.loads(body)
        if isinstance(payload, dict) and "error" in payload:
            error = payload["error"]
            # OpenAI's error object (the judge server, vLLM): {"error": {"message": ..., "type": ..., ...}}
            if isinstance(error, dict) and "message" in error:
                return str(error["message"])
            return str(error)
    except ValueError:
        pass
    return body[:200].decode("utf-8", "replace") or "(empty body)"


class RetryingHTTPClient:
    """One base URL, a bearer token, a timeout, and retries with exponential backoff."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout: float = 60.0,
        retries: int = 3,
        backoff: float = 0.5,
        *,
        service: str = "reward server",
    ) -> None:
        self.url = normalize_url(url)
        self.token, self.timeout, self.retries, self.backoff = token, timeout, retries, backoff
        self.service = service
        self.max_backoff = 10.0
        self._local = threading.local()  # one keep-alive connection per calling thread

    def error(self, message: str, status: int | None = None) -> RewardServerError:
        return RewardServerError(message, url=self.url, status=status, service=self.service)

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: Mapping[str, str] | None = None
    ) -> tuple[dict[str, str], bytes]:
        """Returns (lower-cased response headers, body) of a 2xx answer; retries, then raises RewardServerError."""
        last = ""
        last_status: int | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                delay = min(self.max_backoff, self.backoff * 2 ** (attempt - 1))
                time.sleep(delay * (0.5 + random.random() / 2))  # jitter spreads out many actors' retries
            try:
                return self._once(method, path, body, headers)
            except _RetryableError as exc:
                last, last_status = str(exc), exc.status
                logger.info(
                    "%s%s attempt %d/%d failed: %s", self.url, path, attempt + 1, self.retries + 1, exc
                )
        raise self.error(f"{last} (after {self.retries + 1} attempts)", last_status)

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        """This thread's keep-alive connection, and whether it was used before."""
        connection: http.client.HTTPConnection | None = getattr(self._local, "connection", None)
        if connection is not None:
            return connection, True
        parts = urlsplit(self.url)
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        connection = kind(parts.hostname or "", parts.port, timeout=self.timeout)
        try:
            connection.connect()
        except OSError as exc:
            raise _RetryableError(f"cannot connect: {exc}") from exc
        self._local.connection = connection
        return connection, False

    def close(self) -> None:
        """Close this thread's connection (other threads' close when they are collected)."""
        connection = getattr(self._local, "connection", None)
        self._local.connection = None
        if connection is not None:
            connection.close()

    def __enter__(self) -> Self:  # Self: `with RewardClient(...) as c` gives a RewardClient
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _once(
        self, method: str, path: str, body: bytes | None, headers: Mapping[str, str] | None
    ) -> tuple[dict[str, str], bytes]:
        all_headers = dict(headers or {})
        if self.token:
            all_headers["Authorization"] = f"Bearer {self.token}"
        target = urlsplit(self.url).path + path
        while True:
            connection, reused = self._connection()
            try:
                connection.request(method, target, body=body, headers=all_headers)
                response = connection.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                if reused and isinstance(
                    exc, http.client.RemoteDisconnected | ConnectionResetError | BrokenPipeError
                ):
                    continue  # the server dropped an idle keep-alive connection: redo at once on a new one
                if isinstance(exc, TimeoutError):
                    raise _RetryableError(f"no answer within {self.timeout} s") from exc
                raise _RetryableError(f"{type(exc).__name__}: {exc}") from exc
            break
        if response.will_close:
            self.close()
        response_headers = {k.lower(): v for k, v in response.getheaders()}
        if response.status >= 400:
            detail = _error_message(data)
            if response.status in _RETRYABLE_STATUS:
                raise _RetryableError(f"HTTP {response.status}: {detail}", response.status)
            if response.status == 400:
                raise RequestRejected(detail, url=self.url, status=response.status, service=self.service)
            raise self.error(f"HTTP {response.status}: {detail}", response.status)
        return response_headers, data


class RewardClient(RetryingHTTPClient):
    """`RewardClient(url).score(["text", ...]) -> [reward, ...]` over KServe v2 with binary tensors.

    A call of more rows than one request may carry goes as several requests, in order: each stays within the
    per-request budgets a server keeps at its defaults (rm/serve's server.max_body_bytes 8 MiB,
    max_request_tokens 2**20 token ids, max_queue_rows 65536), so an RL step of many long responses is scored
    rather than refused with 413. A server set below them (a lowered server.max_body_bytes, another KServe
    server) answers a request 413: the client halves its budgets, logs a warning, and sends that request again
    in smaller ones; a single row refused is an error naming the server's limit."""

    model_name = "reward_model"  # the name in /v2/models/<name>/infer; set it on an instance for another
    max_request_rows = 4096  # rows in one request
    # one request's tensor data: int64 token ids (rows x longest row x 8), or the sentences' UTF-8
    max_request_bytes = 4 << 20

    def score(self, sentences: Sequence[str]) -> list[float]:
        """One reward per sentence, in order."""
        encoded = [s.encode("utf-8") for s in sentences]

        def infer(start: int, stop: int) -> list[float]:
            array = np.empty(stop - start, dtype=object)
            array[:] = encoded[start:stop]
            return self._infer({"sentences": array}, stop - start)

        return self._in_requests([4 + len(s) for s in encoded], False, infer)

    def score_tokens(self, tokens: Sequence[Sequence[int]]) -> list[float]:
        """One reward per token-id row (rows may differ in length), in order."""

        def infer(start: int, stop: int) -> list[float]:
            chunk = tokens[start:stop]
            lengths = np.asarray([len(row) for row in chunk], dtype=np.int64)  # [B]
            padded = np.zeros((len(chunk), int(lengths.max())), dtype=np.int64)  # [B, T]
            for i, row in enumerate(chunk):
                padded[i, : len(row)] = row
            return self._infer({"tokens": padded, "sequence_lengths": lengths}, len(chunk))

        return self._in_requests([8 * len(row) for row in tokens], True, infer)

    def _in_requests(
        self, sizes: Sequence[int], padded: bool, infer: Callable[[int, int], list[float]]
    ) -> list[float]:
        """`infer(start, stop)` for each request in turn (`_stop`), the rewards in order. A request the server
        refuses as too large (413) halves the budgets, to its rows and its data, and goes again as smaller ones."""
        rewards: list[float] = []
        start = 0
        while start < len(sizes):
            stop = self._stop(sizes, start, padded)
            try:
                rewards += infer(start, stop)
            except RewardServerError as exc:
                if exc.status != 413 or stop - start < 2:
                    raise
                self._halve(stop - start, _cost(sizes[start:stop], padded), exc.detail)
                continue
            start = stop
        return rewards

    def _halve(self, rows: int, cost: int, why: str) -> None:
        self.max_request_rows = min(self.max_request_rows, max(1, rows // 2))
        self.max_request_bytes = min(self.max_request_bytes, max(1, cost // 2))
        logger.warning(
            "%s at %s refused %d rows (%d bytes of data) as too large (%s); sending at most %d rows and %d bytes "
            "a request from now on",
            self.service,
            self.url,
            rows,
            cost,
            why,
            self.max_request_rows,
            self.max_request_bytes,
        )

    def _stop(self, sizes: Sequence[int], start: int, padded: bool) -> int:
        """Where the request that begins at row `start` ends, for rows of these data sizes in bytes: at most
        max_request_rows rows and max_request_bytes of data (`padded`: every row of a request padded to its
        longest); a row larger than that goes alone."""
        total = widest = 0
        for i in range(start, len(sizes)):
            rows, size = i - start + 1, sizes[i]
            need = rows * max(widest, size) if padded else total + size
            if i > start and (rows > self.max_request_rows or need > self.max_request_bytes):
                return i
            total, widest = total + size, max(widest, size)
        return len(sizes)

    def _infer(self, inputs: Mapping[str, Array], count: int) -> list[float]:
        body, json_length = encode_infer_request(inputs, binary_inputs=True, binary_data_output=True)
        headers = {"Content-Type": "application/octet-stream" if json_length else "application/json"}
        if json_length is not None:
            headers[HEADER_LENGTH] = str(json_length)
        response_headers, response = self.request(
            "POST", f"/v2/models/{self.model_name}/infer", body, headers
        )
        return self._rewards(response_headers, response, count)

    def _rewards(self, headers: Mapping[str, str], body: bytes, count: int) -> list[float]:
        length_text = headers.get(HEADER_LENGTH.lower())
        try:
            outputs = decode_infer_response(body, int(length_text) if length_text else None)
        except (KServeError, ValueError) as exc:
            raise self.error(f"returned an invalid inference response: {exc}") from exc
        rewards: Any = outputs.get("rewards")
        if rewards is None:
            raise self.error(f"the response has no 'rewards' output (got {sorted(outputs)})")
        flat = np.asarray(rewards).reshape(-1)
        if flat.size != count or flat.dtype.kind != "f":
            raise self.error(f"expected {count} float rewards, got {flat.size} of dtype {flat.dtype}")
        values = [float(x) for x in flat]
        if not all(math.isfinite(v) for v in values):
            raise self.error("the response holds a non-finite reward")
        return values


def _cost(sizes: Sequence[int], padded: bool) -> int:
    """The data of one request of rows of these sizes: each padded to the longest, or their sum."""
    return len(sizes) * max(sizes) if padded else sum(sizes)


def wait_ready(
    url: str,
    timeout: float = 60.0,
    token: str | None = None,
    interval: float = 0.2,
    path: str = "/v2/health/ready",
) -> None:
    """Poll GET `path` (KServe's /v2/health/ready; vLLM's /health) until it answers 200; RewardServerError naming
    the URL after `timeout` s."""
    client = RetryingHTTPClient(url, token, timeout=min(5.0, timeout), retries=0)
    deadline = time.monotonic() + timeout
    last = "no attempt"
    while True:
        try:
            client.request("GET", path)
            return
        except RewardServerError as exc:
            last = exc.detail
        if time.monotonic() + interval > deadline:
            raise client.error(f"not ready after {timeout:.1f} s (last: {last})")
        time.sleep(interval)
