"""Autocomplete's searches against brute force: top-k by a full sort, subword words by
enumerating every token path of a small, table-driven model."""

from __future__ import annotations

import functools
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmserve.server.decoding.completion import top_k_subword_words, top_k_words
from lmserve.server.text.pieces import PieceVocabulary
from lmserve.server.text.vocab import Vocabulary

# -- top_k_words ---------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(st.integers(-6, 0), min_size=1, max_size=60),
    data=st.data(),
)
def test_top_k_words_equals_a_full_sort(values: list[int], data: st.DataObject) -> None:
    # Small integers: many ties, which must go to the lower id.
    log_probs = np.array(values, dtype=np.float64) / 2
    ids = data.draw(st.lists(st.sampled_from(range(len(values))), unique=True))
    k = data.draw(st.integers(1, len(values) + 2))
    expected = sorted(((i, float(log_probs[i])) for i in ids), key=lambda p: (-p[1], p[0]))[:k]
    assert top_k_words(log_probs, np.array(ids, dtype=np.int64), k) == expected


def test_top_k_words_over_a_kjv_sized_distribution() -> None:
    rng = np.random.default_rng(3)
    log_probs = np.log(rng.dirichlet(np.ones(12_352))).astype(np.float32)
    ids = rng.choice(12_352, size=5_000, replace=False)
    got = top_k_words(log_probs, ids, 10)
    expected = sorted(((int(i), float(log_probs[i])) for i in ids), key=lambda p: (-p[1], p[0]))
    assert got == expected[:10]


@pytest.mark.parametrize("k", [1, 7, 100, 700, 2999, 3000, 4000])
def test_top_k_words_settles_ties_by_id_over_many_candidates(k: int) -> None:
    # Few distinct values over thousands of candidates: the k-th value is tied many times.
    rng = np.random.default_rng(k)
    log_probs = rng.integers(-5, 1, 10_000).astype(np.float32)
    ids = rng.choice(10_000, size=3_000, replace=False)
    expected = sorted(((int(i), float(log_probs[i])) for i in ids), key=lambda p: (-p[1], p[0]))
    assert top_k_words(log_probs, ids, k) == expected[:k]


def test_top_k_words_rejects_k_below_one() -> None:
    with pytest.raises(ValueError):
        top_k_words(np.zeros(3), [0, 1], 0)


# -- top_k_subword_words -------------------------------------------------------------------------

SPECIALS = ["<unk>", "<s>", "</s>"]
CHARS = Vocabulary.from_words([*SPECIALS, "a", "b", "c", " "])
BPE = Vocabulary.from_words(
    [*SPECIALS, "a", "b", "ab", "ba", "a</w>", "b</w>", "ab</w>", "bab</w>", "</w>"]
)
MAX_LEN = 4  # after this many tokens the table model can only end the word


@functools.cache
def table_model(kind: str, seed: int):  # type: ignore[no-untyped-def]
    """A fixed distribution per token path (pseudo-random, from the path and the seed); after
    MAX_LEN tokens only word ends and specials keep probability, so every path is finite."""
    vocab, pieces = _pieces(kind)

    @functools.cache
    def expand(path: tuple[int, ...]) -> np.ndarray:
        key = zlib.crc32(bytes([seed % 256, *path]))
        logits = np.random.default_rng(key).normal(0, 2, len(vocab))
        if len(path) >= MAX_LEN:
            logits[~(pieces.ends_word | ~pieces.usable)] = -np.inf
        return logits - np.logaddexp.reduce(logits)

    return expand


@functools.cache
def brute_force(kind: str, seed: int, prefix: str) -> list[tuple[str, float]]:
    """Every path of usable tokens that ends at its first word end; a word's
    log-prob is its best path's. All of them, best first."""
    vocab, pieces = _pieces(kind)
    expand = table_model(kind, seed)
    usable = [i for i in range(len(vocab)) if pieces.usable[i]]
    best: dict[str, float] = {}

    def walk(path: tuple[int, ...], word: str, lp: float) -> None:
        if len(path) > MAX_LEN:
            return
        dist = expand(path)
        for i in usable:
            spelled, total = word + pieces.texts[i], lp + float(dist[i])
            if not pieces.ends_word[i]:
                walk((*path, i), spelled, total)
            elif spelled and spelled.startswith(prefix) and total > -np.inf:
                best[spelled] = max(best.get(spelled, -np.inf), total)

    walk((), "", 0.0)
    return sorted(best.items(), key=lambda p: -p[1])


@functools.cache
def _pieces(kind: str) -> tuple[Vocabulary, PieceVocabulary]:
    if kind == "chars":
        return CHARS, PieceVocabulary.for_characters(CHARS)
    return BPE, PieceVocabulary.for_bpe(BPE)


@pytest.mark.parametrize("kind", ["chars", "bpe"])
@pytest.mark.parametrize("prefix", ["", "a", "ab", "ba", "bab", "c", "abcab"])
@pytest.mark.parametrize("seed", [1, 2])
def test_exhaustive_budget_gives_the_brute_force_top_k(kind: str, prefix: str, seed: int) -> None:
    vocab, pieces = _pieces(kind)
    expand = table_model(kind, seed)
    expected = brute_force(kind, seed, prefix)[:5]
    got = top_k_subword_words(expand, prefix, 5, pieces=pieces, max_expansions=10_000)
    assert got.exact
    assert [w for w, _ in got.words] == [w for w, _ in expected]
    np.testing.assert_allclose([lp for _, lp in got.words], [lp for _, lp in expected], atol=1e-9)


@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(["chars", "bpe"]),
    prefix=st.text("abc", max_size=3),
    k=st.integers(1, 6),
    budget=st.integers(1, 40),
    seed=st.integers(0, 3),
)
def test_a_bounded_search_is_exact_when_it_says_so(
    kind: str, prefix: str, k: int, budget: int, seed: int
) -> None:
    vocab, pieces = _pieces(kind)
    expand = table_model(kind, seed)
    calls: list[tuple[int, ...]] = []

    def counted(path: tuple[int, ...]) -> np.ndarray:
        calls.append(path)
        return expand(path)

    got = top_k_subword_words(counted, prefix, k, pieces=pieces, max_expansions=budget)
    assert got.expansions == len(calls) <= budget
    everything = dict(brute_force(kind, seed, prefix))
    # Whatever it returns is a real word with the log-prob of one of its paths (its best
    # path's unless that one was cut), best first ...
    for word, lp in got.words:
        assert word.startswith(prefix)
        assert lp <= everything[word] + 1e-9
        if got.exact:
            assert lp == pytest.approx(everything[word], abs=1e-9)
    assert [lp for _, lp in got.words] == sorted((lp for _, lp in got.words), reverse=True)
    # ... and when it says exact, it is the brute force's top k.
    if got.exact:
        expected = sorted(everything.items(), key=lambda p: -p[1])[:k]
        assert [w for w, _ in got.words] == [w for w, _ in expected]


def test_a_tiny_budget_is_reported_as_cut() -> None:
    vocab, pieces = _pieces("chars")
    got = top_k_subword_words(table_model("chars", 1), "", 3, pieces=pieces, max_expansions=1)
    assert got.words == [] and not got.exact and got.expansions == 1


def test_specials_are_never_part_of_a_word() -> None:
    vocab, pieces = _pieces("bpe")
    assert not pieces.usable[[vocab.unk_id, vocab.bos_id, vocab.eos_id]].any()
    assert pieces.texts[vocab.index["ab</w>"]] == "ab" and pieces.ends_word[vocab.index["ab</w>"]]
    assert not pieces.ends_word[vocab.index["ab"]]


def test_piece_vocabularies_read_the_codecs_word_ends() -> None:
    from lmserve.server.text.bpe import BpeCodec
    from lmserve.server.text.char import CharCodec

    lines = ["in the beginning god created the heaven and the earth"] * 5
    bpe = BpeCodec.train(lines, vocab_size=40)
    chars = CharCodec.train(lines)
    for codec, pieces in [
        (bpe, PieceVocabulary.for_bpe(bpe.vocab)),
        (chars, PieceVocabulary.for_characters(chars.vocab)),
    ]:
        for word in ["beginning", "heaven", "the", "created"]:
            ids = codec.encode_texts([f"{word} and"]).ids.tolist()
            # The word's pieces up to the first word end spell it; only the last ends it.
            end = next(j for j, i in enumerate(ids) if pieces.ends_word[i])
            assert "".join(pieces.texts[i] for i in ids[: end + 1]) == word
            assert all(pieces.usable[i] for i in ids)
