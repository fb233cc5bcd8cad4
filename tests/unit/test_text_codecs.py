"""Word, character and BPE codecs: round trips, word counts, unknown characters, vocab.txt
escaping, and the `TextCodec` contract the scorer relies on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lmserve.server.backends.base import Vocabulary
from lmserve.server.text.bpe import BpeCodec
from lmserve.server.text.char import (
    CharCodec,
    escape_token,
    read_vocab_file,
    unescape_token,
    write_vocab_file,
)
from lmserve.server.text.codec import TextCodec, WordCodec
from lmserve.server.text.word import WordTokenizer

TEXTS = [
    "in the beginning god created the heaven and the earth",
    "and the earth was without form and void",
    "and god said let there be light and there was light",
    "and god saw the light that it was good",
] * 5
TRICKY = [" ", "\n", "\r", "\t", "\\", "\\s", "\x00", "\x85", "\u2028", "é", "😀", "<s>", "a b"]


@pytest.mark.parametrize("token", TRICKY)
def test_escape_round_trips_and_keeps_one_visible_line(token: str) -> None:
    line = escape_token(token)
    assert unescape_token(line) == token
    assert len(line.splitlines()) == 1 and line.strip() == line


def test_vocab_file_round_trip(tmp_path: Path) -> None:
    words = ["<unk>", "<s>", "</s>", *TRICKY[:-3]]
    write_vocab_file(tmp_path / "vocab.txt", words, escape=True)
    assert len((tmp_path / "vocab.txt").read_text().split("\n")) == len(words) + 1
    assert read_vocab_file(tmp_path / "vocab.txt", escape=True) == words


def test_char_codec_reads_words_joined_by_single_spaces() -> None:
    codec = CharCodec.train(TEXTS)
    assert codec.vocab.words[:3] == ("<unk>", "<s>", "</s>")
    batch = codec.encode_texts(["  god\tsaw  the light\n", "", "and"])
    assert batch.offsets.tolist() == [0, 17, 17, 20]
    assert codec.decode(batch.ids[:17].tolist()) == "god saw the light"
    assert codec.count_words("  god\tsaw  the light\n") == 4
    assert not batch.oov.any()
    # Adding <s>/</s> around the ids does not change the text.
    v = codec.vocab
    assert codec.decode([v.bos_id, *batch.ids[17:].tolist(), v.eos_id]) == "and"


def test_char_codec_marks_unknown_characters() -> None:
    codec = CharCodec.train(TEXTS)
    batch = codec.encode_texts(["god!"])
    assert batch.oov.tolist() == [False, False, False, True]
    assert batch.ids[-1] == codec.vocab.unk_id
    assert codec.decode(batch.ids.tolist()) == "god<unk>"


def test_char_codec_lowercase_pattern_and_token_lists() -> None:
    codec = CharCodec.train(TEXTS, lowercase=True, pattern=r"[a-z]+")
    assert codec.normalize("God, said: LET!") == "god said let"
    assert codec.count_words("God, said: LET!") == 3
    from_lists = codec.encode_token_lists([["god", "said"]])
    assert np.array_equal(from_lists.ids, codec.encode_texts(["GOD said"]).ids)


def test_char_codec_from_vocab_file(tmp_path: Path) -> None:
    codec = CharCodec.train(TEXTS)
    codec.save_vocab(tmp_path / "vocab.txt")
    loaded = CharCodec.from_vocab_file(tmp_path / "vocab.txt")
    assert loaded.vocab.words == codec.vocab.words
    assert " " in loaded.vocab.index


def test_bpe_codec_round_trips_and_counts_words(tmp_path: Path) -> None:
    codec = BpeCodec.train(TEXTS, vocab_size=60, min_frequency=1)
    assert codec.vocab.words[:3] == ("<unk>", "<s>", "</s>")
    assert len(codec.vocab) <= 60
    for text in TEXTS[:4]:
        batch = codec.encode_texts([text])
        assert codec.decode(batch.ids.tolist()) == text
        # Subwords: fewer tokens than characters, at least one per word.
        assert codec.count_words(text) <= len(batch.ids) < len(text)
    assert codec.decode(codec.encode_texts(["  god \t saw\n"]).ids.tolist()) == "god saw"

    codec.save(tmp_path / "tokenizer.json")
    loaded = BpeCodec.from_file(tmp_path / "tokenizer.json")
    assert loaded.vocab.words == codec.vocab.words
    a, b = codec.encode_texts(TEXTS[:3]), loaded.encode_texts(TEXTS[:3])
    assert np.array_equal(a.ids, b.ids) and np.array_equal(a.offsets, b.offsets)


def test_bpe_codec_marks_unknown_characters_and_empty_texts() -> None:
    codec = BpeCodec.train(TEXTS, vocab_size=60, min_frequency=1)
    batch = codec.encode_texts(["god!", ""])
    assert batch.batch_size == 2 and batch.offsets[1] == batch.offsets[2]
    assert batch.oov.any() and codec.vocab.unk_id in batch.ids.tolist()
    assert batch.ids.dtype == np.int32 and batch.offsets.dtype == np.int64


def test_bpe_codec_lowercases_in_its_tokenizer_json_too() -> None:
    codec = BpeCodec.train(TEXTS, vocab_size=60, min_frequency=1, lowercase=True)
    upper = codec.encode_texts(["GOD SAID"]).ids.tolist()
    assert upper == codec.encode_texts(["god said"]).ids.tolist()
    # The tokenizer.json alone (no Python-side lowercasing) gives the same ids.
    standalone = BpeCodec.from_json(codec.to_json())
    assert standalone.tokenizer.encode("GOD SAID", add_special_tokens=False).ids == upper


def _codecs() -> list[TextCodec]:
    words = WordTokenizer(lowercase=True)
    vocab = Vocabulary.from_words(
        ["<unk>", "<s>", "</s>", *sorted({w for t in TEXTS for w in words.split(t)})]
    )
    return [
        WordCodec(words, vocab),
        CharCodec.train(TEXTS, lowercase=True),
        BpeCodec.train(TEXTS, vocab_size=60, min_frequency=1, lowercase=True),
    ]


@pytest.mark.parametrize("codec", _codecs(), ids=["word", "character", "bpe"])
def test_every_codec_counts_words_alike_and_encodes_texts_as_their_words(
    codec: TextCodec,
) -> None:
    texts = ["In  the\tBeginning", "", "GOD said   let"]
    assert [codec.count_words(t) for t in texts] == [3, 0, 3]
    from_texts = codec.encode_texts(texts)
    from_words = codec.encode_token_lists([t.lower().split() for t in texts])
    assert from_texts.ids.tolist() == from_words.ids.tolist()
    assert from_texts.offsets.tolist() == from_words.offsets.tolist()
    assert int(from_texts.ids.max()) < len(codec.vocab)


@pytest.mark.parametrize("codec", _codecs(), ids=["word", "character", "bpe"])
def test_every_codec_says_what_its_tokens_are(codec: TextCodec) -> None:
    """What differs by kind is asked of the codec: words or pieces, how pieces spell a word,
    whether entries need decoding, and the token names a client keeps."""
    text = "And GOD  said"
    assert codec.split_batch([text, ""]) == [["and", "god", "said"], []]
    ids = codec.encode_texts([text]).ids.tolist()
    pieces = codec.piece_vocabulary()
    decode = codec.piece_decoder()
    names = codec.token_names(text, ids)
    if isinstance(codec, WordCodec):
        assert codec.tokens_are_words and pieces is None and decode is None
        assert names == ["and", "god", "said"]
        assert codec.token_names("and god", [3]) == [codec.vocab.words[3]]  # counts differ
        return
    assert not codec.tokens_are_words and pieces is not None
    assert names == [codec.vocab.words[i] for i in ids]
    spelled = "".join(pieces.texts[i] for i in ids)
    assert spelled == "andgodsaid"  # word ends add nothing to the words
    assert int(pieces.ends_word[ids].sum()) == 3 - isinstance(codec, CharCodec)
    if isinstance(codec, BpeCodec):
        assert decode is not None and decode(ids) == "and god said"
    else:
        assert decode is None
