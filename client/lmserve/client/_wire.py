"""Score responses read from their wire bytes: totals-only answers without protobuf objects.

An lmserve server writes a totals-only `ScoreResponse` as its `model` field followed by one
19-byte record per text (the server's `api/wire.py`):

    0x12 0x11                    field 2 `results`, length-delimited, 17 bytes follow
    0x09 <8 bytes, LE double>    field 1 `log_prob`
    0x10 <3-byte varint>         field 2 `token_count`
    0x18 <3-byte varint>         field 3 `oov_count`

Reading those with numpy (a few array operations per response) and making the `TextScore`s from
plain lists costs about half of what reading 200 results through upb message objects does, and
the rescoring client does this for every batch. Anything else (per-token details, a canonical
encoding from another server, a field this module does not know) is parsed by protobuf.

numpy is optional (the client installs with grpcio and protobuf only): without it the same
records are read with `struct`, giving identical TextScores, about as fast as protobuf is.
"""

from __future__ import annotations

import struct
from typing import Any

from lmserve.client.types import TextScore
from lmserve.v1 import lm_service_pb2 as pb

np: Any
try:
    import numpy as np
except ImportError:  # the client alone: the pure-Python reader below
    np = None

_SERVICE = pb.DESCRIPTOR.services_by_name["LanguageModelService"].full_name
SCORE_METHOD = f"/{_SERVICE}/Score"
SCORE_STREAM_METHOD = f"/{_SERVICE}/ScoreStream"

# One record: 3 head bytes, the little-endian double, two uint32 (key byte + 3 varint bytes).
_RECORD_SIZE = 19
_HEAD_BYTES = bytes([0x12, 0x11, 0x09])
# Each count's uint32: its key byte, then the varint's bytes. The fixed bits are the key, the
# continuation bits of the first two bytes (set) and that of the third (clear).
_FIXED_BIT_MASK = 0x808080FF
_FIXED_VALUE_PAIR = (0x00808010, 0x00808018)
_MODEL_KEY = 0x0A  # field 1, length-delimited
_PY_RECORD = struct.Struct("<3sdII")
if np is not None:
    _NP_RECORD = np.dtype([("head", "u1", (3,)), ("log_prob", "<f8"), ("counts", "<u4", (2,))])
    _NP_HEAD = np.frombuffer(_HEAD_BYTES, dtype=np.uint8)
    _NP_FIXED_BITS = np.array([_FIXED_BIT_MASK, _FIXED_BIT_MASK], dtype=np.uint32)
    _NP_FIXED_VALUES = np.array(_FIXED_VALUE_PAIR, dtype=np.uint32)

ScoreReply = list[TextScore] | pb.ScoreResponse


def read_score_response(data: bytes) -> ScoreReply:
    """The response's TextScores (totals only) when it is written as above, else the parsed
    message: a response deserializer for Score and ScoreStream."""
    totals = _read_totals(data)
    if totals is None:
        return pb.ScoreResponse.FromString(data)
    return totals


def _read_totals(data: bytes) -> list[TextScore] | None:
    start = 0
    if data[:1] == bytes([_MODEL_KEY]):
        length = data[1] if len(data) > 1 else 0x80
        if length >= 0x80:  # a name of 128 bytes or more: leave it to protobuf
            return None
        start = 2 + length
    if start > len(data) or (len(data) - start) % _RECORD_SIZE:
        return None
    reader = _read_records_numpy if np is not None else _read_records_python
    return reader(data, start)


def _count(word: int) -> int:
    """The 3-byte varint packed in a count's uint32 (above its key byte)."""
    return ((word >> 8) & 0x7F) | ((word >> 9) & 0x3F80) | ((word >> 10) & 0x1FC000)


def _read_records_python(data: bytes, start: int) -> list[TextScore] | None:
    scores = []
    tokens_key, oov_key = _FIXED_VALUE_PAIR
    for head, log_prob, tokens, oovs in _PY_RECORD.iter_unpack(memoryview(data)[start:]):
        if (
            head != _HEAD_BYTES
            or tokens & _FIXED_BIT_MASK != tokens_key
            or oovs & _FIXED_BIT_MASK != oov_key
        ):
            return None
        scores.append(TextScore.totals(log_prob, _count(tokens), _count(oovs)))
    return scores


def _read_records_numpy(data: bytes, start: int) -> list[TextScore] | None:
    records = np.frombuffer(data, dtype=_NP_RECORD, offset=start)
    counts = records["counts"]
    heads_ok = (records["head"] == _NP_HEAD).all()
    if len(records) and not (heads_ok and ((counts & _NP_FIXED_BITS) == _NP_FIXED_VALUES).all()):
        return None
    values = ((counts >> 8) & 0x7F) | ((counts >> 9) & 0x3F80) | ((counts >> 10) & 0x1FC000)
    return list(
        map(
            TextScore.totals,
            records["log_prob"].tolist(),
            values[:, 0].tolist(),
            values[:, 1].tolist(),
        )
    )
