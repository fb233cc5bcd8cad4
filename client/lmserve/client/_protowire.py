"""A few lines of the protobuf wire format, for the two messages the client reads without their
generated classes: `grpc.health.v1` Check and `google.rpc.Status` (RetryInfo).

Their stubs live in grpcio-health-checking and googleapis-common-protos; reading the three fields
the client needs here keeps the client's dependencies to grpcio and protobuf.
"""

from __future__ import annotations

from collections.abc import Iterator

VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5


class WireError(ValueError):
    """Bytes that are not a well-formed protobuf message."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise WireError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of each field in order: an int for varint and fixed fields, the raw
    bytes for length-delimited ones. Raises WireError on malformed input."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, kind = key >> 3, key & 7
        value: int | bytes
        if kind == VARINT:
            value, pos = _varint(data, pos)
        elif kind in (FIXED64, FIXED32):
            width = 8 if kind == FIXED64 else 4
            if pos + width > len(data):
                raise WireError("truncated fixed field")
            value = int.from_bytes(data[pos : pos + width], "little")
            pos += width
        elif kind == LENGTH:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise WireError("truncated length-delimited field")
            value = data[pos : pos + length]
            pos += length
        else:
            raise WireError(f"unsupported wire type {kind}")
        yield number, value


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_bytes_field(number: int, value: bytes) -> bytes:
    """One length-delimited field (a string, bytes or an embedded message)."""
    return encode_varint(number << 3 | LENGTH) + encode_varint(len(value)) + value
