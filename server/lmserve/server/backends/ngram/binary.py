"""The `.lmbin` file: an n-gram model's arrays laid out to be memory-mapped, not parsed.

Like KenLM's binary format (`lm/binary_format.cc`) it is the in-memory layout written to disk,
so loading is an `mmap` plus a header check, a few milliseconds for any size of model.

    offset 0   magic b"LMSNGRAM", u32 version, u32 header length, u32 crc32 of the header, u32 0
    offset 24  the header: UTF-8 JSON {order, counts, fill_ins, n_home, file_size, arrays: [{name,
               dtype, shape, offset, nbytes, crc32}]}
    then       each array, little-endian, starting at a multiple of 64 bytes

Arrays (`tables.NgramTables`): `vocab` (the words, UTF-8, joined by newlines: ARPA words never
hold whitespace), `uni_prob` and `uni_backoff` (float32 by word id), and for each order k >= 2
its probing table `table.k`, the slots as bytes (16 per slot, 12 in the highest order; see
`hashing.ProbingTable`) with `n_home[k-1]` home slots. A quantized model (`compact.py`) has
`compact[k-2]` in the header (the order's slot layout and largest errors) and its levels in
`prob_levels.k` / `backoff_levels.k` (float32[256]). `bigram_start` and `bigram_words` (uint32)
list each word's bigrams (`tables.NgramTables`). Per-array crc32s are checked only when
asked (`verify=True`): the registry already checks the file's sha256 against the manifest.

Versions: 1 held bucketed hash tables; 2 held the probing tables beside per-order sorted arrays
(46 bytes per n-gram); 3 holds the probing tables alone (at most 24). An older file is refused
with `BinaryVersionError` (which says both versions); `NgramModel.load(..., arpa_fallback=...)`
then compiles the model's ARPA copy instead.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import struct
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.ngram.compact import CompactLayout, CompactTable, Quantization
from lmserve.server.backends.ngram.hashing import ProbingTable, slot_dtype
from lmserve.server.backends.ngram.tables import NgramTables, ScoringTable
from lmserve.server.errors import ModelLoadError

MAGIC = b"LMSNGRAM"
VERSION = 3


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


def _named_arrays(t: NgramTables) -> list[tuple[str, np.ndarray[Any, Any]]]:
    vocab = np.frombuffer("\n".join(t.vocab).encode("utf-8"), dtype=np.uint8)
    out: list[tuple[str, np.ndarray[Any, Any]]] = [
        ("vocab", vocab),
        ("uni_prob", t.uni_prob),
        ("uni_backoff", t.uni_backoff),
        ("bigram_start", t.bigram_start),
        ("bigram_words", t.bigram_words),
    ]
    for k, table in enumerate(t.tables, start=2):
        out.append((f"table.{k}", table.raw))
        if isinstance(table, CompactTable):
            out.append((f"prob_levels.{k}", table.quantization.prob_levels))
            if not table.final:
                out.append((f"backoff_levels.{k}", table.quantization.backoff_levels))
    return out


def _layouts(t: NgramTables) -> list[dict[str, Any] | None]:
    """Per order 2..N: None (exact slots) or the compact layout and its largest errors."""
    out: list[dict[str, Any] | None] = []
    for table in t.tables:
        if isinstance(table, CompactTable):
            q = table.quantization
            out.append(
                {
                    **table.layout.as_header(),
                    "max_prob_error": q.max_prob_error,
                    "max_backoff_error": q.max_backoff_error,
                }
            )
        else:
            out.append(None)
    return out


def _align(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def save_tables(t: NgramTables, path: Path) -> str:
    """Writes the arrays and their header (see the module docstring), each array straight from
    its memory (no copy of a table is made on the way to the file); returns the file's sha256
    (hex)."""
    named = _named_arrays(t)
    entries: list[dict[str, Any]] = []
    header: dict[str, Any] = {
        "order": t.order,
        "counts": t.counts,
        "fill_ins": t.fill_ins,
        "n_home": [0] + [table.n_home for table in t.tables],
        "compact": _layouts(t),
        "arrays": entries,
    }
    # The header's length depends on the offsets in it: lay out with a generous fixed budget.
    budget = _align(_FIXED.size + 512 + 160 * len(named))
    offset = budget
    for name, arr in named:
        if not arr.flags.c_contiguous or arr.dtype.byteorder == ">":
            raise AssertionError(f"array {name} is not a little-endian contiguous array")
        entries.append(
            {
                "name": name,
                "dtype": arr.dtype.newbyteorder("<").str,
                "shape": list(arr.shape),
                "offset": offset,
                "nbytes": arr.nbytes,
                "crc32": zlib.crc32(arr.view(np.uint8).data),
            }
        )
        offset = _align(offset + arr.nbytes)
    header["file_size"] = offset
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    if _FIXED.size + len(blob) > budget:
        raise AssertionError("binary header budget too small")  # a bug, not a user error
    with path.open("wb") as f, _HashedWriter(f) as out:
        out.write(_FIXED.pack(MAGIC, VERSION, len(blob), zlib.crc32(blob)) + blob)
        for (_, arr), entry in zip(named, entries, strict=True):
            out.write(bytes(entry["offset"] - out.position))  # the zero padding
            data = arr.view(np.uint8).data
            for start in range(0, len(data), _CHUNK):
                out.write(data[start : start + _CHUNK])
        out.write(bytes(offset - out.position))
    return out.sha256.hexdigest()


# Bytes written (and hashed) at a time: large enough to keep the hashing thread busy.
_CHUNK = 32 << 20


class _HashedWriter:
    """Writes a file and hashes the bytes written (sha256, for the manifest) in one pass: each
    chunk is hashed on a thread while the next is written (hashlib and file writes both release
    the GIL), so the manifest need not read the model back."""

    def __init__(self, f: BinaryIO) -> None:
        self._f = f
        self.sha256 = hashlib.sha256()
        self.position = 0
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lmbin-sha256")
        self._pending: Future[None] | None = None

    def write(self, data: bytes | memoryview) -> None:
        if self._pending is not None:
            self._pending.result()
        self._pending = self._pool.submit(self.sha256.update, data)
        self._f.write(data)
        self.position += len(data)

    def __enter__(self) -> _HashedWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pending is not None:
            self._pending.result()
        self._pool.shutdown()


def load_tables(path: Path, *, verify: bool = False) -> NgramTables:
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
    if verify and zlib.crc32(arr.view(np.uint8).data) != entry["crc32"]:
        raise ModelLoadError(where, f"array {entry['name']} is corrupt (crc32 mismatch)")
    return arr.reshape(shape)


def _compact_table(
    raw: npt.NDArray[Any],
    layout: dict[str, Any],
    arrays: dict[str, npt.NDArray[Any]],
    k: int,
    where: str,
) -> CompactTable:
    try:
        lay = CompactLayout(
            word_bits=int(layout["word_bits"]),
            key_bits=int(layout["key_bits"]),
            n_home=int(layout["n_home"]),
            low_bits=int(layout["low_bits"]),
            disp_bits=int(layout["disp_bits"]),
            has_backoff=bool(layout["has_backoff"]),
        )
        empty = np.zeros(0, dtype=np.float32)
        q = Quantization(
            prob_levels=arrays[f"prob_levels.{k}"],
            backoff_levels=arrays[f"backoff_levels.{k}"] if lay.has_backoff else empty,
            max_prob_error=float(layout["max_prob_error"]),
            max_backoff_error=float(layout["max_backoff_error"]),
        )
        return CompactTable(raw, lay, q)
    except (KeyError, ValueError) as exc:
        raise ModelLoadError(where, f"order {k} quantized table is malformed", f"{exc}") from exc


def _assemble(
    header: dict[str, Any], arrays: dict[str, npt.NDArray[Any]], where: str
) -> NgramTables:
    order = int(header["order"])
    counts = [int(c) for c in header["counts"]]
    if order < 1 or len(counts) != order:
        raise ModelLoadError(where, f"order {order} does not match {len(counts)} counts")
    vocab = bytes(arrays["vocab"]).decode("utf-8").split("\n")
    uni_prob, uni_backoff = arrays["uni_prob"], arrays["uni_backoff"]
    if uni_prob.dtype != np.float32 or uni_backoff.dtype != np.float32:
        raise ModelLoadError(where, "the unigram arrays are not float32")
    # Cheap consistency checks, so that a damaged file fails here and not inside a lookup.
    if len(uni_prob) != len(vocab) or len(uni_backoff) != len(vocab):
        raise ModelLoadError(where, "vocabulary and unigram arrays differ in length")
    tables: list[ScoringTable] = []
    compact = header.get("compact") or [None] * (order - 1)
    for k in range(2, order + 1):
        raw = arrays[f"table.{k}"]
        if compact[k - 2] is not None:
            tables.append(_compact_table(raw, compact[k - 2], arrays, k, where))
            continue
        dtype = slot_dtype(k == order)
        if raw.dtype != np.uint8 or raw.ndim != 1 or len(raw) % dtype.itemsize:
            raise ModelLoadError(where, f"order {k} scoring table is malformed")
        try:
            tables.append(ProbingTable(raw.view(dtype), int(header["n_home"][k - 1])))
        except ValueError as exc:
            raise ModelLoadError(where, f"order {k} scoring table is malformed", f"{exc}") from exc
    start, words = arrays["bigram_start"], arrays["bigram_words"]
    if (
        start.dtype != np.uint32
        or words.dtype != np.uint32
        or len(start) != len(vocab) + 1
        or start[0] != 0
        or start[-1] != len(words)
        or np.any(start[1:] < start[:-1])
    ):
        raise ModelLoadError(where, "the bigram lists are malformed")
    return NgramTables(
        vocab=vocab,
        counts=counts,
        uni_prob=uni_prob,
        uni_backoff=uni_backoff,
        tables=tables,
        bigram_start=start,
        bigram_words=words,
        fill_ins=[int(n) for n in header.get("fill_ins", [0] * order)],
    )
