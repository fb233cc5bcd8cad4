"""Totals-only `TextScore`s packed straight into protobuf wire format with numpy.

Appending 200 results with `results.add(...)` costs ~130 us per Score request, a tenth of the
server's whole work for a batch of 200 sentences. Writing the same results as bytes with a few
vectorized numpy stores and letting upb parse them (`MergeFromString`) costs ~35 us.

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

import numpy as np
import numpy.typing as npt

# The largest count a 3-byte varint holds.
MAX_PACKED_COUNT = (1 << 21) - 1

_RECORD = np.dtype(
    [
        ("key", "u1"),
        ("length", "u1"),
        ("log_prob_key", "u1"),
        ("log_prob", "<f8"),
        ("token_count_key", "u1"),
        ("token_count", "u1", (3,)),
        ("oov_count_key", "u1"),
        ("oov_count", "u1", (3,)),
    ]
)
assert _RECORD.itemsize == 19  # packed: no alignment padding between fields


def _key(field: int, wire_type: int) -> int:
    return (field << 3) | wire_type


_VARINT, _I64, _LEN = 0, 1, 2


def _put_varint3(out: npt.NDArray[np.uint8], values: npt.NDArray[np.int64]) -> None:
    """`values` (0 <= v < 2**21) as 3-byte varints into the (n, 3) byte array `out`."""
    out[:, 0] = (values & 0x7F) | 0x80
    out[:, 1] = ((values >> 7) & 0x7F) | 0x80
    out[:, 2] = values >> 14


def packed_text_scores(
    log_probs: npt.NDArray[np.float64],
    token_counts: npt.NDArray[np.int64],
    oov_counts: npt.NDArray[np.int64],
) -> bytes | None:
    """The wire bytes of `results` holding one totals-only TextScore per text, to pass to
    `ScoreResponse.MergeFromString`; None when a count does not fit (see the module doc)."""
    n = len(log_probs)
    if n and (
        int(token_counts.max()) > MAX_PACKED_COUNT
        or int(oov_counts.max()) > MAX_PACKED_COUNT
        or int(token_counts.min()) < 0
        or int(oov_counts.min()) < 0
    ):
        return None
    records = np.empty(n, dtype=_RECORD)
    records["key"] = _key(2, _LEN)
    records["length"] = _RECORD.itemsize - 2
    records["log_prob_key"] = _key(1, _I64)
    records["log_prob"] = log_probs
    records["token_count_key"] = _key(2, _VARINT)
    _put_varint3(records["token_count"], token_counts)
    records["oov_count_key"] = _key(3, _VARINT)
    _put_varint3(records["oov_count"], oov_counts)
    return records.tobytes()
