"""The KServe v2 codec: hand-built bodies, cross-checks against tritonclient's own encoder, and malformed input."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import tritonclient.http as triton_http
from hypothesis import given
from hypothesis import strategies as st
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from nemotron.reward.kserve import (
    InferRequest,
    KServeError,
    RequestedOutput,
    decode_infer_request,
    decode_infer_response,
    deserialize_bytes,
    encode_infer_request,
    encode_infer_response,
    serialize_bytes,
)


def _bytes_array(items: list[bytes]) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


def test_bytes_elements_are_little_endian_length_prefixed() -> None:
    # b"ab" -> length 2 as <u32 = 02 00 00 00, then 'a' 'b'; b"" -> 00 00 00 00 and nothing.
    assert serialize_bytes(_bytes_array([b"ab", b""])) == b"\x02\x00\x00\x00ab\x00\x00\x00\x00"
    assert deserialize_bytes(b"\x02\x00\x00\x00ab\x00\x00\x00\x00", 2, "x") == [b"ab", b""]


def test_bytes_serialization_matches_tritonclient() -> None:
    array = _bytes_array([b"hello", "h\u00e9".encode(), b""])
    assert serialize_bytes(array) == serialize_byte_tensor(array).item()
    assert deserialize_bytes_tensor(serialize_bytes(array)).tolist() == array.tolist()


def test_json_request_with_nested_data() -> None:
    body = json.dumps(
        {
            "id": "r1",
            "inputs": [
                {"name": "tokens", "datatype": "INT64", "shape": [2, 2], "data": [[1, 2], [3, 4]]},
                {"name": "sentences", "datatype": "BYTES", "shape": [1], "data": ["hi"]},
            ],
            "outputs": [{"name": "rewards", "parameters": {"binary_data": True}}],
        }
    ).encode()
    request = decode_infer_request(body)
    assert request.id == "r1"
    assert request.inputs["tokens"].tolist() == [[1, 2], [3, 4]]
    assert request.inputs["tokens"].dtype == np.int64
    assert request.inputs["sentences"].tolist() == [b"hi"]
    assert request.wants_binary("rewards") is True


def test_binary_request_built_by_hand() -> None:
    raw = struct.pack("<2f", 1.5, -2.0)  # 8 bytes: two little-endian float32
    header = json.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}}]}
    ).encode()
    request = decode_infer_request(header + raw, len(header))
    assert request.inputs["x"].tolist() == [1.5, -2.0]


def test_tritonclient_request_bodies_decode() -> None:
    tokens = np.array([[5, 6, 7], [8, 9, 0]], dtype=np.int64)
    sentences = _bytes_array([b"good movie", b"bad"])
    for binary in (True, False):
        inputs = [
            triton_http.InferInput("tokens", list(tokens.shape), "INT64"),
            triton_http.InferInput("sentences", [2], "BYTES"),
        ]
        inputs[0].set_data_from_numpy(tokens, binary_data=binary)
        inputs[1].set_data_from_numpy(sentences, binary_data=binary)
        outputs = [triton_http.InferRequestedOutput("rewards", binary_data=not binary)]
        body, header_length = triton_http.InferenceServerClient.generate_request_body(inputs, outputs=outputs)
        request = decode_infer_request(body, header_length)
        assert request.inputs["tokens"].tolist() == tokens.tolist()
        assert request.inputs["sentences"].tolist() == sentences.tolist()
        assert request.wants_binary("rewards") is (not binary)


def test_tritonclient_parses_our_responses() -> None:
    rewards = np.array([[0.25], [-1.0]], dtype=np.float32)
    for binary in (True, False):
        body, header_length = encode_infer_response(
            model_name="m", model_version="1", outputs={"rewards": rewards}, binary={"rewards": binary}
        )
        assert (header_length is not None) is binary
        result = triton_http.InferenceServerClient.parse_response_body(body, header_length=header_length)
        assert result.as_numpy("rewards").tolist() == rewards.tolist()


def test_our_request_and_response_round_trip() -> None:
    inputs = {"sentences": _bytes_array([b"a", b"bc"]), "lengths": np.array([1, 2], dtype=np.int64)}
    body, header_length = encode_infer_request(inputs, binary_inputs=True)
    request = decode_infer_request(body, header_length)
    assert request.inputs["sentences"].tolist() == [b"a", b"bc"]
    assert request.inputs["lengths"].tolist() == [1, 2]
    assert request.binary_data_output is True
    body, header_length = encode_infer_response(
        model_name="m", model_version="1", outputs=inputs, binary={"sentences": True, "lengths": False}
    )
    decoded = decode_infer_response(body, header_length)
    assert decoded["sentences"].tolist() == [b"a", b"bc"]
    assert decoded["lengths"].tolist() == [1, 2]


def test_per_output_binary_flag_overrides_binary_data_output() -> None:
    request = InferRequest(
        inputs={}, outputs=(RequestedOutput("a", False), RequestedOutput("b")), binary_data_output=True
    )
    assert request.wants_binary("a") is False
    assert request.wants_binary("b") is True  # no flag of its own: the request-wide default
    assert request.wants_binary("c") is True


def _nested(depth: int) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


def _json_input(**fields: object) -> bytes:
    entry = {"name": "x", "datatype": "INT64", "shape": [2], "data": [1, 2]} | fields
    return json.dumps({"inputs": [entry]}).encode()


@pytest.mark.parametrize(
    ("body", "header_length", "message"),
    [
        (b"{not json", None, "not valid JSON"),
        (b"[1, 2]", None, "must be an object"),
        (b"{}", None, "no 'inputs'"),
        (_json_input(shape=[3]), None, "needs 3 elements"),
        (_json_input(shape=[-2]), None, "negative"),
        (_json_input(shape="2"), None, "list of integers"),
        (_json_input(data=[1, 1.5]), None, "element 1"),
        (_json_input(data=[1, True]), None, "element 1"),
        (_json_input(datatype="BF16"), None, "unsupported datatype"),
        (_json_input(data=None, parameters={"binary_data_size": 16}), None, "runs past the end"),
        (_json_input(parameters={"shared_memory_region": "r"}), None, "shared-memory"),
        (_json_input(), 10_000, "does not fit"),
        (_json_input(datatype="FP32", data=[1.0, 1e300]), None, "does not fit FP32"),  # would be inf
        (b"[" * 5000 + b"]" * 5000, None, "not valid JSON"),
        (_json_input(data=[_nested(34), 2]), None, "nested"),
    ],
)
def test_malformed_requests_raise_kserve_error(body: bytes, header_length: int | None, message: str) -> None:
    with pytest.raises(KServeError, match=message):
        decode_infer_request(body, header_length)


def test_unclaimed_binary_bytes_are_an_error() -> None:
    header = json.dumps(
        {"inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "parameters": {"binary_data_size": 4}}]}
    ).encode()
    with pytest.raises(KServeError, match="2 bytes of binary data are not claimed"):
        decode_infer_request(header + b"\x01\x00\x00\x00" + b"zz", len(header))


def test_binary_size_must_match_shape() -> None:
    header = json.dumps(
        {"inputs": [{"name": "x", "datatype": "INT64", "shape": [2], "parameters": {"binary_data_size": 8}}]}
    ).encode()
    with pytest.raises(KServeError, match="needs 16 bytes, got 8"):
        decode_infer_request(header + bytes(8), len(header))


def test_truncated_bytes_element_is_an_error() -> None:
    raw = b"\x09\x00\x00\x00abc"  # claims 9 bytes, holds 3
    header = json.dumps(
        {
            "inputs": [
                {"name": "s", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": len(raw)}}
            ]
        }
    ).encode()
    with pytest.raises(KServeError, match="runs past the end of its data"):
        decode_infer_request(header + raw, len(header))


@given(st.lists(st.binary(max_size=20), max_size=10), st.lists(st.integers(-(2**63), 2**63 - 1), max_size=10))
def test_round_trip_property(strings: list[bytes], ints: list[int]) -> None:
    inputs = {"s": _bytes_array(strings), "i": np.array(ints, dtype=np.int64)}
    for binary in (True, False):
        if not binary and any(not _utf8(s) for s in strings):
            continue  # JSON carries BYTES as text, so only UTF-8 survives it
        body, header_length = encode_infer_request(inputs, binary_inputs=binary)
        request = decode_infer_request(body, header_length)
        assert request.inputs["s"].tolist() == strings
        assert request.inputs["i"].tolist() == ints


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
