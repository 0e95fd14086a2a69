"""The KServe v2 inference codec, as Triton and PyTriton speak it: pure bytes <-> numpy, no I/O.

Both tensor encodings are handled in both directions: plain JSON `data`, and the binary tensor data
extension (a JSON header of `Inference-Header-Content-Length` bytes, then the raw tensors back to back,
little-endian; a BYTES element is a 4-byte little-endian length followed by its bytes).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[Any]

HEADER_LENGTH = "Inference-Header-Content-Length"

# KServe datatype -> numpy dtype (little-endian, as on the wire). BYTES is held as an object array of bytes.
DTYPES: dict[str, np.dtype[Any]] = {
    "BOOL": np.dtype("?"),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}
_MAX_NESTING = 32


class KServeError(ValueError):
    """The request (or response) breaks the protocol; the message says where. Maps to HTTP 400."""


@dataclass(frozen=True)
class RequestedOutput:
    name: str
    binary: bool | None = None  # None: follow the request's `binary_data_output`


@dataclass(frozen=True)
class InferRequest:
    inputs: dict[str, Array]
    outputs: tuple[RequestedOutput, ...] | None  # None: every output the model has
    binary_data_output: bool = False
    id: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)

    def wants_binary(self, output: str) -> bool:
        for requested in self.outputs or ():
            if requested.name == output and requested.binary is not None:
                return requested.binary
        return self.binary_data_output


def datatype_of(array: Array) -> str:
    """The KServe datatype name of a numpy array (object arrays are BYTES)."""
    if array.dtype == object or array.dtype.kind in "SU":
        return "BYTES"
    for name, dtype in DTYPES.items():
        if name != "BYTES" and array.dtype.kind == dtype.kind and array.dtype.itemsize == dtype.itemsize:
            return name
    raise KServeError(f"numpy dtype {array.dtype} has no KServe datatype")


def serialize_bytes(array: Array) -> bytes:
    """A BYTES tensor -> its binary form: each element as <u32 length><bytes>, in row-major order."""
    parts = []
    for item in array.reshape(-1):
        raw = item.encode("utf-8") if isinstance(item, str) else bytes(item)
        parts += [struct.pack("<I", len(raw)), raw]
    return b"".join(parts)


def deserialize_bytes(raw: bytes, count: int, where: str) -> list[bytes]:
    """The inverse of `serialize_bytes` for exactly `count` elements filling all of `raw`."""
    items, offset = [], 0
    while offset < len(raw):
        if offset + 4 > len(raw):
            raise KServeError(f"{where}: truncated BYTES length prefix at byte {offset}")
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + length > len(raw):
            raise KServeError(f"{where}: BYTES element of {length} bytes runs past the end of its data")
        items.append(raw[offset : offset + length])
        offset += length
    if len(items) != count:
        raise KServeError(f"{where}: shape says {count} elements but the data holds {len(items)}")
    return items


def _reshape(array: Array, shape: Sequence[int], where: str) -> Array:
    """numpy refuses some shapes whatever the data ([0, 10**20], more than 64 dimensions): that is a 400."""
    try:
        return array.reshape(tuple(shape))
    except ValueError as exc:
        raise KServeError(f"{where}: shape {list(shape)} is not possible: {exc}") from exc


def _object_array(items: Sequence[object], shape: Sequence[int], where: str) -> Array:
    array = np.empty(len(items), dtype=object)
    array[:] = list(items)
    return _reshape(array, shape, where)


def _flatten(data: object, where: str, depth: int = 0) -> list[object]:
    if depth > _MAX_NESTING:
        raise KServeError(f"{where}: data is nested more than {_MAX_NESTING} deep")
    if isinstance(data, list):
        out: list[object] = []
        for item in data:
            out += _flatten(item, where, depth + 1) if isinstance(item, list) else [item]
        return out
    return [data]


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _json_element_ok(datatype: str, value: object) -> bool:
    if datatype == "BOOL":
        return isinstance(value, bool)
    if datatype == "BYTES":
        return isinstance(value, str)
    if datatype.startswith(("INT", "UINT")):
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, int | float) and not isinstance(value, bool)


def _shape(entry: Mapping[str, Any], where: str) -> tuple[int, ...]:
    shape = entry.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise KServeError(f"{where}: 'shape' must be a list of integers, got {shape!r}")
    if any(d < 0 for d in shape):
        raise KServeError(f"{where}: 'shape' {shape} has a negative dimension")
    return tuple(shape)


ShapeCheck = Callable[[str, str, tuple[int, ...]], None]


def _decode_tensor(
    entry: object, kind: str, binary: memoryview, offset: int, check: ShapeCheck | None = None
) -> tuple[str, Array, int]:
    """One JSON tensor entry (+ its slice of the binary section) -> (name, array, next binary offset). `check`
    sees (name, datatype, shape) before the data is decoded, and may raise to refuse it."""
    if not isinstance(entry, dict):
        raise KServeError(f"each {kind} must be a JSON object, got {type(entry).__name__}")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise KServeError(f"a {kind} has no 'name'")
    where = f"{kind} {name!r}"
    datatype = entry.get("datatype")
    if not isinstance(datatype, str) or datatype not in DTYPES:  # a list here is unhashable: check first
        raise KServeError(f"{where}: unsupported datatype {datatype!r} (supported: {', '.join(DTYPES)})")
    shape = _shape(entry, where)
    if check is not None:
        check(name, datatype, shape)
    count = math.prod(shape)
    parameters = entry.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise KServeError(f"{where}: 'parameters' must be an object")
    if "shared_memory_region" in parameters:
        raise KServeError(f"{where}: the shared-memory extension is not supported")
    size = parameters.get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise KServeError(f"{where}: 'binary_data_size' must be a non-negative integer")
        if offset + size > len(binary):
            raise KServeError(f"{where}: binary_data_size {size} runs past the end of the body")
        raw = bytes(binary[offset : offset + size])
        if datatype == "BYTES":
            return name, _object_array(deserialize_bytes(raw, count, where), shape, where), offset + size
        dtype = DTYPES[datatype]
        if size != count * dtype.itemsize:
            raise KServeError(
                f"{where}: shape {list(shape)} of {datatype} needs {count * dtype.itemsize} bytes, got {size}"
            )
        array = np.frombuffer(raw, dtype=dtype).astype(dtype.newbyteorder("="))
        return name, _reshape(array, shape, where), offset + size
    if "data" not in entry:
        raise KServeError(f"{where}: neither 'data' nor parameters.binary_data_size is given")
    flat = _flatten(entry["data"], where)
    if len(flat) != count:
        raise KServeError(f"{where}: shape {list(shape)} needs {count} elements, 'data' has {len(flat)}")
    for index, value in enumerate(flat):
        if not _json_element_ok(datatype, value):
            raise KServeError(f"{where}: element {index} ({_short(value)}) is not a valid {datatype} value")
    if datatype == "BYTES":
        try:
            items = [str(v).encode("utf-8") for v in flat]
        except UnicodeEncodeError as exc:  # JSON can spell a lone surrogate ("\ud800"); UTF-8 cannot
            raise KServeError(f"{where}: a string is not valid Unicode: {exc.reason}") from exc
        return name, _object_array(items, shape, where), offset
    try:
        with np.errstate(over="raise"):  # e.g. 1e300 as FP32: refuse it rather than score an inf
            array = np.asarray(flat, dtype=DTYPES[datatype].newbyteorder("="))
    except (OverflowError, ValueError, FloatingPointError) as exc:
        raise KServeError(f"{where}: data does not fit {datatype}: {exc}") from exc
    return name, _reshape(array, shape, where), offset


def _split_body(body: bytes, header_length: int | None) -> tuple[dict[str, Any], memoryview]:
    if header_length is None:
        header_length = len(body)
    if not 0 < header_length <= len(body):
        raise KServeError(f"{HEADER_LENGTH} {header_length} does not fit a body of {len(body)} bytes")
    try:
        header = json.loads(bytes(body[:header_length]))
    except (ValueError, RecursionError) as exc:  # ValueError also: an integer of more than 4300 digits
        raise KServeError(f"the JSON header is not valid JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise KServeError("the JSON header must be an object")
    return header, memoryview(body)[header_length:]


def _decode_tensors(
    entries: object, kind: str, binary: memoryview, check: ShapeCheck | None = None
) -> dict[str, Array]:
    if not isinstance(entries, list):
        raise KServeError(f"'{kind}s' must be a list")
    tensors: dict[str, Array] = {}
    offset = 0
    for entry in entries:
        name, array, offset = _decode_tensor(entry, kind, binary, offset, check)
        if name in tensors:
            raise KServeError(f"{kind} {name!r} is given twice")
        tensors[name] = array
    if offset != len(binary):
        raise KServeError(f"{len(binary) - offset} bytes of binary data are not claimed by any {kind}")
    return tensors


def decode_infer_request(
    body: bytes, header_length: int | None = None, check: ShapeCheck | None = None
) -> InferRequest:
    """Parse an inference request body (JSON, or JSON header + binary tensors). `check(name, datatype, shape)`
    runs for each input before its data is decoded (a server's size limits: refuse before the memory is spent)."""
    header, binary = _split_body(body, header_length)
    if "inputs" not in header:
        raise KServeError("the request has no 'inputs'")
    inputs = _decode_tensors(header["inputs"], "input", binary, check)
    parameters = header.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise KServeError("'parameters' must be an object")
    outputs: tuple[RequestedOutput, ...] | None = None
    if header.get("outputs"):
        if not isinstance(header["outputs"], list):
            raise KServeError("'outputs' must be a list")
        requested = []
        for entry in header["outputs"]:
            if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
                raise KServeError("each requested output must be an object with a 'name'")
            params = entry.get("parameters") or {}
            if not isinstance(params, dict):
                raise KServeError(f"output {entry['name']!r}: 'parameters' must be an object")
            unsupported = {"classification", "shared_memory_region"} & params.keys()
            if unsupported:
                raise KServeError(f"output {entry['name']!r}: {sorted(unsupported)} not supported")
            binary_flag = params.get("binary_data")
            requested.append(
                RequestedOutput(entry["name"], None if binary_flag is None else bool(binary_flag))
            )
        outputs = tuple(requested)
    request_id = header.get("id")
    return InferRequest(
        inputs=inputs,
        outputs=outputs,
        binary_data_output=bool(parameters.get("binary_data_output", False)),
        id=str(request_id) if request_id is not None else None,
        parameters=parameters,
    )


def _encode_tensors(
    tensors: Mapping[str, Array], binary: Mapping[str, bool]
) -> tuple[list[dict[str, Any]], bytes]:
    entries, raw_parts = [], []
    for name, array in tensors.items():
        datatype = datatype_of(array)
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if binary.get(name, False):
            if datatype == "BYTES":
                raw = serialize_bytes(array)
            else:
                raw = np.ascontiguousarray(array, dtype=DTYPES[datatype]).tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            raw_parts.append(raw)
        elif datatype == "BYTES":
            entry["data"] = [
                v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in array.reshape(-1).tolist()
            ]
        else:
            entry["data"] = array.reshape(-1).tolist()
        entries.append(entry)
    return entries, b"".join(raw_parts)


def _join(header: dict[str, Any], raw: bytes) -> tuple[bytes, int | None]:
    text = json.dumps(header, allow_nan=False, separators=(",", ":")).encode("utf-8")
    return (text + raw, len(text)) if raw else (text, None)


def encode_infer_response(
    *,
    model_name: str,
    model_version: str,
    outputs: Mapping[str, Array],
    binary: Mapping[str, bool],
    request_id: str | None = None,
) -> tuple[bytes, int | None]:
    """Response tensors -> (body, header length or None when the body is plain JSON)."""
    entries, raw = _encode_tensors(outputs, binary)
    header: dict[str, Any] = {"model_name": model_name, "model_version": model_version, "outputs": entries}
    if request_id is not None:
        header["id"] = request_id
    return _join(header, raw)


def encode_infer_request(
    inputs: Mapping[str, Array],
    *,
    binary_inputs: bool = True,
    outputs: Sequence[RequestedOutput] | None = None,
    binary_data_output: bool = True,
) -> tuple[bytes, int | None]:
    """Request tensors -> (body, header length or None), as tritonclient would send them."""
    entries, raw = _encode_tensors(inputs, dict.fromkeys(inputs, binary_inputs))
    header: dict[str, Any] = {"inputs": entries}
    if outputs:
        header["outputs"] = [
            {"name": o.name, **({"parameters": {"binary_data": o.binary}} if o.binary is not None else {})}
            for o in outputs
        ]
    else:
        header["parameters"] = {"binary_data_output": binary_data_output}
    return _join(header, raw)


def decode_infer_response(body: bytes, header_length: int | None = None) -> dict[str, Array]:
    """Parse an inference response body into {output name: array}."""
    header, binary = _split_body(body, header_length)
    if "error" in header:
        raise KServeError(f"the server reported an error: {header['error']}")
    return _decode_tensors(header.get("outputs"), "output", binary)
