"""Hostile input against a real reward server on 127.0.0.1: hypothesis-made requests never get a 5xx or crash it.

Every example travels over a real socket. Requests start valid and then take up to three mutations (a lying
`Inference-Header-Content-Length`, a wrong dtype or shape, NaN, negative lengths, non-UTF-8 BYTES, a body over
the limit, mangled JSON, ...). An unmutated request must get exactly the right rewards; after every example the
server must still answer a probe correctly. The server runs twice: with a cheap deterministic scorer (many
examples) and with a tiny real GPT-2 reward model built from a config. The bearer token has its own
tests (test_server_token.py).
"""

from __future__ import annotations

import json
import logging
import math
import struct
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.reliability.raw_http import exchange, http_request, parse_responses

from nemotron.models.tiny import tiny_model
from nemotron.models.tokenizer import word_tokenizer
from nemotron.reward.batcher import BatchingConfig
from nemotron.reward.client import RewardClient
from nemotron.reward.scorer import Scorer, scorer_from_reward_model
from nemotron.reward.server import serve
from nemotron.reward.transport import HTTPSettings, ServerHandle

WORDS = "the a movie film was is great good bad awful fine plot acting boring fun it and but very".split()
VOCAB = len(WORDS) + 3  # [PAD], [UNK], [EOS] + the words: both scorers take token ids below this
HEADER = "Inference-Header-Content-Length"
INFER = "/v2/models/reward_model/infer"
MAX_BODY = 64 * 1024  # small, so that bodies over the limit are cheap to send
MAX_QUEUE_ROWS = 64
PROBE = ["the movie was good", "bad plot"]
DATATYPES = ["BOOL", "UINT8", "INT8", "INT32", "INT64", "UINT64", "FP16", "FP32", "FP64", "BYTES"]


# --- the two servers -------------------------------------------------------------------------------------


def cheap_scorer() -> Scorer:
    """Sentence -> its UTF-8 byte count; token row -> the sum of its ids. Exact in float32."""
    return Scorer(
        score_sentences=lambda texts: [float(len(t.encode("utf-8"))) for t in texts],
        score_tokens=lambda rows: [float(sum(row)) for row in rows],
        vocab_size=VOCAB,
    )


def gpt2_scorer() -> Scorer:
    model = tiny_model(VOCAB, "reward_model", eos_token_id=2)
    return scorer_from_reward_model(model, word_tokenizer(WORDS), max_length=32)


@dataclass
class Target:
    name: str
    handle: ServerHandle
    scorer: Scorer
    examples: int  # hypothesis examples per property test
    probe: list[float]  # the rewards of PROBE, scored one sentence at a time
    client: RewardClient
    tally: Counter[str] = field(default_factory=Counter)

    def expected(self, kind: str, items: list[Any]) -> list[float]:
        """What the scorer gives each row alone (no batching); the server is idle, so this cannot race it."""
        if kind == "sentences":
            return [self.scorer.score_sentences([s])[0] for s in items]
        assert self.scorer.score_tokens is not None
        return [self.scorer.score_tokens([row])[0] for row in items]


@pytest.fixture(scope="module", params=["cheap", "gpt2"])
def target(request: pytest.FixtureRequest, report: Callable[[str], None]) -> Iterator[Target]:
    torch.set_num_threads(1)
    scorer = cheap_scorer() if request.param == "cheap" else gpt2_scorer()
    batching = BatchingConfig(
        max_batch_size=16, preferred_batch_size=16, max_queue_delay_ms=0.0, max_queue_rows=MAX_QUEUE_ROWS
    )
    handle = serve(scorer, HTTPSettings(max_body_bytes=MAX_BODY), batching)
    examples = 1000 if request.param == "cheap" else 250
    probe = [scorer.score_sentences([s])[0] for s in PROBE]
    client = RewardClient(handle.url, retries=0, timeout=10)
    target = Target(request.param, handle, scorer, examples, probe, client)
    yield target
    client.close()
    handle.stop(5.0)
    report(
        f"reward-server fuzz ({target.name}): "
        + ", ".join(f"{k}: {v}" for k, v in sorted(target.tally.items())),
    )


def rewards_of(headers: dict[str, str], body: bytes) -> list[float]:
    """Decode the rewards of a 200 answer by hand (JSON `data`, or FP32 after the JSON header)."""
    if HEADER.lower() in headers:
        split = int(headers[HEADER.lower()])
        entry = json.loads(body[:split])["outputs"][0]
        raw = body[split:]
        assert entry["parameters"]["binary_data_size"] == len(raw)
        return list(struct.unpack(f"<{len(raw) // 4}f", raw))
    payload = json.loads(body)
    return list(payload["rewards"] if "rewards" in payload else payload["outputs"][0]["data"])


@dataclass
class Case:
    raw: bytes
    expected: tuple[str, list[Any]] | None = None  # (kind, rows) when the request is valid as sent
    mutations: list[str] = field(default_factory=list)


def check(target: Target, case: Case) -> list[int]:
    """The properties every example must keep: no 5xx, valid requests answered right, the server still up.

    Returns the status codes the server answered with.
    """
    responses = parse_responses(exchange(target.handle, case.raw), to_head=case.raw.startswith(b"HEAD "))
    for status, _, body in responses:
        target.tally[f"HTTP {status}"] += 1
        # 501 is RFC 9110's answer to a method the server does not know (PATCH, BREW): not a server fault.
        assert status < 500 or status == 501, (
            f"{status} {body[:300]!r} for {case.mutations} {case.raw[:300]!r}"
        )
        if status >= 400 and body:
            assert "error" in json.loads(body)  # every refusal says why, in JSON
    if case.expected is not None:
        assert responses, f"no answer to a valid request {case.raw[:300]!r}"
        status, headers, body = responses[0]
        assert status == 200, body
        kind, rows = case.expected
        want = target.expected(kind, rows)
        assert rewards_of(headers, body) == pytest.approx(want, rel=1e-4, abs=1e-5)
    assert target.client.score(PROBE) == pytest.approx(target.probe, rel=1e-4, abs=1e-5)
    return [status for status, _, _ in responses]


# --- strategies ------------------------------------------------------------------------------------------

ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=12)  # lone surrogates included
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats()
    | ANY_TEXT
    | st.sampled_from([math.nan, math.inf, -math.inf, 10**40, -1, 2**63, "1" * 4400])
)
JUNK = st.recursive(
    SCALARS,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(ANY_TEXT, kids, max_size=3),
    max_leaves=8,
)
WORD_TEXT = st.text(st.characters(exclude_categories=("Cs", "Cc", "Zs", "Zl", "Zp")), min_size=1, max_size=8)
SENTENCE = st.lists(st.sampled_from(WORDS) | WORD_TEXT, max_size=5).flatmap(
    lambda rest: st.sampled_from(WORDS).map(lambda first: " ".join([first, *rest]))
)  # at least one known word, so every sentence has a token
TOKEN_ROW = st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=8)
BAD_SHAPE = st.lists(
    st.integers(-3, 9) | st.sampled_from([2**31, 2**62, 2**63 - 1, 2**64, 10**30]), max_size=5
) | st.lists(st.integers(0, 2), min_size=60, max_size=70)


@dataclass
class Draft:
    """A KServe request before it is serialised, for mutations to work on."""

    header: dict[str, Any]
    blobs: list[bytes]  # binary tensor data, in input order
    http: dict[str, str]
    binary: bool
    content_length: str | None = None
    mangle_at: int | None = None
    pad: int = 0


def bytes_blob(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def _entry(draw: st.DrawFn, draft: Draft) -> dict[str, Any]:
    """One tensor entry of the draft to mutate, or {} when junk has replaced them all."""
    inputs = draft.header.get("inputs")
    if isinstance(inputs, list) and inputs:
        entry = inputs[draw(st.integers(0, len(inputs) - 1))]
        return entry if isinstance(entry, dict) else {}
    return {}


def mutate(draw: st.DrawFn, draft: Draft, name: str) -> None:
    entry = _entry(draw, draft)
    key = draw(st.sampled_from(["inputs", "outputs", "parameters", "id", "extra"]))
    if name == "junk field":
        draft.header[key] = draw(JUNK)
    elif name == "drop field":
        draft.header.pop(key, None)
    elif name == "junk tensor field":
        entry[draw(st.sampled_from(["name", "datatype", "shape", "data", "parameters", "x"]))] = draw(JUNK)
    elif name == "drop tensor field":
        entry.pop(draw(st.sampled_from(["name", "datatype", "shape", "data", "parameters"])), None)
    elif name == "wrong dtype":
        entry["datatype"] = draw(st.sampled_from([*DATATYPES, "STRING", "", "int64"]))
    elif name == "wrong shape":
        entry["shape"] = draw(BAD_SHAPE)
    elif name == "odd element" and isinstance(entry.get("data"), list) and entry["data"]:
        entry["data"][draw(st.integers(0, len(entry["data"]) - 1))] = draw(SCALARS | st.just([[1]]))
    elif name == "negative length" and entry.get("name") == "sequence_lengths":
        bad = draw(st.sampled_from([-1, 0, -(2**63), 10**6]))
        if isinstance(entry.get("data"), list) and entry["data"]:
            entry["data"][0] = bad
        elif draft.blobs:
            draft.blobs[-1] = struct.pack("<q", bad) + draft.blobs[-1][8:]
    elif name == "non-UTF-8" and entry.get("name") == "sentences":
        # (earlier mutations may have dropped the data or cut the blob: then there is nothing to spoil)
        if isinstance(entry.get("data"), list) and entry["data"]:
            entry["data"][0] = draw(st.sampled_from(["\ud800", "a\udfffb", "\udc80"]))
        elif draft.blobs and len(draft.blobs[0]) >= 4:
            junk = draw(st.binary(min_size=1, max_size=8)) + b"\xff\xc3"
            first = struct.unpack_from("<I", draft.blobs[0])[0]
            draft.blobs[0] = bytes_blob([junk]) + draft.blobs[0][4 + first :]
    elif name == "corrupt blob" and draft.blobs:
        i = draw(st.integers(0, len(draft.blobs) - 1))
        blob = bytearray(draft.blobs[i])
        cut = draw(st.integers(0, len(blob)))
        draft.blobs[i] = bytes(blob[:cut]) + draw(st.binary(max_size=12))
    elif name == "blob size" and isinstance(entry.get("parameters"), dict):
        entry["parameters"]["binary_data_size"] = draw(st.integers(-10, 10**7) | JUNK)
    elif name == "lying header length":
        draft.http[HEADER] = draw(st.integers(-5, 10**7).map(str) | st.sampled_from(["", "x", "1e3", "0x10"]))
    elif name == "no header length":
        draft.http.pop(HEADER, None)
    elif name == "duplicate input" and entry:
        draft.header["inputs"] = [*draft.header["inputs"], dict(entry)]
    elif name == "content type":
        draft.http["Content-Type"] = draw(
            st.sampled_from(["text/plain", "application/xml", "", "a/b; x=\x7f"])
        )
    elif name == "content encoding":
        draft.http["Content-Encoding"] = draw(st.sampled_from(["gzip", "deflate", "br", "identity", "x, y"]))
    elif name == "lying Content-Length":
        draft.content_length = draw(
            st.integers(-3, 10**12).map(str) | st.sampled_from(["", "abc", "+5", "1 2"])
        )
    elif name == "mangled JSON":
        draft.mangle_at = draw(st.integers(0, 10**6))
    elif name == "huge body":
        draft.pad = draw(st.sampled_from([MAX_BODY // 2, MAX_BODY + 1, 4 * MAX_BODY]))


MUTATIONS = (
    "junk field|drop field|junk tensor field|drop tensor field|wrong dtype|wrong shape|odd element|negative length|"
    "non-UTF-8|corrupt blob|blob size|lying header length|no header length|duplicate input|content type|"
    "content encoding|lying Content-Length|mangled JSON|huge body"
).split("|")


@st.composite
def infer_cases(draw: st.DrawFn) -> Case:
    """A valid KServe infer request (sentences or tokens, JSON or binary, [B] or [B, 1]), then 0-3 mutations."""
    kind = draw(st.sampled_from(["sentences", "tokens"]))
    binary = draw(st.booleans())
    rows: list[Any] = draw(st.lists(SENTENCE if kind == "sentences" else TOKEN_ROW, min_size=1, max_size=6))
    names = ["too many rows"] if draw(st.integers(0, 9)) == 0 else []
    if names:
        rows = rows * (MAX_QUEUE_ROWS // len(rows) + 1)  # more rows than the queue holds: 413, not 503
    column = [len(rows), 1] if draw(st.booleans()) else [len(rows)]
    if kind == "sentences":
        encoded = [s.encode("utf-8") for s in rows]
        tensors = [("sentences", "BYTES", column, rows, bytes_blob(encoded))]
    else:
        width = max(map(len, rows))
        flat = [t for row in rows for t in row + [0] * (width - len(row))]
        lengths = [len(row) for row in rows]
        tensors = [
            ("tokens", "INT64", [len(rows), width], flat, struct.pack(f"<{len(flat)}q", *flat)),
            ("sequence_lengths", "INT64", column, lengths, struct.pack(f"<{len(rows)}q", *lengths)),
        ]
    entries: list[dict[str, Any]] = []
    for name, datatype, shape, data, blob in tensors:
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": shape}
        entry.update({"parameters": {"binary_data_size": len(blob)}} if binary else {"data": list(data)})
        entries.append(entry)
    header: dict[str, Any] = {"inputs": entries}
    if draw(st.booleans()):
        header["outputs"] = [{"name": "rewards", "parameters": {"binary_data": draw(st.booleans())}}]
    draft = Draft(header, [t[4] for t in tensors] if binary else [], {}, binary)
    names += draw(st.lists(st.sampled_from(MUTATIONS), max_size=3))
    for name in names:
        mutate(draw, draft, name)
    text = json.dumps(draft.header).encode("utf-8") + b" " * draft.pad  # NaN and Infinity as JSON literals
    if draft.mangle_at is not None:
        at = draft.mangle_at % (len(text) + 1)
        text = text[:at] + draw(st.sampled_from([b"", b"\xff", b"{", b"]]", b"\x00"])) + text[at + 1 :]
    if binary and HEADER not in draft.http and "no header length" not in names:
        draft.http[HEADER] = str(len(text))
    body = text + b"".join(draft.blobs)
    path = draw(st.sampled_from([INFER, "/v2/models/reward_model/versions/1/infer"]))
    raw = http_request("POST", path, body, draft.http, draft.content_length)
    return Case(raw, None if names else (kind, rows), names)


@st.composite
def score_cases(draw: st.DrawFn) -> Case:
    """POST /score: a valid {"sentences": [...]}, or junk in its place."""
    sentences = draw(st.lists(SENTENCE, min_size=1, max_size=5))
    choice = draw(st.integers(0, 3))
    if choice == 0:
        return Case(
            http_request("POST", "/score", json.dumps({"sentences": sentences}).encode(), {}),
            ("sentences", sentences),
        )
    if choice == 1:
        payload: Any = {"sentences": draw(st.lists(ANY_TEXT | SCALARS, max_size=4))}
    elif choice == 2:
        payload = {"sentences": sentences, draw(ANY_TEXT): draw(JUNK)}
    else:
        payload = draw(JUNK)
    return Case(http_request("POST", "/score", json.dumps(payload).encode(), {}), None, ["junk"])


METHODS = st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS", "BREW", ""])
PATHS = st.sampled_from(
    f"/score {INFER} /v2 /metrics /v2/models/reward_model/versions/9/infer /v2/models//x http://[::1/score * "
    "/v2/models/reward_model/config/extra /%00 //".split()
) | st.text(st.characters(min_codepoint=33, max_codepoint=255), max_size=30)
HEADER_LINES = st.lists(
    st.sampled_from(
        "Transfer-Encoding: chunked|Content-Length: 5|Content-Length: -1|Expect: 100-continue|"
        "Content-Encoding: gzip|Connection: keep-alive|X: \xff|no colon| folded".split("|")
    )
    | st.text(st.characters(min_codepoint=32, max_codepoint=255), max_size=40),
    max_size=4,
)


@st.composite
def raw_cases(draw: st.DrawFn) -> Case:
    """Bytes that are barely HTTP, or not at all: random methods, targets, header lines and bodies."""
    if draw(st.integers(0, 4)) == 0:
        return Case(draw(st.binary(max_size=300)), None, ["random bytes"])
    line = f"{draw(METHODS)} {draw(PATHS)} {draw(st.sampled_from(['HTTP/1.1', 'HTTP/1.0', 'HTTP/2.0', 'HTTP/x']))}"
    head = "\r\n".join([line, *draw(HEADER_LINES)]).encode("latin-1", "replace")
    return Case(head + b"\r\n\r\n" + draw(st.binary(max_size=200)), None, ["raw"])


# --- the properties --------------------------------------------------------------------------------------


def run_property(target: Target, strategy: st.SearchStrategy[Case], caplog: pytest.LogCaptureFixture) -> None:
    @settings(
        max_examples=target.examples,
        deadline=None,
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
        ],
    )
    @given(case=strategy)
    def prop(case: Case) -> None:
        target.tally["examples"] += 1
        check(target, case)

    with caplog.at_level(logging.WARNING):
        prop()
    # A handler that raised, or an error it logged, is a crash even when the client got an answer.
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and r.name.startswith("nemotron")]
    assert not errors, [r.getMessage() for r in errors]


def test_infer_requests_never_get_5xx(target: Target, caplog: pytest.LogCaptureFixture) -> None:
    run_property(target, infer_cases(), caplog)


def test_score_requests_never_get_5xx(target: Target, caplog: pytest.LogCaptureFixture) -> None:
    run_property(target, score_cases(), caplog)


def test_raw_bytes_never_get_5xx(target: Target, caplog: pytest.LogCaptureFixture) -> None:
    run_property(target, raw_cases(), caplog)


def _one_input(entry: dict[str, Any]) -> bytes:
    return json.dumps({"inputs": [entry]}).encode()


SHARP_CASES = [
    ("integer of 5000 digits", "/score", b'{"sentences": [' + b"1" * 5000 + b', "a"]}'),
    ("integer of 5000 digits", INFER, b'{"inputs": [], "id": ' + b"1" * 5000 + b"}"),
    (
        "shape [0, 1e20]",
        INFER,
        _one_input({"name": "sentences", "datatype": "BYTES", "shape": [0, 10**20], "data": []}),
    ),
    (
        "shape [0, 2^62, 2^62]",
        INFER,
        _one_input({"name": "tokens", "datatype": "INT64", "shape": [0, 2**62, 2**62], "data": []}),
    ),
    (
        "70 dimensions",
        INFER,
        _one_input({"name": "tokens", "datatype": "INT64", "shape": [1] * 70, "data": [1]}),
    ),
    (
        "lone surrogate",
        INFER,
        b'{"inputs": [{"name": "sentences", "datatype": "BYTES", "shape": [1], "data": ["\\ud800"]}]}',
    ),
    ("lone surrogate", "/score", b'{"sentences": ["a\\udfff"]}'),
    ("nesting 100000 deep", INFER, b"[" * 100_000 + b"]" * 100_000),
    (
        "whitespace-only sentence",
        INFER,
        _one_input({"name": "sentences", "datatype": "BYTES", "shape": [1], "data": [" \t "]}),
    ),
    ("whitespace-only sentence", "/score", b'{"sentences": ["  "]}'),
    (
        "more rows than the queue holds",
        "/score",
        json.dumps({"sentences": ["a"] * (MAX_QUEUE_ROWS + 1)}).encode(),
    ),
]


@pytest.mark.parametrize(("name", "path", "body"), SHARP_CASES, ids=[f"{n} {p}" for n, p, _ in SHARP_CASES])
def test_sharp_cases_are_4xx(
    target: Target, name: str, path: str, body: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """Inputs that once gave a 500 (or a 503 that retrying never cures): each is now a 4xx saying why."""
    with caplog.at_level(logging.WARNING):
        statuses = check(target, Case(http_request("POST", path, body, {}), None, [name]))
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    if name == "whitespace-only sentence" and target.name == "cheap":
        assert statuses == [
            200
        ]  # a byte-counting scorer can score whitespace; only a tokenizer finds nothing
    else:
        assert len(statuses) == 1 and 400 <= statuses[0] < 500, statuses


def test_a_target_urlsplit_refuses_is_400_not_a_dropped_connection(target: Target) -> None:
    answer = parse_responses(exchange(target.handle, b"GET http://[::1/score HTTP/1.1\r\n\r\n"))
    assert [status for status, _, _ in answer] == [400]
