"""Totals-only Score responses written straight as protobuf wire bytes.

Appending 200 results with `results.add(...)` costs ~130 us per Score request, a tenth of the
server's whole work for a batch of 200 sentences. The same results written as bytes cost about
a microsecond in C (`_wire.c`) or ~25 us with numpy (`packed_text_scores`, the fallback and the
C code's reference), and the servicer answers with those bytes as they are (`score_response_bytes`;
the interceptor passes bytes through the response serializer), so nothing is parsed or serialized
again on the way out.

Each result is one fixed-size record of 19 bytes, the encoding of `ScoreResponse.results`
(field 2) holding one `TextScore`:

    0x12 0x11                    field 2, length-delimited, 17 bytes follow
    0x09 <8 bytes, LE double>    field 1 `log_prob` (fixed64)
    0x10 <3-byte varint>         field 2 `token_count`
    0x18 <3-byte varint>         field 3 `oov_count`

A varint padded to 3 bytes (continuation bits set on the first two) is valid protobuf that any
parser reads as the plain value, and so is a field written with its default value; once parsed,
the message is the same as one built field by field, and `SerializeToString` writes the same
canonical bytes. Three 7-bit groups hold counts up to 2**21 - 1; a batch with a larger (or a
negative) count returns None and the caller builds it the ordinary way.
"""

from __future__ import annotations

from typing import TypeVar, cast

import numpy as np
import numpy.typing as npt

try:  # the packing in C (`_wire.c`)
    from lmserve.server.worker.replies import _wire
except ImportError:  # not compiled (a source checkout without `make install`)
    _wire = None  # type: ignore[assignment]

# The largest count a 3-byte varint holds.
MAX_PACKED_COUNT = (1 << 21) - 1

_VARINT, _I64, _LEN = 0, 1, 2


def _key(field: int, wire_type: int) -> int:
    return (field << 3) | wire_type


# One record as three fields, so that it is filled with three stores: the 3 leading bytes, the
# double, and the two counts, each written as one little-endian uint32 (its key byte, then its
# 3-byte varint).
_RECORD = np.dtype([("head", "u1", (3,)), ("log_prob", "<f8"), ("counts", "<u4", (2,))])
assert _RECORD.itemsize == 19  # packed: no alignment padding between fields
_HEAD = np.array([_key(2, _LEN), _RECORD.itemsize - 2, _key(1, _I64)], dtype=np.uint8)
# The constant bits of each count's uint32: its key, and the continuation bits of varint
# bytes 0 and 1.
_COUNT_KEYS = np.array([[_key(2, _VARINT)], [_key(3, _VARINT)]], dtype=np.int64) | 0x808000


def packed_text_scores(
    log_probs: npt.NDArray[np.float64],
    token_counts: npt.NDArray[np.int64],
    oov_counts: npt.NDArray[np.int64],
) -> bytes | None:
    """The wire bytes of `results` holding one totals-only TextScore per text, to pass to
    `ScoreResponse.MergeFromString`; None when a count does not fit (see the module doc).

    Few numpy calls on purpose: in a busy server each costs several microseconds."""
    n = len(log_probs)
    # Row 0 the token counts, row 1 the OOV counts (np.stack would cost a dozen Python calls).
    counts = np.concatenate((token_counts, oov_counts)).reshape(2, n)
    # As unsigned, a negative count is huge: one comparison rejects both cases.
    if n and int(counts.view(np.uint64).max()) > MAX_PACKED_COUNT:
        return None
    # The varint's 7-bit groups v[0:7], v[7:14], v[14:21] go to bits 8, 16 and 24.
    words = (
        ((counts << 8) & 0x7F00)
        | ((counts << 9) & 0x7F0000)
        | ((counts << 10) & 0xFF000000)
        | _COUNT_KEYS
    )
    records = np.empty(n, dtype=_RECORD)
    records["head"] = _HEAD
    records["log_prob"] = log_probs
    records["counts"] = words.T
    return records.tobytes()


def pack_totals(
    log_probs: npt.NDArray[np.float64],
    token_counts: npt.NDArray[np.int64],
    oov_counts: npt.NDArray[np.int64],
) -> bytes | None:
    """`packed_text_scores`, in C when it is built (which takes float64 and int64 arrays)."""
    if _wire is not None:
        return _wire.pack_totals(
            _as(log_probs, np.float64), _as(token_counts, np.int64), _as(oov_counts, np.int64)
        )
    return packed_text_scores(log_probs, token_counts, oov_counts)


S = TypeVar("S", bound=np.generic)


def _as(values: npt.NDArray[np.generic], dtype: type[S]) -> npt.NDArray[S]:
    """`values` itself when it already is a C-contiguous array of `dtype` (the scorers' case:
    no numpy call), else a converted copy."""
    if values.dtype == dtype and values.flags.c_contiguous:
        return cast("npt.NDArray[S]", values)  # of `dtype`: just checked
    return np.ascontiguousarray(values, dtype=dtype)


def string_field(field: int, value: str) -> bytes:
    """The wire bytes of a string field (key, length varint, UTF-8)."""
    data = value.encode()
    return bytes([_key(field, _LEN)]) + _varint(len(data)) + data


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
