"""The `.lmbin` file: an n-gram model's arrays laid out to be memory-mapped, not parsed.

Like KenLM's binary format (`lm/binary_format.cc`) it is the in-memory layout written to disk,
so loading is an `mmap` plus a header check, a few milliseconds for any size of model.

    offset 0   magic b"LMSNGRAM", u32 version, u32 header length, u32 crc32 of the header, u32 0
    offset 24  the header: UTF-8 JSON {order, counts, n_home, file_size, arrays: [{name, dtype,
               shape, offset, nbytes, crc32}]}
    then       each array, little-endian, starting at a multiple of 64 bytes

Arrays: `vocab` (the words, UTF-8, joined by newlines: ARPA words never hold whitespace),
`prob.k`, `word.k`, and for k < N `backoff.k`, `child.k`; for k >= 2 the scoring table `table.k`
(16-byte slots `{u64 key, f32 prob, f32 backoff}` stored as u64 pairs) with `n_home[k-1]` home
slots, and `entry.k` (slot -> entry index); see `hashing.ProbingTable`. Per-array crc32s are
checked only when asked (`verify=True`): the registry already checks the file's sha256 against
the manifest.

Versions: 1 held bucketed hash tables (`slot_key.k`, `slot_val.k`, `bucket.k`); 2 holds the
probing tables. An older file is refused with `BinaryVersionError` (which says both versions);
`NgramModel.load(..., arpa_fallback=...)` then compiles the model's ARPA copy instead.
"""

from __future__ import annotations

import json
import mmap
import struct
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.ngram.build import NgramArrays
from lmserve.server.backends.ngram.hashing import SLOT_DTYPE, ProbingTable
from lmserve.server.errors import ModelLoadError

MAGIC = b"LMSNGRAM"
VERSION = 2


class BinaryVersionError(ModelLoadError):
    """A well-formed `.lmbin` of another format version (rebuild it from its ARPA)."""

    def __init__(self, path: str, found: int) -> None:
        super().__init__(
            path,
            f"binary format version {found}, expected {VERSION}: rebuild the binary from its "
            "ARPA (`lmserve import-arpa` or `make models`)",
        )
        self.found = found
        self.expected = VERSION


_FIXED = struct.Struct("<8sIII4x")
_ALIGN = 64


def _named_arrays(a: NgramArrays) -> list[tuple[str, np.ndarray[Any, Any]]]:
    vocab = np.frombuffer("\n".join(a.vocab).encode("utf-8"), dtype=np.uint8)
    out: list[tuple[str, np.ndarray[Any, Any]]] = [("vocab", vocab)]
    for k in range(1, a.order + 1):
        out.append((f"prob.{k}", a.probs[k - 1]))
        out.append((f"word.{k}", a.words[k - 1]))
        if k < a.order:
            out.append((f"backoff.{k}", a.backoffs[k - 1]))
            out.append((f"child.{k}", a.child_start[k - 1]))
        if k >= 2:
            table = a.tables[k - 2]
            out.append((f"table.{k}", table.words))
            out.append((f"entry.{k}", table.entry))
    return out


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def save_arrays(a: NgramArrays, path: Path) -> None:
    """Writes the arrays and their header (see the module docstring)."""
    named = _named_arrays(a)
    entries: list[dict[str, Any]] = []
    header: dict[str, Any] = {
        "order": a.order,
        "counts": a.counts,
        "n_home": [0] + [t.n_home for t in a.tables],
        "arrays": entries,
    }
    # The header's length depends on the offsets in it: lay out with a generous fixed budget.
    budget = _align(_FIXED.size + 512 + 160 * len(named))
    offset = budget
    for name, arr in named:
        arr = np.ascontiguousarray(arr)
        entries.append(
            {
                "name": name,
                "dtype": arr.dtype.newbyteorder("<").str,
                "shape": list(arr.shape),
                "offset": offset,
                "nbytes": arr.nbytes,
                "crc32": zlib.crc32(arr.data.cast("B")),
            }
        )
        offset = _align(offset + arr.nbytes)
    header["file_size"] = offset
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    if _FIXED.size + len(blob) > budget:
        raise AssertionError("binary header budget too small")  # a bug, not a user error
    with path.open("wb") as f:
        f.write(_FIXED.pack(MAGIC, VERSION, len(blob), zlib.crc32(blob)))
        f.write(blob)
        for (_, arr), entry in zip(named, entries, strict=True):
            f.seek(entry["offset"])
            f.write(np.ascontiguousarray(arr).astype(entry["dtype"], copy=False).tobytes())
        f.truncate(offset)


def load_arrays(path: Path, *, verify: bool = False) -> NgramArrays:
    """Memory-maps a `.lmbin` file; ModelLoadError if it is truncated, corrupt or not ours."""
    where = str(path)
    try:
        with path.open("rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as exc:  # ValueError: an empty file cannot be mapped
        raise ModelLoadError(where, "cannot map the model file", f"{exc}") from exc
    size = len(buf)
    if size < _FIXED.size:
        raise ModelLoadError(where, "file too short to be an n-gram binary")
    magic, version, header_len, header_crc = _FIXED.unpack_from(buf, 0)
    if magic != MAGIC:
        raise ModelLoadError(where, "not an lmserve n-gram binary", f"magic {magic!r}")
    if version != VERSION:
        raise BinaryVersionError(where, version)
    blob = buf[_FIXED.size : _FIXED.size + header_len]
    if len(blob) != header_len or zlib.crc32(blob) != header_crc:
        raise ModelLoadError(where, "corrupt header (crc32 mismatch)")
    try:
        header = json.loads(blob)
        if header["file_size"] != size:
            raise ModelLoadError(
                where, f"file is {size} bytes, the header says {header['file_size']} (truncated?)"
            )
        arrays = {e["name"]: _view(buf, e, where, verify) for e in header["arrays"]}
        return _assemble(header, arrays, where)
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(where, "malformed header", f"{exc!r}") from exc


def _view(buf: mmap.mmap, entry: dict[str, Any], where: str, verify: bool) -> npt.NDArray[Any]:
    offset, nbytes = int(entry["offset"]), int(entry["nbytes"])
    if offset % 8 or offset + nbytes > len(buf):
        raise ModelLoadError(where, f"array {entry['name']} lies outside the file")
    dtype = np.dtype(entry["dtype"])
    shape = tuple(int(s) for s in entry["shape"])
    arr = np.frombuffer(buf, dtype=dtype, count=nbytes // dtype.itemsize, offset=offset)
    if verify and zlib.crc32(arr.data.cast("B")) != entry["crc32"]:
        raise ModelLoadError(where, f"array {entry['name']} is corrupt (crc32 mismatch)")
    return arr.reshape(shape)


def _assemble(
    header: dict[str, Any], arrays: dict[str, npt.NDArray[Any]], where: str
) -> NgramArrays:
    order = int(header["order"])
    counts = [int(c) for c in header["counts"]]
    if order < 1 or len(counts) != order:
        raise ModelLoadError(where, f"order {order} does not match {len(counts)} counts")
    vocab = bytes(arrays["vocab"]).decode("utf-8").split("\n")
    probs = [arrays[f"prob.{k}"] for k in range(1, order + 1)]
    words = [arrays[f"word.{k}"] for k in range(1, order + 1)]
    backoffs = [arrays[f"backoff.{k}"] for k in range(1, order)]
    child = [arrays[f"child.{k}"] for k in range(1, order)]
    tables: list[ProbingTable] = []
    for k in range(2, order + 1):
        raw = arrays[f"table.{k}"]
        if raw.dtype != np.uint64 or raw.ndim != 1 or len(raw) % 2:
            raise ModelLoadError(where, f"order {k} scoring table is malformed")
        tables.append(
            ProbingTable(raw.view(SLOT_DTYPE), arrays[f"entry.{k}"], int(header["n_home"][k - 1]))
        )
    # Cheap consistency checks, so that a damaged file fails here and not inside a lookup.
    if len(probs[0]) != len(vocab):
        raise ModelLoadError(where, "vocabulary and unigram table differ in length")
    for k in range(1, order):
        n_here, n_next = len(probs[k - 1]), len(probs[k])
        if len(backoffs[k - 1]) != n_here or len(child[k - 1]) != n_here + 1:
            raise ModelLoadError(where, f"order {k} arrays differ in length")
        if int(child[k - 1][0]) != 0 or int(child[k - 1][-1]) != n_next:
            raise ModelLoadError(where, f"order {k} child offsets are inconsistent")
    for k in range(2, order + 1):
        if len(words[k - 1]) != len(probs[k - 1]):
            raise ModelLoadError(where, f"order {k} arrays differ in length")
        if len(tables[k - 2].slots) <= len(probs[k - 1]):
            raise ModelLoadError(where, f"order {k} scoring table is inconsistent")
    return NgramArrays(
        vocab=vocab,
        counts=counts,
        probs=probs,
        backoffs=backoffs,
        words=words,
        child_start=child,
        tables=tables,
    )
