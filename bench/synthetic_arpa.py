"""A seeded generator of synthetic ARPA back-off models, shaped like lmplz output.

    python bench/synthetic_arpa.py --ngrams 10000000 --order 5 --vocab 60000 --seed 1 OUT.arpa

The model's n-grams are the distinct sliding windows (orders 1..N) over a synthetic corpus, so
every n-gram's prefix and suffix exist (prefix- and suffix-closed, as lmplz writes them):

- **Corpus.** Word ids drawn from a Zipf-Mandelbrot law (`1 / (rank + 2.7)`) over `vocab - 3`
  words, with ~35% of the tokens overwritten by phrases (2-7 words) from a Zipfian-chosen phrase
  bank, so higher orders repeat as in text; cut into sentences (negative binomial lengths, mean
  20 words), each `<s> ... </s>`. Windows never cross a sentence.
- **Size.** The corpus length is searched until the distinct n-grams over all orders are within
  1% of `--ngrams`: two small pilots give the slope of log(distinct n-grams) against
  log(length), extrapolated to the target (usually within 1% at once), then secant steps.
- **Probabilities.** log10 of `(c(h w) - D) / c(h)` with D = 0.5 (unigrams: `c(w) / tokens`);
  backoffs, for every n-gram of order < N, log10 of `D * N1+(h .) / c(h)` (0 with no
  continuation, as lmplz writes after `</s>`). All are <= 0; `<s>` has probability 0 and
  `<unk>` (not in the corpus) that of a discounted singleton, as lmplz writes them. Not
  normalised per context: a benchmark model, not a language model.
- **Words.** Consonant-vowel syllables (`kato`, `mibeso`): letters only, 4-8 bytes, frequent
  words shortest.

Everything is numpy on whole arrays: the distinct n-grams of order k are `np.unique` over
packed uint64 keys `(index of the window's (k-1)-gram prefix) << bits | last word`, and the
file is written per order in chunks of fixed-width byte rows (fields zero-padded) compacted by
dropping the zeros, so 100M n-grams never become Python objects. `--sentences N` also writes
test sentences (`OUT.sentences.txt`): half sampled from the corpus, half fresh Zipf draws (whose
n-grams the model mostly lacks, so scoring backs off), ~2% of their words replaced by
out-of-vocabulary ones (`oov123`, never a model word).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import numpy.typing as npt

# Bumped whenever the same arguments would write another file (benchmarks cache the output).
VERSION = 2
UNK, BOS, EOS = 0, 1, 2
SPECIALS = ("<unk>", "<s>", "</s>")
DISCOUNT = 0.5
ZIPF_SHIFT = 2.7
SENTENCE_MEAN = 20
PHRASE_FRACTION = 0.35
OOV_RATE = 0.02
CHUNK = 1 << 20  # n-grams formatted per write
FLOAT_WIDTH = 10  # "-dd.dddddd"

CONSONANTS = b"bdfghklmnprstvwyz"
VOWELS = b"aeiou"

Int64Array = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Spec:
    """What to generate: about `ngrams` distinct n-grams of orders 1..`order`."""

    ngrams: int
    order: int = 5
    vocab: int = 60000
    seed: int = 1

    def __post_init__(self) -> None:
        if self.order < 1:
            raise ValueError("order must be >= 1")
        if self.vocab < 10:
            raise ValueError("vocab must be >= 10")
        if self.ngrams < 100:
            raise ValueError("ngrams must be >= 100")


@dataclass
class Orders:
    """The distinct n-grams of every order: first window (corpus position) of each, log10 prob,
    log10 backoff (orders < N), in key order (lexicographic by word id)."""

    first: list[npt.NDArray[np.uint32]] = field(default_factory=list)
    words1: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    prob: list[npt.NDArray[np.float32]] = field(default_factory=list)
    backoff: list[npt.NDArray[np.float32]] = field(default_factory=list)

    @property
    def counts(self) -> list[int]:
        return [len(p) for p in self.prob]


# -- words ------------------------------------------------------------------------------------


def _syllables() -> list[bytes]:
    return [bytes([c, v]) for c in CONSONANTS for v in VOWELS]


def word_bytes(vocab: int) -> tuple[npt.NDArray[np.uint8], list[str]]:
    """The vocabulary's words as a zero-padded byte matrix [vocab, width] and as strings.

    Ids 0-2 are `<unk>`, `<s>`, `</s>`; word id 3 + r (Zipf rank r) is r + n written in base
    n = 85 syllables (so at least two syllables, the leading one never the zero digit): distinct,
    letters only.
    """
    syl = _syllables()
    base = len(syl)
    words = [s.encode() for s in SPECIALS]
    for r in range(vocab - len(SPECIALS)):
        v, parts = r + base, []
        while v:
            v, d = divmod(v, base)
            parts.append(syl[d])
        words.append(b"".join(reversed(parts)))
    width = max(len(w) for w in words)
    mat = np.zeros((vocab, width), dtype=np.uint8)
    flat = np.frombuffer(b"".join(w.ljust(width, b"\0") for w in words), dtype=np.uint8)
    mat[:] = flat.reshape(vocab, width)
    return mat, [w.decode() for w in words]


# -- corpus -----------------------------------------------------------------------------------


def _zipf_cdf(n: int, s: float = 1.0) -> npt.NDArray[np.float64]:
    weights = 1.0 / (np.arange(1, n + 1, dtype=np.float64) + ZIPF_SHIFT) ** s
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    return cdf


def _draw(rng: np.random.Generator, cdf: npt.NDArray[np.float64], size: int) -> Int64Array:
    out: Int64Array = np.searchsorted(cdf, rng.random(size), side="right").astype(np.int64)
    np.minimum(out, len(cdf) - 1, out=out)
    return out


def _ragged_arange(lengths: Int64Array) -> Int64Array:
    """0..len-1 for each length, concatenated."""
    total = int(lengths.sum())
    starts = np.cumsum(lengths) - lengths
    return np.arange(total, dtype=np.int64) - np.repeat(starts, lengths)


def _sentence_lengths(rng: np.random.Generator, n: int) -> Int64Array:
    p = 2.0 / (2.0 + SENTENCE_MEAN - 1)
    return 1 + rng.negative_binomial(2, p, size=n).astype(np.int64)


def corpus(spec: Spec, n_words: int) -> tuple[npt.NDArray[np.int32], Int64Array]:
    """The token stream (`<s> w.. </s>` per sentence, word ids) and each sentence's start."""
    g_words, g_bank, g_place, g_len = (
        np.random.default_rng(s) for s in np.random.SeedSequence(spec.seed).spawn(4)
    )
    cdf = _zipf_cdf(spec.vocab - len(SPECIALS))
    words = _draw(g_words, cdf, n_words) + len(SPECIALS)
    # Phrases: a bank of 2-7-word Zipf phrases, pasted at random places, bank ranks Zipfian.
    n_bank = max(16, n_words // 40)
    bank_len = g_bank.integers(2, 8, size=n_bank).astype(np.int64)
    bank = _draw(g_bank, cdf, int(bank_len.sum())) + len(SPECIALS)
    bank_start = np.cumsum(bank_len) - bank_len
    n_paste = int(PHRASE_FRACTION * n_words / 4.5)
    if n_paste and n_words > 8:
        which = _draw(g_place, _zipf_cdf(n_bank), n_paste)
        at = g_place.integers(0, n_words - 7, size=n_paste).astype(np.int64)
        lens = bank_len[which]
        offs = _ragged_arange(lens)
        words[np.repeat(at, lens) + offs] = bank[np.repeat(bank_start[which], lens) + offs]
    # Sentences.
    lengths = _sentence_lengths(g_len, n_words // (SENTENCE_MEAN // 2) + 16)
    ends = np.cumsum(lengths)
    n_sent = int(np.searchsorted(ends, n_words)) + 1
    lengths = lengths[:n_sent].copy()
    lengths[-1] -= int(ends[n_sent - 1]) - n_words
    sent_len = lengths + 2
    starts = np.cumsum(sent_len) - sent_len
    tokens = np.empty(n_words + 2 * n_sent, dtype=np.int32)
    tokens[starts] = BOS
    tokens[starts + sent_len - 1] = EOS
    inner = np.repeat(starts + 1, lengths) + _ragged_arange(lengths)
    tokens[inner] = words
    return tokens, starts


# -- distinct n-grams -------------------------------------------------------------------------


def _log10_ratio(
    num: npt.NDArray[Any], den: npt.NDArray[Any] | np.float64
) -> npt.NDArray[np.float32]:
    with np.errstate(divide="ignore"):
        out = np.log10(num / den)
    return np.maximum(out, -99.0).astype(np.float32)


def _unique(
    keys: npt.NDArray[np.uint64],
) -> tuple[npt.NDArray[np.uint64], Int64Array, Int64Array, Int64Array]:
    """`np.unique(keys, return_index, return_inverse, return_counts)`, but the index is any
    occurrence, not the first: one unstable argsort (SIMD-sorted) instead of a stable one."""
    perm = keys.argsort()
    ordered = keys[perm]
    new = np.empty(len(keys), dtype=np.bool_)
    new[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
    starts = np.flatnonzero(new)
    inverse = np.empty(len(keys), dtype=np.int64)
    inverse[perm] = np.cumsum(new) - 1
    counts = np.diff(np.append(starts, len(keys)))
    return ordered[starts], perm[starts], inverse, counts


def distinct_ngrams(spec: Spec, tokens: npt.NDArray[np.int32], starts: Int64Array) -> Orders:
    """Every order's distinct windows (within a sentence), with probabilities and backoffs."""
    bits = max(1, int(spec.vocab - 1).bit_length())
    n = len(tokens)
    sid = np.zeros(n, dtype=np.int64)
    sid[starts[1:]] = 1
    np.cumsum(sid, out=sid)
    orders = Orders()
    tok64 = tokens.astype(np.int64)
    # Unigrams: the words themselves (plus <unk>, never in the corpus).
    seen = np.bincount(tokens, minlength=spec.vocab)
    seen[UNK] = 0
    ids = np.flatnonzero(seen)
    ids = np.concatenate([[UNK], ids]).astype(np.int64)
    counts = np.concatenate([[DISCOUNT], seen[ids[1:]]]).astype(np.float64)
    index = np.zeros(spec.vocab, dtype=np.int64)
    index[ids] = np.arange(len(ids))
    inverse = index[tokens]
    prob = _log10_ratio(counts, np.float64(n))
    prob[ids == BOS] = 0.0
    orders.words1 = ids
    orders.first.append(np.zeros(0, dtype=np.uint32))
    orders.prob.append(prob)
    rank = inverse.astype(np.int64)  # rank[i]: index of the distinct (k-1)-gram starting at i
    prev_counts = counts
    for k in range(2, spec.order + 1):
        valid = np.flatnonzero(sid[: n - k + 1] == sid[k - 1 :])
        keys = (rank[valid].astype(np.uint64) << np.uint64(bits)) | tok64[valid + k - 1].astype(
            np.uint64
        )
        uniq, first, inv, cnt = _unique(keys)
        del keys
        prefix = (uniq >> np.uint64(bits)).astype(np.int64)
        orders.prob.append(_log10_ratio(cnt - DISCOUNT, prev_counts[prefix]))
        orders.first.append(valid[first].astype(np.uint32))
        # The (k-1)-grams' backoffs: D * distinct continuations / count; 0 without any.
        nplus = np.bincount(prefix, minlength=len(prev_counts)).astype(np.float64)
        backoff = _log10_ratio(DISCOUNT * nplus, prev_counts)
        backoff[nplus == 0] = 0.0
        orders.backoff.append(backoff)
        new_rank = np.full(n, -1, dtype=np.int64)
        new_rank[valid] = inv
        rank = new_rank
        prev_counts = cnt.astype(np.float64)
        del uniq, first, inv, cnt, prefix, valid, new_rank
    if spec.order == 1:
        orders.backoff = []
    return orders


def find_corpus_words(spec: Spec, log: Any = None) -> tuple[int, Orders, Any]:
    """The corpus length (words without sentence markers) whose distinct n-grams over all orders
    come within 1% of the target, with that corpus's n-grams and tokens."""
    target = spec.ngrams

    def measure(words: int) -> tuple[int, Orders, Any]:
        tokens, starts = corpus(spec, words)
        orders = distinct_ngrams(spec, tokens, starts)
        total = sum(orders.counts)
        if log is not None:
            log(f"  corpus of {words:,} words: {total:,} distinct n-grams")
        return total, orders, (tokens, starts)

    # Two small pilots (1/32 and 1/8 of a first guess) set the slope of log(distinct n-grams)
    # against log(words); the step to the target usually lands within 1%; else secant steps.
    guess = max(400, target // spec.order)
    points: list[tuple[int, int]] = []
    for pilot in (guess // 32, guess // 8):
        total, _, _ = measure(pilot)
        points.append((pilot, total))
    (w0, t0), (w1, t1) = points
    slope = min(max(math.log(t1 / t0) / math.log(w1 / w0), 0.3), 1.5) if t1 > t0 else 1.0
    words = max(50, int(round(w1 * (target / t1) ** (1.0 / slope))))
    for attempt in range(12):
        total, orders, corp = measure(words)
        points.append((words, total))
        if abs(total - target) <= 0.01 * target or attempt == 11:
            return words, orders, corp
        (w0, t0), (w1, t1) = points[-2], points[-1]
        slope = math.log(t1 / t0) / math.log(w1 / w0) if w1 != w0 and t1 != t0 else 1.0
        slope = min(max(slope, 0.3), 1.5)
        step = (target / total) ** (1.0 / slope)
        next_words = max(50, int(round(words * step)))
        if next_words == words:
            next_words += 1 if total < target else -1
        del orders, corp
        words = next_words
    raise AssertionError("unreachable")


# -- writing ----------------------------------------------------------------------------------


def format_floats(x: npt.NDArray[np.float32]) -> npt.NDArray[np.uint8]:
    """'%.6f' of values in [-99.999999, 0] as zero-padded rows [n, 10] ('0' for zero)."""
    v = np.rint(-x.astype(np.float64) * 1e6).astype(np.int64)
    np.clip(v, 0, 99_999_999, out=v)
    out = np.zeros((len(v), FLOAT_WIDTH), dtype=np.uint8)
    nonzero = v > 0
    ip, frac = np.divmod(v, 1_000_000)
    out[:, 0] = np.where(nonzero, ord("-"), 0)
    out[:, 1] = np.where(ip >= 10, 48 + ip // 10, 0)
    out[:, 2] = 48 + ip % 10
    out[:, 3] = np.where(nonzero, ord("."), 0)
    for j in range(6):
        digit = (frac // 10 ** (5 - j)) % 10
        out[:, 4 + j] = np.where(nonzero, 48 + digit, 0)
    return out


def _rows(
    prob: npt.NDArray[np.float32],
    backoff: npt.NDArray[np.float32] | None,
    ids: npt.NDArray[np.int64],
    vocab_mat: npt.NDArray[np.uint8],
) -> bytes:
    """ARPA lines `prob\\tw1 w2 ..[\\tbackoff]\\n` for ids [n, k], as bytes."""
    n, k = ids.shape
    width = vocab_mat.shape[1]
    row = FLOAT_WIDTH + 1 + k * (width + 1) + (FLOAT_WIDTH + 1 if backoff is not None else 0)
    mat = np.zeros((n, row), dtype=np.uint8)
    mat[:, :FLOAT_WIDTH] = format_floats(prob)
    col = FLOAT_WIDTH
    mat[:, col] = ord("\t")
    col += 1
    for j in range(k):
        mat[:, col : col + width] = vocab_mat[ids[:, j]]
        col += width
        mat[:, col] = ord(" ") if j < k - 1 else ord("\t" if backoff is not None else "\n")
        col += 1
    if backoff is not None:
        mat[:, col : col + FLOAT_WIDTH] = format_floats(backoff)
        mat[:, col + FLOAT_WIDTH] = ord("\n")
    return mat[mat != 0].tobytes()


def _chunks(n: int) -> Iterator[slice]:
    for lo in range(0, n, CHUNK):
        yield slice(lo, min(n, lo + CHUNK))


def write_arpa(
    f: BinaryIO,
    orders: Orders,
    tokens: npt.NDArray[np.int32],
    vocab_mat: npt.NDArray[np.uint8],
) -> None:
    order = len(orders.prob)
    header = "\\data\\\n" + "".join(f"ngram {k}={c}\n" for k, c in enumerate(orders.counts, 1))
    f.write(header.encode())
    tok64 = tokens.astype(np.int64)
    for k in range(1, order + 1):
        f.write(f"\n\\{k}-grams:\n".encode())
        prob = orders.prob[k - 1]
        backoff = orders.backoff[k - 1] if k < order else None
        for sl in _chunks(len(prob)):
            if k == 1:
                ids = orders.words1[sl, None]
            else:
                first = orders.first[k - 1][sl].astype(np.int64)
                ids = tok64[first[:, None] + np.arange(k, dtype=np.int64)]
            f.write(_rows(prob[sl], None if backoff is None else backoff[sl], ids, vocab_mat))
    f.write(b"\n\\end\\\n")


def test_sentences(
    spec: Spec,
    tokens: npt.NDArray[np.int32],
    starts: Int64Array,
    words: list[str],
    count: int,
) -> list[str]:
    """`count` sentences: half from the corpus, half fresh Zipf draws; ~2% of words OOV."""
    rng = np.random.default_rng(np.random.SeedSequence([spec.seed, 7]))
    ends = np.append(starts[1:], len(tokens))
    picked = rng.choice(len(starts), size=count - count // 2, replace=len(starts) < count)
    sentences = [tokens[starts[i] + 1 : ends[i] - 1].tolist() for i in sorted(picked)]
    cdf = _zipf_cdf(spec.vocab - len(SPECIALS))
    for length in _sentence_lengths(rng, count // 2):
        sentences.append((_draw(rng, cdf, int(length)) + len(SPECIALS)).tolist())
    lines = []
    for ids in sentences:
        out = [words[i] for i in ids]
        oov = rng.random(len(out)) < OOV_RATE
        for j in np.flatnonzero(oov):
            out[j] = f"oov{int(rng.integers(0, 100000))}"
        lines.append(" ".join(out))
    order = rng.permutation(len(lines))
    return [lines[i] for i in order]


def generate(
    spec: Spec,
    out: Path,
    *,
    sentences: int = 0,
    sentences_out: Path | None = None,
    log: Any = None,
) -> dict[str, Any]:
    """Writes the ARPA file (and test sentences); returns what was made and how long it took."""
    start = time.perf_counter()
    words, orders, (tokens, starts) = find_corpus_words(spec, log)
    searched = time.perf_counter() - start
    vocab_mat, vocab_words = word_bytes(spec.vocab)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    with partial.open("wb") as f:
        write_arpa(f, orders, tokens, vocab_mat)
    partial.replace(out)
    stats: dict[str, Any] = {
        "version": VERSION,
        "ngrams": sum(orders.counts),
        "counts": orders.counts,
        "order": spec.order,
        "vocab": spec.vocab,
        "seed": spec.seed,
        "target": spec.ngrams,
        "corpus_words": words,
        "sentences_in_corpus": len(starts),
        "arpa_bytes": out.stat().st_size,
        "search_seconds": round(searched, 3),
        "seconds": round(time.perf_counter() - start, 3),
    }
    if sentences:
        path = sentences_out or out.with_name(out.name + ".sentences.txt")
        lines = test_sentences(spec, tokens, starts, vocab_words, sentences)
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        stats["sentences_path"] = str(path)
    return stats


def parse_count(text: str) -> int:
    """10000000, 10M, 1.5M, 500k."""
    t = text.strip().lower().replace("_", "").replace(",", "")
    mult = {"k": 10**3, "m": 10**6, "g": 10**9}.get(t[-1:], 1)
    return int(float(t[:-1] if mult > 1 else t) * mult)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, metavar="OUT.arpa")
    parser.add_argument("--ngrams", type=parse_count, default=10**7, help="target (10M, 500k)")
    parser.add_argument("--order", type=int, default=5)
    parser.add_argument("--vocab", type=int, default=60000, help="words including 3 specials")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sentences", type=int, default=0, help="also write N test sentences")
    parser.add_argument("--sentences-out", type=Path, help="default: OUT.arpa.sentences.txt")
    parser.add_argument("--stats-json", type=Path, help="write the stats here too")
    args = parser.parse_args(argv)

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    spec = Spec(ngrams=args.ngrams, order=args.order, vocab=args.vocab, seed=args.seed)
    stats = generate(
        spec, args.out, sentences=args.sentences, sentences_out=args.sentences_out, log=log
    )
    rate = stats["ngrams"] / stats["seconds"]
    log(
        f"wrote {args.out}: {stats['ngrams']:,} n-grams {stats['counts']}, "
        f"{stats['arpa_bytes'] / 1e6:.1f} MB in {stats['seconds']:.1f} s "
        f"({rate / 1e6:.2f} M n-grams/s; search {stats['search_seconds']:.1f} s)"
    )
    if args.stats_json:
        args.stats_json.write_text(json.dumps(stats) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
