"""Word tokenization and batch encoding: the same words and ids a hand-made lookup gives."""

from __future__ import annotations

import numpy as np

from lmserve.server.backends.base import Vocabulary
from lmserve.server.text.word import TextEncoder, WordTokenizer, encode_token_lists

VOCAB = Vocabulary.from_words(["<unk>", "<s>", "</s>", "the", "king's", "house"])


def test_default_split_is_kenlm_whitespace_rule() -> None:
    assert WordTokenizer().split("  The\tking's  house\n") == ["The", "king's", "house"]


def test_pattern_and_lowercase_reproduce_the_kjv_preparation() -> None:
    tok = WordTokenizer(lowercase=True, pattern=r"[a-z]+(?:'[a-z]+)*")
    assert tok.split("Beth-el: the KING'S house, 'brethren'") == [
        "beth",
        "el",
        "the",
        "king's",
        "house",
        "brethren",
    ]


def test_encode_flattens_with_offsets_and_marks_oov() -> None:
    lists = [["the", "house"], [], ["queen's", "house", "<unk>"]]
    batch = encode_token_lists(lists, VOCAB)
    assert batch.batch_size == 3
    assert batch.offsets.tolist() == [0, 2, 2, 5]
    expected_ids = [VOCAB.index.get(w, VOCAB.unk_id) for words in lists for w in words]
    assert batch.ids.tolist() == expected_ids
    # An unknown word and the literal <unk> are both OOV, as KenLM counts them.
    assert batch.oov.tolist() == [False, False, True, False, True]
    assert batch.ids.dtype == np.int32


def test_encode_empty_batch() -> None:
    batch = encode_token_lists([], VOCAB)
    assert batch.batch_size == 0 and batch.ids.size == 0


def test_default_split_keeps_unicode_spaces_inside_words() -> None:
    # KenLM splits on ASCII whitespace only; str.split() would also split at these.
    text = "a\u00a0b\x0bc\x0cd\re\u2003f\u3000g\x1ch"
    assert WordTokenizer().split(text) == ["a\u00a0b", "c", "d", "e\u2003f\u3000g\x1ch"]


def test_text_encoder_matches_tokenizer_and_lookup() -> None:
    for native in (True, False):
        encoder = TextEncoder(WordTokenizer(lowercase=True), VOCAB, native=native)
        batch = encoder.encode_texts(["The  KING'S\thouse", "", "queen's <unk>\u00a0x"])
        assert batch.ids.tolist() == [3, 4, 5, 0, 0]
        assert batch.offsets.tolist() == [0, 3, 3, 5]
        assert batch.oov.tolist() == [False, False, False, True, True]
    assert TextEncoder(WordTokenizer(), VOCAB).native
