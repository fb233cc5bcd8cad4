"""WordPrefixIndex against a brute-force filter of the KJV vocabulary, for random prefixes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmserve.server.text.prefix_index import WordPrefixIndex
from lmserve.server.text.vocab import Vocabulary

REPO_ROOT = Path(__file__).resolve().parents[2]
KJV_VOCAB = REPO_ROOT / "models" / "kjv-lstm" / "vocab.txt"


def _kjv_vocab() -> Vocabulary:
    if not KJV_VOCAB.is_file():
        pytest.fail(f"{KJV_VOCAB} missing: the default models ship with the repository")
    return Vocabulary.from_words(KJV_VOCAB.read_text(encoding="utf-8").split("\n")[:-1])


VOCAB = _kjv_vocab() if KJV_VOCAB.is_file() else None
INDEX = WordPrefixIndex.from_vocab(VOCAB) if VOCAB is not None else None
SPECIALS = {"<s>", "</s>", "<unk>"}


def brute_force(vocab: Vocabulary, prefix: str, excluded: set[int]) -> list[int]:
    """Every id whose word starts with `prefix`, in word order (ties by id)."""
    hits = [
        i
        for i, w in enumerate(vocab.words)
        if i not in excluded and w not in SPECIALS and w.startswith(prefix)
    ]
    return sorted(hits, key=lambda i: (vocab.words[i], i))


def _words() -> st.SearchStrategy[str]:
    """Prefixes of real words (most have hits), mixed with arbitrary strings (most have none)."""
    assert VOCAB is not None
    real = st.sampled_from(VOCAB.words).flatmap(
        lambda w: st.integers(0, len(w)).map(lambda n: w[:n])
    )
    alphabet = st.sampled_from("abcdeghilmnorstuwyz'<>/\U0010ffff\x00é")
    return st.one_of(real, st.text(alphabet, max_size=4))


@settings(max_examples=300, deadline=None)
@given(prefix=_words())
def test_ids_with_prefix_equal_a_brute_force_filter(prefix: str) -> None:
    assert VOCAB is not None and INDEX is not None
    got = INDEX.ids_with_prefix(prefix)
    assert got.dtype == np.int64
    assert got.tolist() == brute_force(VOCAB, prefix, set())


def test_specials_are_never_indexed_and_the_empty_prefix_is_everything_else() -> None:
    assert VOCAB is not None and INDEX is not None
    everything = INDEX.ids_with_prefix("")
    assert len(everything) == len(VOCAB) - 3
    assert {VOCAB.bos_id, VOCAB.eos_id, VOCAB.unk_id}.isdisjoint(everything.tolist())
    assert INDEX.ids_with_prefix("<").tolist() == []
    assert list(INDEX.words) == sorted(INDEX.words)


def test_the_answer_is_a_read_only_view_not_a_copy() -> None:
    assert INDEX is not None
    got = INDEX.ids_with_prefix("lo")
    assert got.base is INDEX.ids
    with pytest.raises(ValueError):
        got[0] = 1


def test_excluded_ids_and_pad_are_left_out() -> None:
    vocab = Vocabulary.from_words(["<unk>", "<s>", "</s>", "<pad>", "go", "god", "good", "a"])
    vocab = Vocabulary.from_words(vocab.words, pad="<pad>")
    index = WordPrefixIndex.from_vocab(vocab, exclude_ids=[5])
    assert index.words == ("a", "go", "good")
    assert index.ids_with_prefix("go").tolist() == [4, 6]


def test_duplicate_texts_sit_together_by_id() -> None:
    index = WordPrefixIndex(["the", "th", "the", "\U0010ffff", "\U0010ffffa"], [9, 2, 4, 7, 8])
    assert index.ids_with_prefix("the").tolist() == [4, 9]
    assert index.ids_with_prefix("th").tolist() == [2, 4, 9]
    assert index.ids_with_prefix("\U0010ffff").tolist() == [7, 8]
