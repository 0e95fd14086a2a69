"""The reward server over real HTTP: KServe v2 with tritonclient (binary and JSON), raw JSON, /score, batching."""

from __future__ import annotations

import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import pytest
import tritonclient.http as triton_http
from transformers import PreTrainedTokenizerFast

from nemotron.reward.client import RewardClient
from nemotron.reward.metrics import parse_samples
from nemotron.reward.scorer import Scorer
from nemotron.reward.server import FULL_BATCHES, serve
from nemotron.reward.transport import ServerHandle

TritonFactory = Callable[[ServerHandle], triton_http.InferenceServerClient]
SENTENCES = ["the movie was great", "bad", "fun plot and good acting", "it was very very boring"]


def http_call(
    url: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    method: str | None = None,
) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url + path, data=body, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers.items()), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers.items()), exc.read()


def metrics(handle: ServerHandle) -> dict[str, float]:
    status, _, body = http_call(handle.url, "/metrics")
    assert status == 200
    return parse_samples(body.decode())


def _bytes(items: list[str]) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = [s.encode() for s in items]
    return array


def test_health_and_metadata_via_tritonclient(
    model_server: ServerHandle, triton_client: TritonFactory
) -> None:
    client = triton_client(model_server)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("reward_model")
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]
    metadata = client.get_model_metadata("reward_model")
    assert {t["name"]: (t["datatype"], t["shape"]) for t in metadata["inputs"]} == {
        "sentences": ("BYTES", [-1]),
        "tokens": ("INT64", [-1, -1]),
        "sequence_lengths": ("INT64", [-1]),
    }
    assert metadata["outputs"] == [{"name": "rewards", "datatype": "FP32", "shape": [-1, 1]}]
    assert client.get_model_config("reward_model")["dynamic_batching"]["preferred_batch_size"] == [8]
    assert not client.is_model_ready("other_model")


@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_infer_sentences(
    model_server: ServerHandle, model_scorer: Scorer, triton_client: TritonFactory, binary: bool
) -> None:
    expected = [model_scorer.score_sentences([s])[0] for s in SENTENCES]  # one at a time: no batching at all
    sentences = triton_http.InferInput("sentences", [len(SENTENCES)], "BYTES")
    sentences.set_data_from_numpy(_bytes(SENTENCES), binary_data=binary)
    outputs = [triton_http.InferRequestedOutput("rewards", binary_data=binary)]
    result = triton_client(model_server).infer(
        "reward_model", [sentences], outputs=outputs, request_id="req-7"
    )
    rewards = result.as_numpy("rewards")
    assert rewards.shape == (len(SENTENCES), 1) and rewards.dtype == np.float32
    np.testing.assert_allclose(rewards[:, 0], expected, rtol=1e-5, atol=1e-6)
    assert result.get_response()["id"] == "req-7"
    output = result.get_output("rewards")
    assert ("binary_data_size" in output.get("parameters", {})) is binary


def test_tritonclient_infer_tokens_and_gzip(
    model_server: ServerHandle,
    model_scorer: Scorer,
    tokenizer: PreTrainedTokenizerFast,
    triton_client: TritonFactory,
) -> None:
    rows = [tokenizer(s)["input_ids"] for s in SENTENCES]
    tokens = np.zeros((len(rows), max(map(len, rows))), dtype=np.int64)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = row
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    inputs = [
        triton_http.InferInput("tokens", list(tokens.shape), "INT64"),
        triton_http.InferInput("sequence_lengths", [len(rows)], "INT64"),
    ]
    inputs[0].set_data_from_numpy(tokens)
    inputs[1].set_data_from_numpy(lengths)
    result = triton_client(model_server).infer("reward_model", inputs, request_compression_algorithm="gzip")
    np.testing.assert_allclose(
        result.as_numpy("rewards")[:, 0], model_scorer.score_sentences(SENTENCES), rtol=1e-5, atol=1e-6
    )


def test_pytriton_layout_b_by_1_is_accepted(model_server: ServerHandle, model_scorer: Scorer) -> None:
    """NeMo-Aligner's PyTriton clients send sentences (and sequence_lengths) as [B, 1]."""
    body = json.dumps(
        {
            "inputs": [
                {"name": "sentences", "datatype": "BYTES", "shape": [2, 1], "data": [["bad"], ["fun plot"]]}
            ]
        }
    ).encode()
    status, _, response = http_call(model_server.url, "/v2/models/reward_model/infer", body)
    assert status == 200
    rewards = json.loads(response)["outputs"][0]["data"]
    np.testing.assert_allclose(
        rewards, model_scorer.score_sentences(["bad", "fun plot"]), rtol=1e-5, atol=1e-6
    )


def test_raw_json_infer_and_score_endpoint(model_server: ServerHandle, model_scorer: Scorer) -> None:
    body = json.dumps(
        {
            "inputs": [{"name": "sentences", "datatype": "BYTES", "shape": [2], "data": SENTENCES[:2]}],
            "outputs": [{"name": "rewards"}],
        }
    ).encode()
    status, headers, response = http_call(
        model_server.url,
        "/v2/models/reward_model/versions/1/infer",
        body,
        {"Content-Type": "application/json"},
    )
    assert status == 200 and "Inference-Header-Content-Length" not in headers
    payload = json.loads(response)
    assert payload["model_name"] == "reward_model"
    assert payload["outputs"][0]["shape"] == [2, 1]
    expected = model_scorer.score_sentences(SENTENCES[:2])
    np.testing.assert_allclose(payload["outputs"][0]["data"], expected, rtol=1e-5, atol=1e-6)

    status, _, response = http_call(
        model_server.url, "/score", json.dumps({"sentences": SENTENCES[:2]}).encode()
    )
    assert status == 200
    np.testing.assert_allclose(json.loads(response)["rewards"], expected, rtol=1e-5, atol=1e-6)


def test_keep_alive_connection_serves_several_requests(model_server: ServerHandle) -> None:
    connection = http.client.HTTPConnection(model_server.host, model_server.port, timeout=10)
    try:
        for sentence in SENTENCES[:3]:
            connection.request("POST", "/score", json.dumps({"sentences": [sentence]}))
            response = connection.getresponse()
            assert response.status == 200 and len(json.loads(response.read())["rewards"]) == 1
    finally:
        connection.close()


def test_concurrent_callers_are_batched_and_get_their_own_results(
    model_server: ServerHandle, model_scorer: Scorer
) -> None:
    sentences = [" ".join(["good"] * (1 + i % 5) + ["bad"] * (i % 3)) for i in range(32)]
    expected = [model_scorer.score_sentences([s])[0] for s in sentences]
    client = RewardClient(model_server.url, retries=0)
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda s: client.score([s]), sentences))
    np.testing.assert_allclose([r[0] for r in results], expected, rtol=1e-5, atol=1e-6)
    samples = metrics(model_server)
    batches = samples["nemotron_reward_batch_size_count"]
    rows = samples["nemotron_reward_batch_size_sum"]
    assert rows == 32
    assert batches < 32, f"{batches} model calls for 32 single-row requests: nothing was batched"
    assert samples['nemotron_reward_batch_size_bucket{le="1"}'] < batches  # some batch held more than one row
    assert samples['nemotron_reward_batch_size_bucket{le="16"}'] == batches  # never above max_batch_size=16
    assert samples['nemotron_reward_http_requests_total{code="200",endpoint="infer"}'] == 32
    assert samples["nemotron_reward_http_request_seconds_count" + '{endpoint="infer"}'] == 32


def _infer_json(inputs: list[dict[str, object]]) -> bytes:
    return json.dumps({"inputs": inputs}).encode()


def _tensor(name: str, datatype: str, shape: list[int], data: list[object]) -> dict[str, object]:
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


def _bad_infer(
    message: str, *inputs: dict[str, object], headers: dict[str, str] | None = None
) -> tuple[str, bytes, dict[str, str], int, str]:
    """A KServe infer request of `inputs` that the server refuses with 400 and `message`."""
    return ("/v2/models/reward_model/infer", _infer_json(list(inputs)), headers or {}, 400, message)


BAD_REQUESTS = [
    ("/v2/models/reward_model/infer", b"{oops", {}, 400, "not valid JSON"),
    _bad_infer("must be BYTES", _tensor("sentences", "FP32", [1], [1.0])),
    _bad_infer("shape [B] or [B, 1]", _tensor("sentences", "BYTES", [2, 2], ["a", "b", "c", "d"])),
    _bad_infer("needs 3 elements", _tensor("sentences", "BYTES", [3], ["a"])),
    _bad_infer("needs 'sequence_lengths'", _tensor("tokens", "INT64", [1, 2], [1, 2])),
    _bad_infer(
        "outside",
        _tensor("tokens", "INT64", [1, 2], [1, 99999]),
        _tensor("sequence_lengths", "INT64", [1], [2]),
    ),
    _bad_infer(
        "sequence length",
        _tensor("tokens", "INT64", [1, 2], [1, 2]),
        _tensor("sequence_lengths", "INT64", [1], [3]),
    ),
    _bad_infer("unknown inputs", _tensor("images", "FP32", [1], [1.0])),
    _bad_infer("empty", _tensor("sentences", "BYTES", [1], [""])),
    _bad_infer(
        "Inference-Header-Content-Length",
        _tensor("sentences", "BYTES", [1], ["a"]),
        headers={"Inference-Header-Content-Length": "banana"},
    ),
    ("/v2/models/other/infer", _infer_json([]), {}, 404, "unknown model"),
    ("/v2/models/reward_model/versions/2/infer", _infer_json([]), {}, 404, "only version 1"),
    ("/nowhere", b"{}", {}, 404, "no endpoint"),
    ("/score", json.dumps({"sentences": "not a list"}).encode(), {}, 400, "list of non-empty strings"),
    ("/score", json.dumps({"sentences": ["a"], "extra": 1}).encode(), {}, 400, "expected"),
    ("/score", b"\xff\xfe", {}, 400, "not valid JSON"),
    ("/score", b"{}", {"Content-Encoding": "br"}, 415, "not supported"),
    ("/score", b"{}", {"Content-Encoding": "gzip"}, 400, "does not decompress"),
]


@pytest.mark.parametrize(("path", "body", "headers", "status", "message"), BAD_REQUESTS)
def test_malformed_requests_get_4xx_json_and_the_server_stays_healthy(
    model_server: ServerHandle, path: str, body: bytes, headers: dict[str, str], status: int, message: str
) -> None:
    got, _, response = http_call(model_server.url, path, body, headers)
    assert got == status
    assert message in json.loads(response)["error"]
    assert RewardClient(model_server.url, retries=0).score(["good"])  # still serving
    assert http_call(model_server.url, "/v2/health/ready")[0] == 200


def test_wrong_method_is_405(model_server: ServerHandle) -> None:
    assert http_call(model_server.url, "/v2/models/reward_model/infer")[0] == 405
    assert http_call(model_server.url, "/score")[0] == 405
    assert http_call(model_server.url, "/v2/health/ready", b"{}")[0] == 405


def test_scoring_that_takes_too_long_is_504_and_the_server_keeps_serving() -> None:
    def slow_for_the_first(sentences: list[str]) -> list[float]:
        if "slow" in sentences:
            time.sleep(1.0)
        return [float(len(s)) for s in sentences]

    with serve(
        slow_for_the_first, batching=replace(FULL_BATCHES, max_queue_delay_ms=0.0), request_timeout_s=0.3
    ) as handle:
        started = time.monotonic()
        status, _, body = http_call(handle.url, "/score", json.dumps({"sentences": ["slow"]}).encode())
        assert status == 504 and "score took longer than 0.3 s" in json.loads(body)["error"]
        assert time.monotonic() - started < 0.9  # answered at the timeout, not when the model finished
        time.sleep(1.0)  # the model call itself cannot be interrupted; then the next request is served
        assert RewardClient(handle.url, retries=0).score(["abc"]) == [3.0]
