"""Stop strings across token boundaries, hold-back, finish reasons, incremental detokenization."""

from __future__ import annotations

import numpy as np
import pytest

from lmserve.server.backends.base import Vocabulary
from lmserve.server.decoding.detokenize import make_detokenizer
from lmserve.server.decoding.params import StoppingParams
from lmserve.server.decoding.stopping import FinishReason, StepText, StopChecker
from lmserve.server.errors import InvalidArgument

CHARS = Vocabulary.from_words(["<unk>", "<s>", "</s>", *"abcdxy "])
WORDS = Vocabulary.from_words(["<unk>", "<s>", "</s>", "the", "cat", "sat", "on", "mat"])


def _run(vocab: Vocabulary, kind: str, tokens: list[str], **stop: object) -> list[StepText]:
    params = StoppingParams(**{"max_new_tokens": 50, **stop})  # type: ignore[arg-type]
    checker = StopChecker(params, make_detokenizer(kind, vocab), eos_id=vocab.eos_id)  # type: ignore[arg-type]
    out = []
    for t in tokens:
        step = checker.add(vocab.index[t])
        out.append(step)
        if step.finish_reason is not None:
            break
    return out


def test_a_stop_string_spanning_tokens_is_trimmed() -> None:
    steps = _run(CHARS, "char", list("xabcd"), stop=("abc",))
    assert [s.text for s in steps] == ["x", "", "", ""]  # "a", "ab" held back, then found
    assert steps[-1].finish_reason == FinishReason.STOP
    steps = _run(WORDS, "word", "the cat sat on".split(), stop=("cat s",))
    assert "".join(s.text for s in steps) == "the " and steps[-1].finish_reason == FinishReason.STOP


def test_held_back_text_is_released_when_it_cannot_start_a_stop_string() -> None:
    steps = _run(CHARS, "char", list("abd") + ["</s>"], stop=("abc", "dd"))
    assert [s.text for s in steps] == ["", "", "ab", "d"]
    assert steps[-1].finish_reason == FinishReason.END_OF_SENTENCE


def test_finish_reasons() -> None:
    assert _run(CHARS, "char", ["a", "</s>"])[-1].finish_reason == FinishReason.END_OF_SENTENCE
    steps = _run(CHARS, "char", ["a", "b", "c"], stop_token_ids=(CHARS.index["b"],))
    assert steps[-1] == StepText("", FinishReason.STOP)
    params = StoppingParams(max_new_tokens=2, stop=("bc",))
    checker = StopChecker(params, make_detokenizer("char", CHARS), eos_id=CHARS.eos_id)
    assert checker.add(CHARS.index["a"]) == StepText("a")
    # The held-back "b" is sent at the length limit: it never became a stop string.
    assert checker.add(CHARS.index["b"]) == StepText("b", FinishReason.LENGTH)
    assert checker.text == "ab"
    with pytest.raises(RuntimeError):
        checker.add(CHARS.index["a"])
    other = StopChecker(params, make_detokenizer("char", CHARS), eos_id=CHARS.eos_id)
    assert other.cancel().finish_reason == FinishReason.CANCELLED


def test_stop_strings_count_from_min_new_tokens() -> None:
    steps = _run(CHARS, "char", list("abxab"), stop=("ab",), min_new_tokens=3)
    assert "".join(s.text for s in steps) == "abx" and steps[-1].finish_reason == FinishReason.STOP
    assert len(steps) == 5


def test_word_pieces_join_with_spaces() -> None:
    detok = make_detokenizer("word", WORDS)
    ids = [WORDS.index[w] for w in "the cat sat".split()]
    assert "".join(detok.add(i) for i in ids) == "the cat sat"


def test_bpe_pieces_concatenate_to_the_codecs_decode() -> None:
    from lmserve.server.text.bpe import BpeCodec

    text = "the cat sat on the mat and the dog sat on the cat " * 20
    codec = BpeCodec.train([text], vocab_size=40, min_frequency=1)
    rng = np.random.default_rng(0)
    for _ in range(5):
        ids = rng.integers(3, len(codec.vocab), size=15).tolist()
        detok = make_detokenizer("bpe", codec.vocab, codec.decode)
        pieces = [detok.add(i) for i in ids]
        assert "".join(pieces) + detok.flush() == codec.decode(ids)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_new_tokens": 0}, "stopping.max_new_tokens"),
        ({"max_new_tokens": 3, "min_new_tokens": 4}, "stopping.min_new_tokens"),
        ({"max_new_tokens": 3, "stop": ("",)}, "stopping.stop"),
        ({"max_new_tokens": 3, "stop_token_ids": (-1,)}, "stopping.stop_token_ids"),
    ],
)
def test_invalid_stopping_params_name_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        StoppingParams(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field
    with pytest.raises(InvalidArgument, match="stop_token_ids"):
        StoppingParams(max_new_tokens=3, stop_token_ids=(9,)).validate(
            max_new_tokens=5, vocab_size=9
        )
