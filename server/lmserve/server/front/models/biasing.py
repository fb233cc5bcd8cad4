"""A bias list applied to a request's texts: each text split into words as the model splits
them, then matched (`decoding.bias`).

    matches = bias_matches(served.codec, bias, TextInput(texts=["to new york"]))
    matches[0].boost, matches[0].phrases

Texts go through the model's word tokenizer (its lowercasing and pattern), token lists are taken
as the words they are, token ids as the text they spell; all are compared casefolded, so the
figure is the same whether the caller sent text or tokens, and whatever the model's tokens
(words, BPE pieces, characters).
"""

from __future__ import annotations

from lmserve.server.decoding.bias import BiasMatch, PhraseBias
from lmserve.server.decoding.detokenize import detokenize, detokenizer_factory
from lmserve.server.front.models.served_model import TextInput
from lmserve.server.text.codec import TextCodec


def bias_matches(codec: TextCodec, bias: PhraseBias, inputs: TextInput) -> list[BiasMatch]:
    """One match per text of `inputs`, in order."""
    if inputs.texts is not None:
        words = codec.split_batch(inputs.texts)
    elif inputs.token_ids is not None:  # the words the ids spell, as their text is split
        fresh = detokenizer_factory(codec, codec.vocab)
        words = codec.split_batch([detokenize(fresh(), ids) for ids in inputs.token_ids])
    else:
        words = [list(tokens) for tokens in inputs.token_lists or []]
    return [bias.match(text_words) for text_words in words]


def phrase_words(codec: TextCodec, phrase: str) -> tuple[str, ...]:
    """A phrase's words, as the model's word tokenizer splits a text."""
    return tuple(codec.split_batch([phrase])[0])
