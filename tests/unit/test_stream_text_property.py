"""Property: a Generate stream's token texts always add up to its final text.

Drives `engine.decoding_bridge.accept` and `final_text` exactly as the scheduler does (a piece
of None is a token that is not streamed; an unfinished sample's `final_text` is what a deadline
or a shutdown ends it with) over random stop strings, stop ids, token sequences that end in
`</s>` or not, and the word and character detokenizers.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from lmserve.server.backends.base import Vocabulary
from lmserve.server.decoding.detokenize import CharDetokenizer, Detokenizer, WordDetokenizer
from lmserve.server.decoding.params import GenerateParams, StoppingParams
from lmserve.server.decoding.stopping import FinishReason
from lmserve.server.worker.generation import decoding_bridge as bridge
from lmserve.server.worker.generation.sequence import GenerationRequest

CHARS = Vocabulary.from_words(["<unk>", "<s>", "</s>", "a", "b", "c", " "])
WORDS = Vocabulary.from_words(["<unk>", "<s>", "</s>", "a", "b", "ab", "c"])
KINDS = {"char": (CHARS, CharDetokenizer), "word": (WORDS, WordDetokenizer)}
MAX_NEW = 40


def _stream(
    kind: str, tokens: list[str], stop: tuple[str, ...], stop_ids: tuple[str, ...], min_new: int
) -> tuple[list[str], str, FinishReason | None]:
    """The streamed pieces, the final text and the finish reason, as the scheduler sees them."""
    vocab, make = KINDS[kind]

    def detokenizer() -> Detokenizer:
        return make(vocab)

    stopping = StoppingParams(
        max_new_tokens=MAX_NEW,
        min_new_tokens=min_new,
        stop=stop,
        stop_token_ids=tuple(vocab.index[t] for t in stop_ids),
    )
    request = GenerationRequest(prompt_ids=[], params=GenerateParams(stopping=stopping))
    [decoder] = bridge.new_decoders(request, vocab, detokenizer)
    pieces: list[str] = []
    finish = None
    for count, token in enumerate(tokens, start=1):
        piece, finish = bridge.accept(decoder, vocab.index[token], count)
        if piece is not None:
            pieces.append(piece)
        if finish is not None:
            break
    return pieces, bridge.final_text(decoder), finish


@st.composite
def _cases(draw: st.DrawFn) -> tuple[str, list[str], tuple[str, ...], tuple[str, ...], int]:
    kind = draw(st.sampled_from(sorted(KINDS)))
    words = ["a", "b", "c", " "] if kind == "char" else ["a", "b", "ab", "c"]
    tokens = draw(st.lists(st.sampled_from(words), max_size=MAX_NEW - 1))
    if draw(st.booleans()):
        tokens.append("</s>")
    stop = tuple(draw(st.lists(st.text(alphabet="abc ", min_size=1, max_size=4), max_size=3)))
    stop_ids = tuple(draw(st.lists(st.sampled_from(words), max_size=1)))
    min_new = draw(st.integers(0, 3))
    return kind, tokens, stop, stop_ids, min_new


@settings(max_examples=400, deadline=None)
@given(_cases())
def test_streamed_pieces_add_up_to_the_final_text(
    case: tuple[str, list[str], tuple[str, ...], tuple[str, ...], int],
) -> None:
    kind, tokens, stop, stop_ids, min_new = case
    pieces, final, finish = _stream(kind, tokens, stop, stop_ids, min_new)
    # Unfinished, `final_text` is what a deadline or shutdown would end the sample with.
    assert "".join(pieces) == final
    if finish is None:
        return
    if min_new == 0:  # stop strings count from the first token
        assert not any(s in final for s in stop)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(["a", "b", "c", " "]), max_size=10),
    st.text(alphabet="abc ", min_size=2, max_size=4),
)
def test_a_stop_prefix_held_back_at_the_end_of_sentence_is_streamed(
    tokens: list[str], stop: str
) -> None:
    # The text ends in a proper prefix of the stop string, then </s>: the prefix is withheld
    # while it may still become the stop string, and must go out when the sample ends.
    tokens = [*tokens, *stop[:-1], "</s>"]
    pieces, final, finish = _stream("char", tokens, (stop,), (), 0)
    assert "".join(pieces) == final
    if finish == FinishReason.END_OF_SENTENCE:
        assert final.endswith(stop[:-1]) and stop not in final
