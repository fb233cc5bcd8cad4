"""The quantized form (`compact.py`): exact keys, 8-bit values, errors within what it states.

Its keys are exact, so every token must match the same n-gram as in the exact model; its values
move by at most the recorded per-order errors, so every token's log-prob must stay within the
stated bound. The C kernel and the numpy reference must agree on it bit for bit.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from lmserve.server.backends.ngram import _kernel
from lmserve.server.backends.ngram.compact import LEVELS, CompactTable, mix, quantize
from lmserve.server.backends.ngram.model import NgramModel
from lmserve.server.errors import ModelLoadError
from lmserve.server.text.word import encode_token_lists

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"


@pytest.fixture(scope="module", params=["kjv3", "test.arpa"])
def exact_and_quantized(request: pytest.FixtureRequest) -> tuple[NgramModel, NgramModel]:
    path = {
        "kjv3": SHARED / "kjv" / "kenlm" / "kjv.3gram.arpa",
        "test.arpa": SHARED / "kenlm-tests" / "test.arpa",  # fill-ins, no <unk> issues
    }[request.param]
    exact = NgramModel.from_arpa(path)
    return exact, NgramModel(exact.tables.quantize())


def _texts(model: NgramModel) -> list[list[str]]:
    lines = (SHARED / "kjv" / "test.txt").read_text().splitlines()[:1500]
    rng = np.random.default_rng(3)
    words = model.vocab.words
    noise = [
        [words[i] for i in rng.integers(0, len(words), rng.integers(0, 9))] for _ in range(300)
    ]
    return [line.split() for line in lines] + noise + [["zzqq", "the"], []]


def test_same_matches_and_errors_within_the_stated_bound(
    exact_and_quantized: tuple[NgramModel, NgramModel],
) -> None:
    exact, quantized = exact_and_quantized
    tables = quantized.tables
    assert tables.quantized and not exact.tables.quantized
    assert tables.nbytes() / tables.n_entries() <= 12  # the bound for the 8-bit form
    bound = tables.max_token_error()
    prob_error, backoff_error = tables.max_value_errors()
    # KenLM's small test model has fewer than 256 distinct values an order: kept exactly.
    assert bound == prob_error + (quantized.order - 2) * backoff_error < 1.0
    assert (bound > 0) == (len(quantized.vocab) > 1000)
    batch = encode_token_lists(_texts(exact), exact.vocab)
    for bos in (True, False):
        want = exact.score(batch, bos=bos, per_token=True)
        got = quantized.score(batch, bos=bos, per_token=True)
        assert got.ngram_lengths is not None and want.ngram_lengths is not None
        assert got.ngram_lengths.tolist() == want.ngram_lengths.tolist()
        error = np.abs(got.token_log_probs - want.token_log_probs)
        assert error.max() <= bound + 1e-5
        assert error.mean() <= bound / 4  # most values sit near a level


def test_c_kernel_equals_the_numpy_reference(
    exact_and_quantized: tuple[NgramModel, NgramModel],
) -> None:
    _, quantized = exact_and_quantized
    reference = NgramModel(quantized.tables, kernel="numpy")
    texts = _texts(quantized)
    batch = encode_token_lists(texts, quantized.vocab)
    got = quantized.score(batch, per_token=True)
    want = reference.score(batch, per_token=True)
    np.testing.assert_array_equal(got.token_log_probs, want.token_log_probs)
    contexts = [
        [int(i) for i in batch.ids[lo:hi]]
        for lo, hi in zip(batch.offsets[:80], batch.offsets[1:81], strict=True)
    ]
    np.testing.assert_allclose(
        quantized.next_token_log_probs_batch(contexts),
        reference.next_token_log_probs_batch(contexts),
        rtol=0,
        atol=2e-6,
    )


def test_binary_round_trip(
    exact_and_quantized: tuple[NgramModel, NgramModel], tmp_path: Path
) -> None:
    _, quantized = exact_and_quantized
    quantized.save(tmp_path / "q.lmbin")
    loaded = NgramModel.load(tmp_path / "q.lmbin")
    assert loaded.tables.quantized
    assert loaded.tables.max_value_errors() == quantized.tables.max_value_errors()
    batch = encode_token_lists(_texts(quantized), quantized.vocab)
    assert loaded.score(batch).totals.tolist() == quantized.score(batch).totals.tolist()
    # A damaged layout is refused when loading, not inside a lookup.
    data = bytearray((tmp_path / "q.lmbin").read_bytes())
    at = data.find(b'"low_bits":')
    data[at : at + 11] = b'"low_bitz":'
    (tmp_path / "bad.lmbin").write_bytes(bytes(data))
    with pytest.raises(ModelLoadError):
        NgramModel.load(tmp_path / "bad.lmbin")


def test_quantize_levels() -> None:
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.normal(-3, 1, 20000), [-40.0, 0.0, 0.0]]).astype(np.float32)
    levels, codes, error = quantize(values, keep=(0.0,))
    assert len(levels) == LEVELS and np.all(np.diff(levels) >= 0)
    decoded = levels[codes]
    assert float(np.max(np.abs(decoded - values))) == pytest.approx(error)
    # The even half of the levels bounds the error by a 254th of the range; 0 is exact.
    assert error <= (values.max() - values.min()) / 254 + 1e-6
    assert decoded[-1] == 0.0
    # Each value takes its nearest level.
    nearest = np.abs(values[:, None] - levels[None, :]).min(axis=1)
    np.testing.assert_allclose(np.abs(decoded - values), nearest, atol=1e-6)
    # Few distinct values are kept exactly.
    few = np.array([-1.5, -0.25, -1.5, -7.0], dtype=np.float32)
    levels, codes, error = quantize(few)
    assert error == 0.0 and levels[codes].tolist() == few.tolist()


@pytest.mark.parametrize("key_bits", [1, 5, 12])
def test_mix_is_a_bijection(key_bits: int) -> None:
    keys = np.arange(1 << key_bits, dtype=np.uint64)
    hashed = mix(keys, key_bits)
    assert sorted(hashed.tolist()) == keys.tolist()


def test_scorer_refuses_malformed_compact_layouts(
    exact_and_quantized: tuple[NgramModel, NgramModel],
) -> None:
    _, quantized = exact_and_quantized
    args = list(quantized._scorer_args())
    layouts = args[6]
    table = quantized.tables.tables[0]
    assert isinstance(table, CompactTable)
    word_bits, key_bits, low_bits, disp_bits, probs, backoffs = layouts[0]
    _kernel.Scorer(*args)

    def refused(layout: object, exc: type[Exception] = ValueError) -> None:
        with pytest.raises(exc):
            _kernel.Scorer(*args[:6], (layout, *layouts[1:]))

    refused((word_bits, 70, low_bits, disp_bits, probs, backoffs))  # keys past 62 bits
    refused((1, key_bits, low_bits, disp_bits, probs, backoffs))  # words need more bits
    refused((word_bits, key_bits, low_bits, 60, probs, backoffs))  # a slot past 64 bits
    refused((word_bits, key_bits, low_bits, disp_bits, probs[:10], backoffs))  # too few levels
    refused(
        (word_bits, key_bits, low_bits, disp_bits, probs.astype(np.float64), backoffs), TypeError
    )
    refused((word_bits, key_bits), TypeError)
    # A table whose last slot is used is refused as well.
    raw = table.raw.copy()
    size = table.layout.slot_bytes
    raw[-8 - size : -8] = 0xFF  # the last slot (8 bytes of padding follow it)
    with pytest.raises(ValueError, match="malformed probing table"):
        _kernel.Scorer(*args[:2], (raw, *args[2][1:]), *args[3:])


def test_perplexity_moves_little(exact_and_quantized: tuple[NgramModel, NgramModel]) -> None:
    exact, quantized = exact_and_quantized
    lines = [line.split() for line in (SHARED / "kjv" / "test.txt").read_text().splitlines()]
    batch = encode_token_lists(lines, exact.vocab)
    n = len(batch.ids) + len(lines)
    ppl = [math.exp(-m.score(batch).totals.sum() / n) for m in (exact, quantized)]
    assert ppl[1] == pytest.approx(ppl[0], rel=0.02)
