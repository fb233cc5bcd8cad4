"""The C extensions against their Python references: they must be built, and agree exactly.

`make install` compiles them (hatch_build.py), so a missing module is a failure, never a skip.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lmserve.server.backends.base import EncodedBatch, Vocabulary
from lmserve.server.backends.ngram import _kernel as kernel_module
from lmserve.server.backends.ngram.hashing import EMPTY, FINAL_SLOT_DTYPE
from lmserve.server.backends.ngram.model import NgramModel, c_kernel_available
from lmserve.server.text import _wordindex as wordindex_module
from lmserve.server.text.word import TextEncoder, WordTokenizer, encode_token_lists

KJV3 = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "kjv" / "kenlm"
KJV3 = KJV3 / "kjv.3gram.arpa"
SPECIALS = ["<s>", "</s>", "<unk>"]

# A unigram model: the C kernel's order-1 paths.
UNIGRAM_ARPA = (
    "\\data\\\nngram 1=4\n\n\\1-grams:\n-1.0\t<s>\n-0.5\t</s>\n-2.0\t<unk>\n-0.3\ta\n\n\\end\\\n"
)


def test_extensions_are_built() -> None:
    assert c_kernel_available()
    assert kernel_module.__file__ is not None and kernel_module.__file__.endswith(".so")
    assert wordindex_module.__file__ is not None and wordindex_module.__file__.endswith(".so")


@pytest.fixture(scope="module")
def models() -> tuple[NgramModel, NgramModel]:
    ref = NgramModel.from_arpa(KJV3, kernel="numpy")
    return ref, NgramModel(ref.tables, kernel="c")


def test_default_kernel_is_c() -> None:
    assert NgramModel.from_arpa(KJV3).kernel == "c"


def _random_batch(rng: random.Random, words: list[str]) -> list[list[str]]:
    texts = []
    for _ in range(rng.randrange(0, 12)):
        n = rng.choice([0, 0, 1, 2, 5, rng.randrange(0, 40)])
        texts.append(
            [
                rng.choice(words)
                if rng.random() < 0.8
                else rng.choice([*SPECIALS, "qwertzuiop", "xyzzy"])
                for _ in range(n)
            ]
        )
    return texts


def _assert_same(ref: NgramModel, c: NgramModel, batch: EncodedBatch) -> None:
    for bos in (True, False):
        for eos in (True, False):
            for per_token in (True, False):
                want = ref.score(batch, bos=bos, eos=eos, per_token=per_token)
                got = c.score(batch, bos=bos, eos=eos, per_token=per_token)
                np.testing.assert_allclose(got.totals, want.totals, rtol=0, atol=1e-9)
                if not per_token:
                    assert got.token_log_probs is None
                    continue
                assert got.token_log_probs is not None and want.token_log_probs is not None
                np.testing.assert_allclose(
                    got.token_log_probs, want.token_log_probs, rtol=0, atol=1e-9
                )
                assert got.token_offsets is not None and want.token_offsets is not None
                np.testing.assert_array_equal(got.token_offsets, want.token_offsets)
                assert got.ngram_lengths is not None and want.ngram_lengths is not None
                np.testing.assert_array_equal(got.ngram_lengths, want.ngram_lengths)


def test_c_scorer_equals_numpy_on_random_batches(models: tuple[NgramModel, NgramModel]) -> None:
    ref, c = models
    rng = random.Random(1234)
    # Frequent words make long n-gram matches likely; the whole vocabulary covers rare ones.
    vocab = list(ref.vocab.words)
    common = ["the", "and", "of", "lord", "unto", "said", "god", "in", "that", "he", "him"]
    for i in range(150):
        words = common if i % 2 else vocab
        _assert_same(ref, c, encode_token_lists(_random_batch(rng, words), ref.vocab))


def test_c_scorer_equals_numpy_on_kjv_lines(models: tuple[NgramModel, NgramModel]) -> None:
    ref, c = models
    lines = (KJV3.parent.parent / "test.txt").read_text().splitlines()[:500]
    _assert_same(ref, c, encode_token_lists([line.split() for line in lines], ref.vocab))


def test_c_scorer_equals_numpy_across_chunks(models: tuple[NgramModel, NgramModel]) -> None:
    """The kernel scores chunks of about a thousand positions: texts that straddle a chunk's
    end, a text longer than a chunk (its own chunk), and runs of empty texts."""
    ref, c = models
    rng = random.Random(99)
    common = ["the", "and", "of", "lord", "unto", "said", "god", "in", "that", "he", "him"]
    texts = [[rng.choice(common) for _ in range(rng.randrange(0, 90))] for _ in range(60)]
    texts[7] = [rng.choice(common) for _ in range(2500)]
    texts[30:40] = [[] for _ in range(10)]
    _assert_same(ref, c, encode_token_lists(texts, ref.vocab))


def test_empty_batch(models: tuple[NgramModel, NgramModel]) -> None:
    _assert_same(*models, encode_token_lists([], models[0].vocab))
    _assert_same(*models, encode_token_lists([[], []], models[0].vocab))


def test_scorer_rejects_bad_input(models: tuple[NgramModel, NgramModel]) -> None:
    c = models[1]
    vocab_size = len(c.vocab)
    bad = EncodedBatch(
        ids=np.array([0, vocab_size], dtype=np.int32),
        offsets=np.array([0, 2], dtype=np.int64),
        oov=np.zeros(2, dtype=np.bool_),
    )
    with pytest.raises(ValueError, match="vocabulary id"):
        c.score(bad)
    negative = EncodedBatch(np.array([-1], np.int32), np.array([0, 1], np.int64), np.zeros(1, bool))
    with pytest.raises(ValueError, match="vocabulary id"):
        c.score(negative)
    scorer = c._c
    assert scorer is not None
    ids, totals = np.zeros(3, np.int32), np.empty(1)
    with pytest.raises(ValueError, match="offsets"):
        scorer.score(ids, np.array([0, 2], np.int64), True, True, totals)
    with pytest.raises(ValueError, match="offsets"):
        scorer.score(ids, np.array([0, 3, 1, 3], np.int64), True, True, np.empty(3))
    with pytest.raises(ValueError, match="totals"):
        scorer.score(ids, np.array([0, 3], np.int64), True, True, np.empty(2))
    with pytest.raises(TypeError):
        scorer.score(ids.astype(np.int64), np.array([0, 3], np.int64), True, True, totals)
    with pytest.raises(TypeError):
        scorer.score("abc", np.array([0, 3], np.int64), True, True, totals)
    with pytest.raises(ValueError, match="log_probs"):
        scorer.score(
            ids, np.array([0, 3], np.int64), True, True, totals, np.empty(3), np.empty(3, np.int32)
        )
    with pytest.raises(TypeError):
        kernel_module.Scorer(np.zeros(3), np.zeros(3), (), (), 0, 0, 0)  # type: ignore[call-arg]
    with pytest.raises(ValueError):
        kernel_module.Scorer(np.zeros(3), np.zeros(3), (), (), 0, 5)
    fresh = kernel_module.Scorer.__new__(kernel_module.Scorer)
    with pytest.raises(RuntimeError):
        fresh.score(ids, np.array([0, 3], np.int64), True, True, totals)


def test_unigram_model_in_c(tmp_path: Path) -> None:
    arpa = tmp_path / "uni.arpa"
    arpa.write_text(UNIGRAM_ARPA)
    ref = NgramModel.from_arpa(arpa, kernel="numpy")
    c = NgramModel(ref.tables, kernel="c")
    _assert_same(ref, c, encode_token_lists([["a", "b", "a"], [], ["<s>"]], ref.vocab))


# -- WordIndex ---------------------------------------------------------------------------------

KENLM_SPACES = " \t\n\r\v\f"
# Characters str.split() treats as whitespace but KenLM does not: they stay inside words.
UNICODE_SPACES = "\u00a0\u2003\u3000\x1c\x1d\x85\u2028"


def _random_text(rng: random.Random, words: list[str]) -> str:
    parts = []
    for _ in range(rng.randrange(0, 15)):
        if rng.random() < 0.6:
            parts.append(rng.choice(words))
        else:
            alphabet = "abcé漢字ü\U0001f600'-" + UNICODE_SPACES
            parts.append("".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 8))))
        parts.append("".join(rng.choice(KENLM_SPACES) for _ in range(rng.randrange(1, 4))))
    lead = "".join(rng.choice(KENLM_SPACES) for _ in range(rng.randrange(0, 3)))
    return lead + "".join(parts[:-1] if rng.random() < 0.5 else parts)


def _oov_per_text(batch: EncodedBatch) -> list[int]:
    return [
        int(batch.oov[a:b].sum())
        for a, b in zip(batch.offsets[:-1], batch.offsets[1:], strict=True)
    ]


def _reference_encode(texts: list[str], vocab: Vocabulary) -> EncodedBatch:
    return encode_token_lists(WordTokenizer().split_batch(texts), vocab)


def _assert_encodes_as_python(index: Any, texts: list[str], vocab: Vocabulary) -> EncodedBatch:
    """`index.encode(texts)` gives what the Python tokenizer and vocabulary give; returns that."""
    ids, offsets, oov, oov_counts = index.encode(texts)
    want = _reference_encode(texts, vocab)
    np.testing.assert_array_equal(np.frombuffer(ids, np.int32), want.ids)
    np.testing.assert_array_equal(np.frombuffer(offsets, np.int64), want.offsets)
    np.testing.assert_array_equal(np.frombuffer(oov, np.bool_), want.oov)
    assert np.frombuffer(oov_counts, np.int64).tolist() == _oov_per_text(want)
    return want


def test_wordindex_equals_python_encoding() -> None:
    words = ["<unk>", "<s>", "</s>", "the", "é", "漢字", "a\u00a0b", "ünïcödé", "x" * 40, "it's"]
    vocab = Vocabulary.from_words(words)
    index = wordindex_module.WordIndex(list(vocab.words), vocab.unk_id)
    assert len(index) == len(words) and index.unk_id == vocab.unk_id
    rng = random.Random(7)
    for _ in range(300):
        texts = [_random_text(rng, words) for _ in range(rng.randrange(0, 8))]
        _assert_encodes_as_python(index, texts, vocab)


def test_wordindex_words_around_the_inline_length() -> None:
    # Words of up to 8 bytes are matched by their slot alone, longer ones by their bytes; a word
    # is read with one 8-byte load when the text goes on, byte by byte at its end.
    stems = ["x" * n for n in range(1, 20)] + ["ab\x00", "\x00", "é" * 4, "漢" * 3, "\x7f" * 8]
    rng = random.Random(3)
    extra = [
        "".join(rng.choice("abcdefgh") for _ in range(rng.randrange(1, 14))) for _ in range(3000)
    ]
    words = ["<unk>", "<s>", "</s>", *stems, *sorted(set(extra) - set(stems))]
    vocab = Vocabulary.from_words(words)
    index = wordindex_module.WordIndex(list(vocab.words), vocab.unk_id)
    near = [w[:-1] + chr(ord(w[-1]) + 1) for w in stems] + [w + "x" for w in stems] + ["ab", "a"]
    probes = stems + near + [w[:-1] for w in stems if len(w) > 1] + extra[:500]
    texts = [" ".join(probes[i : i + 7]) for i in range(len(probes))] + probes
    want = _assert_encodes_as_python(index, texts, vocab)
    assert 0 < int(want.oov.sum()) < len(want.oov)  # both hits and misses were looked up


def test_wordindex_splits_across_block_boundaries() -> None:
    """The splitter reads 16 bytes at a time: words and whitespace runs that start, end or
    straddle a block's edge, texts that end exactly on one, and words longer than a block."""
    words = ["<unk>", "<s>", "</s>", "é", "漢字", *("w" * n for n in range(1, 40))]
    vocab = Vocabulary.from_words(words)
    index = wordindex_module.WordIndex(list(vocab.words), vocab.unk_id)
    rng = random.Random(5)
    texts = []
    for lead in range(34):
        for length in (1, 2, 7, 8, 9, 15, 16, 17, 31, 33):
            gap = rng.choice([" ", "\t", "\r\n", " " * 17, "\x0b\x0c"])
            texts.append(" " * lead + "w" * length + gap + "漢字" + gap + "é" * (length % 5 + 1))
            texts.append("x" * lead + " " + "w" * length)  # ends with a word, any alignment
            texts.append("w" * (lead + length))  # one word, no whitespace at all
    texts += ["w" * 16, "w" * 32, " " * 16, " " * 32 + "w", "\t" * 15 + "ww" + " " * 15]
    _assert_encodes_as_python(index, texts, vocab)


def test_wordindex_kenlm_whitespace_only() -> None:
    index = wordindex_module.WordIndex(["<unk>", "a", "b"], 0)
    ids, offsets, oov, oov_counts = index.encode(
        ["a\u00a0b a\tb\x0b\x0cb\r\n", "", "   ", "<unk> c"]
    )
    assert np.frombuffer(ids, np.int32).tolist() == [0, 1, 2, 2, 0, 0]
    assert np.frombuffer(offsets, np.int64).tolist() == [0, 4, 4, 4, 6]
    assert np.frombuffer(oov, np.bool_).tolist() == [True, False, False, False, True, True]
    assert np.frombuffer(oov_counts, np.int64).tolist() == [1, 0, 0, 2]


def test_wordindex_rejects_bad_input() -> None:
    index = wordindex_module.WordIndex(["<unk>", "a"], 0)
    with pytest.raises(TypeError, match=r"texts\[1\]"):
        index.encode(["a", b"a"])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        index.encode(["a", None])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        index.encode(5)  # type: ignore[arg-type]
    with pytest.raises(UnicodeEncodeError):
        index.encode(["\ud800"])
    with pytest.raises(TypeError):
        wordindex_module.WordIndex(["<unk>", 3], 0)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="duplicate"):
        wordindex_module.WordIndex(["<unk>", "a", "a"], 0)
    with pytest.raises(ValueError):
        wordindex_module.WordIndex(["<unk>"], 1)
    fresh = wordindex_module.WordIndex.__new__(wordindex_module.WordIndex)
    with pytest.raises(RuntimeError):
        fresh.encode(["a"])


def test_text_encoder_native_equals_python() -> None:
    words = ["<unk>", "<s>", "</s>", "the", "é", "漢字", "a\u00a0b", "ünïcödé", "x" * 40, "it's"]
    vocab = Vocabulary.from_words(words)
    rng = random.Random(11)
    for lowercase in (False, True):
        tokenizer = WordTokenizer(lowercase=lowercase)
        native, python = TextEncoder(tokenizer, vocab), TextEncoder(tokenizer, vocab, native=False)
        assert native.native and not python.native
        for _ in range(100):
            texts = [_random_text(rng, words).upper() for _ in range(rng.randrange(0, 6))]
            got, want = native.encode_texts(texts), python.encode_texts(texts)
            np.testing.assert_array_equal(got.ids, want.ids)
            np.testing.assert_array_equal(got.offsets, want.offsets)
            np.testing.assert_array_equal(got.oov, want.oov)


def _assert_same_batch(got: EncodedBatch, want: EncodedBatch) -> None:
    np.testing.assert_array_equal(got.ids, want.ids)
    np.testing.assert_array_equal(got.offsets, want.offsets)
    np.testing.assert_array_equal(got.oov, want.oov)
    assert got.oov_counts is not None and got.oov_counts.tolist() == _oov_per_text(want)


def test_wordindex_encode_words_equals_python_encoding() -> None:
    """Words split elsewhere are each looked up whole: spaces, empty and NUL-bearing words, the
    literal `<unk>` (an OOV, as KenLM counts it) and a lone surrogate (no UTF-8 form: unknown,
    as the dict finds it) all as the Python reference encodes them."""
    stems = ["x" * n for n in range(1, 20)] + ["ab\x00", "\x00", "é" * 4, "漢" * 3, "a b", " "]
    words = ["<unk>", "<s>", "</s>", "the", "it's", "a\u00a0b", *stems]
    vocab = Vocabulary.from_words(words)
    index = wordindex_module.WordIndex(list(vocab.words), vocab.unk_id)
    near = [w + "x" for w in stems] + [w[:-1] for w in stems if len(w) > 1]
    pool = [*words, *near, "", "\ud800", "\ud800x" * 3, "THE", "<unk>"]
    rng = random.Random(13)
    for _ in range(300):
        lists = [rng.choices(pool, k=rng.randrange(0, 12)) for _ in range(rng.randrange(0, 6))]
        ids, offsets, oov, oov_counts = index.encode_words(lists)
        got = EncodedBatch(
            ids=np.frombuffer(ids, np.int32),
            offsets=np.frombuffer(offsets, np.int64),
            oov=np.frombuffer(oov, np.bool_),
            oov_counts=np.frombuffer(oov_counts, np.int64),
        )
        _assert_same_batch(got, encode_token_lists(lists, vocab))
    with pytest.raises(TypeError, match=r"token_lists\[1\]\[0\]"):
        index.encode_words([["the"], [3]])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        index.encode_words([None])  # type: ignore[list-item]
    fresh = wordindex_module.WordIndex.__new__(wordindex_module.WordIndex)
    with pytest.raises(RuntimeError):
        fresh.encode_words([["a"]])


def test_text_encoder_regex_tokenizer_native_equals_python() -> None:
    """A regex tokenizer (the KJV models': lowercase, `[a-z]+(?:'[a-z]+)*`) splits in Python and
    encodes in C: the same batches as the Python path, for texts and for token lists."""
    words = ["<unk>", "<s>", "</s>", "the", "é", "it's", "god", "said", "a\u00a0b"]
    vocab = Vocabulary.from_words(words)
    rng = random.Random(17)
    for pattern in (r"[a-z]+(?:'[a-z]+)*", r"\S+", r"\w*"):
        tokenizer = WordTokenizer(lowercase=True, pattern=pattern)
        native, python = TextEncoder(tokenizer, vocab), TextEncoder(tokenizer, vocab, native=False)
        assert native.native and not python.native
        for _ in range(100):
            texts = [_random_text(rng, words).upper() for _ in range(rng.randrange(0, 6))]
            _assert_same_batch(native.encode_texts(texts), python.encode_texts(texts))
            lists = tokenizer.split_batch(texts)
            _assert_same_batch(native.encode_token_lists(lists), python.encode_token_lists(lists))


def _final_slots(*keys: int) -> np.ndarray:
    """A highest-order table's slots (12 bytes each) as the bytes the Scorer takes."""
    slots = np.zeros(len(keys), dtype=FINAL_SLOT_DTYPE)
    slots["key"] = keys
    return slots.view(np.uint8)


def test_scorer_refuses_malformed_probing_tables() -> None:
    empty = int(np.iinfo(np.uint64).max)
    good = _final_slots(empty, empty)  # two slots, both empty
    scorer = kernel_module.Scorer(np.zeros(3), np.zeros(3), (good,), (1,), 0, 1)
    totals = np.empty(1)
    scorer.score(np.array([2, 2], np.int32), np.array([0, 2], np.int64), True, True, totals)
    assert totals[0] == 0.0
    last_slot_used = _final_slots(empty, 5)
    for table, n_home in [(last_slot_used, 1), (good, 2), (good, 0), (good[:-4], 1)]:
        with pytest.raises(ValueError, match="malformed probing table"):
            kernel_module.Scorer(np.zeros(3), np.zeros(3), (table,), (n_home,), 0, 1)
    # A context order's 16-byte slots are not a highest order's 12-byte ones.
    with pytest.raises(ValueError, match="malformed probing table"):
        kernel_module.Scorer(np.zeros(3), np.zeros(3), (good[:16],), (1,), 0, 1)
    with pytest.raises(TypeError):
        kernel_module.Scorer(np.zeros(3), np.zeros(3), (good.view(np.int8),), (1,), 0, 1)
    with pytest.raises(TypeError):
        kernel_module.Scorer(np.zeros(3), np.zeros(3), (good,), (), 0, 1)
    with pytest.raises(OverflowError):
        kernel_module.Scorer(np.zeros(3), np.zeros(3), (good,), (-1,), 0, 1)


# -- next-token distributions ----------------------------------------------------------------

KENLM_TESTS = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "kenlm-tests"


def _model_ngram(rng: random.Random, model: NgramModel) -> list[int]:
    """The words of a random entry of a random order >= 2: a context that matches deep."""
    tables = model.tables.tables
    k = rng.randrange(2, model.order + 1)
    used = np.flatnonzero(tables[k - 2].slots["key"] != EMPTY)
    slot = int(used[rng.randrange(len(used))])
    words = []
    for j in range(k, 1, -1):  # the entry's last word, then its prefix's slot in order j-1
        key = int(tables[j - 2].slots["key"][slot])
        words.append(key & 0xFFFFFFFF)
        slot = key >> 32
    return [slot, *words[::-1]]  # order 1's "slot" is the word id


def _random_contexts(rng: random.Random, model: NgramModel, n: int) -> list[list[int]]:
    """Contexts of 0 to order+2 ids: the model's n-grams (each with some ids before it, so
    that longer contexts are cut), frequent words, any id, <unk>, <s> and </s>."""
    vocab = model.vocab
    words = ("the", "and", "of", "lord", "unto", "said", "a", "b", "c")
    frequent = [vocab.index[w] for w in words if w in vocab.index] or list(range(len(vocab)))
    special = [vocab.unk_id, vocab.bos_id, vocab.eos_id]
    contexts = []
    for _ in range(n):
        pool = rng.choice([frequent, list(range(len(vocab))), special + frequent])
        context = [rng.choice(pool) for _ in range(rng.randrange(0, model.order + 3))]
        if model.order > 1 and rng.random() < 0.5:
            ngram = _model_ngram(rng, model)
            context = context[: rng.randrange(0, 3)] + ngram[: rng.randrange(1, len(ngram) + 1)]
        contexts.append(context)
    return contexts


def _python_rows(model: NgramModel, contexts: list[list[int]], bos: bool) -> np.ndarray:
    """The numpy kernel's rows (the reference), whatever kernel `model` uses."""
    reference = NgramModel(model.tables, kernel="numpy")
    return np.stack([reference.next_token_log_probs(c, bos=bos) for c in contexts])


@pytest.mark.parametrize("arpa", ["kjv3", "test.arpa", "test_nounk.arpa"])
def test_distributions_equal_next_token_log_probs(
    arpa: str, models: tuple[NgramModel, NgramModel]
) -> None:
    if arpa == "kjv3":
        ref, c = models
    else:  # KenLM's hand-made 5-grams: pruned contexts, missing prefixes, no <unk>
        ref = NgramModel.from_arpa(KENLM_TESTS / arpa, kernel="numpy")
        c = NgramModel(ref.tables, kernel="c")
    rng = random.Random(5)
    contexts = [[], [], *_random_contexts(rng, ref, 150)]
    for bos in (True, False):
        want = _python_rows(ref, contexts, bos)
        got = c.next_token_log_probs_batch(contexts, bos=bos)
        assert got.dtype == np.float32 and got.shape == (len(contexts), len(ref.vocab))
        np.testing.assert_allclose(got, want.astype(np.float32), rtol=1e-6, atol=1e-6)
        # The numpy kernel's batch is its per-row path, in float32.
        np.testing.assert_array_equal(
            ref.next_token_log_probs_batch(contexts, bos=bos), want.astype(np.float32)
        )


def test_bigram_lists_lose_no_word(models: tuple[NgramModel, NgramModel]) -> None:
    """The distributions look up only the bigram list's words after a context; a Scorer without
    the lists looks the whole vocabulary up, and must give the very same rows."""
    c = models[1]
    whole_vocabulary = kernel_module.Scorer(*c._scorer_args()[:7])
    rng = random.Random(11)
    contexts = [[], *_random_contexts(rng, c, 120)]
    offsets = np.array([0, *np.cumsum([len(x) for x in contexts])], dtype=np.int64)
    ids = np.array([i for x in contexts for i in x], dtype=np.int32)
    want = np.empty((len(contexts), len(c.vocab)), np.float32)
    whole_vocabulary.distributions(ids, offsets, True, want)
    np.testing.assert_array_equal(c.next_token_log_probs_batch(contexts), want)
    start, words = c.tables.bigram_start, c.tables.bigram_words
    assert len(words) == c.tables.tables[0].n_entries and start[-1] == len(words)
    with pytest.raises(ValueError, match="bigram lists"):
        kernel_module.Scorer(*c._scorer_args()[:7], start[:-1], words)
    with pytest.raises(ValueError, match="bigram lists"):
        kernel_module.Scorer(*c._scorer_args()[:7], start, words[:-1])
    with pytest.raises(TypeError, match="both"):
        kernel_module.Scorer(*c._scorer_args()[:7], start)


def test_distributions_are_normalised_and_shared_rows_equal(
    models: tuple[NgramModel, NgramModel],
) -> None:
    c = models[1]
    rng = random.Random(9)
    base = _random_contexts(rng, c, 40)
    # Repeated contexts, side by side and apart; and enough cells to release the GIL (4M).
    contexts = [*base, *base[::-1], base[3], base[3], *_random_contexts(rng, c, 300)]
    assert len(contexts) * len(c.vocab) >= 1 << 22
    out = np.full((len(contexts), len(c.vocab)), np.nan, dtype=np.float32)
    assert c.next_token_log_probs_batch(contexts, bos=True, out=out) is out
    want = _python_rows(c, contexts, True).astype(np.float32)
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)
    # lmplz's model is normalised; <s> (context only) is excluded.
    mask = np.ones(len(c.vocab), dtype=np.bool_)
    mask[c.vocab.bos_id] = False
    sums = np.exp(out[:, mask].astype(np.float64)).sum(axis=1)
    np.testing.assert_allclose(sums, 1.0, atol=1e-4)
    assert c.next_token_log_probs_batch([]).shape == (0, len(c.vocab))


def test_distributions_of_a_unigram_model(tmp_path: Path) -> None:
    arpa = tmp_path / "uni.arpa"
    arpa.write_text(UNIGRAM_ARPA)
    c = NgramModel.from_arpa(arpa, kernel="c")
    contexts = [[], [3, 3], [0]]
    for bos in (True, False):
        want = _python_rows(c, contexts, bos).astype(np.float32)
        np.testing.assert_array_equal(c.next_token_log_probs_batch(contexts, bos=bos), want)
    # Through the binary too (a unigram model's bigram lists are empty, one offset a word).
    c.save(tmp_path / "uni.lmbin")
    loaded = NgramModel.load(tmp_path / "uni.lmbin")
    assert len(loaded.tables.bigram_start) == len(loaded.vocab) + 1
    np.testing.assert_array_equal(
        loaded.next_token_log_probs_batch(contexts), c.next_token_log_probs_batch(contexts)
    )


def test_distributions_reject_bad_input(models: tuple[NgramModel, NgramModel]) -> None:
    c = models[1]
    v = len(c.vocab)
    with pytest.raises(ValueError, match="vocabulary id"):
        c.next_token_log_probs_batch([[1, v]])
    with pytest.raises(ValueError, match="vocabulary id"):
        c.next_token_log_probs_batch([[-1]])
    with pytest.raises(ValueError, match="out must be float32"):
        c.next_token_log_probs_batch([[1]], out=np.empty((1, v)))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="out must be float32"):
        c.next_token_log_probs_batch([[1]], out=np.empty((2, v), np.float32))
    scorer = c._c
    assert scorer is not None
    ids = np.array([1, 2, 3], np.int32)
    out = np.empty((1, v), np.float32)
    with pytest.raises(ValueError, match="offsets"):
        scorer.distributions(ids, np.array([0, 2], np.int64), True, out)
    with pytest.raises(ValueError, match="offsets"):
        scorer.distributions(ids, np.array([0, 3, 1, 3], np.int64), True, np.empty((3, v), "f4"))
    with pytest.raises(ValueError, match="shape"):
        scorer.distributions(ids, np.array([0, 3], np.int64), True, np.empty((2, v), np.float32))
    with pytest.raises(ValueError, match="shape"):
        scorer.distributions(ids, np.array([0, 3], np.int64), True, np.empty(v, np.float32))
    with pytest.raises(TypeError, match="float32"):
        scorer.distributions(ids, np.array([0, 3], np.int64), True, np.empty((1, v)))
    with pytest.raises(TypeError, match="ids"):
        scorer.distributions(ids.astype(np.int64), np.array([0, 3], np.int64), True, out)
    with pytest.raises((BufferError, ValueError), match="contiguous"):
        scorer.distributions(ids, np.array([0, 3], np.int64), True, np.empty((v, 2), "f4").T[:1])
    readonly = np.empty((1, v), np.float32)
    readonly.flags.writeable = False
    with pytest.raises((BufferError, ValueError)):
        scorer.distributions(ids, np.array([0, 3], np.int64), True, readonly)
