"""The scheduler's few touch points with the decoding layer, gathered in one module.

    decoders = new_decoders(request, vocab)                # one per sample
    drawn = sample(active_sequences, log_probs, vocab)     # one vectorised draw over [B, V]
    piece, finish = accept(decoder, token_id, count)       # detokenize + stop conditions

Sampling is `decoding.sampling` (vectorised, one generator per sample). `decoding.stopping` and
`decoding.detokenize` are being written alongside; until they land, `accept` below joins word
tokens with spaces and matches stop strings and ids and max_new_tokens itself, so that this is
the only module to switch over.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.stepping import Stepper
from lmserve.server.backends.stepping import make_stepper as _make_stepper
from lmserve.server.decoding.params import GenerateParams
from lmserve.server.decoding.sampling import SequenceSampler, request_generators, sample_next
from lmserve.server.engine.sequence import Finish, GenerationRequest


def make_stepper(backend: Any) -> Stepper:
    return _make_stepper(backend)


def samples_of(params: GenerateParams) -> int:
    return params.n


def select_rows(stepper: Stepper, state: Any, rows: Sequence[int]) -> Any:
    return stepper.select(state, np.asarray(rows, dtype=np.int64))


class _SampleDecoder:
    """One sample's decoding state: the decoding layer's sampler, then text and stop matching."""

    __slots__ = ("params", "sampler", "text", "emitted", "eos_id", "words")

    def __init__(self, params: GenerateParams, sampler: SequenceSampler, vocab: Any) -> None:
        self.params = params
        self.sampler = sampler
        self.text = ""
        self.emitted = 0  # characters of `text` already sent
        self.eos_id: int = vocab.eos_id
        self.words: Sequence[str] = vocab.words


def new_decoders(request: GenerationRequest, vocab: Any) -> list[_SampleDecoder]:
    """One decoder per sample; sample k draws from its own generator seeded by (seed, k), so
    its tokens depend on the seed and index only, never on the batch around it."""
    params: GenerateParams = request.params
    st = params.stopping
    return [
        _SampleDecoder(
            params,
            SequenceSampler(
                params.sampling,
                rng,
                request.prompt_ids,
                min_new_tokens=st.min_new_tokens,
                ignore_eos=st.ignore_eos,
                stop_token_ids=st.stop_token_ids,
            ),
            vocab,
        )
        for rng in request_generators(params.sampling.seed, params.n)
    ]


@dataclass(frozen=True)
class Drawn:
    """One token per row: ids, their natural log-probs (unfiltered), and the best alternatives."""

    ids: list[int]
    log_probs: list[float]
    top: list[tuple[tuple[int, float], ...]]


def sample(active: Sequence[Any], log_probs: npt.NDArray[Any], vocab: Any) -> Drawn:
    """Draws the next token of every active sequence from its row of `log_probs` [B, V]."""
    decoders: list[_SampleDecoder] = [seq.decoder for seq in active]
    k = max(d.params.top_logprobs for d in decoders)
    out = sample_next(
        log_probs,
        [d.sampler for d in decoders],
        eos_id=vocab.eos_id,
        bos_id=vocab.bos_id,
        top_logprobs=k,
    )
    if out.top_ids is None or out.top_log_probs is None:
        tops: list[tuple[tuple[int, float], ...]] = [()] * len(decoders)
    else:
        ids, lps = out.top_ids.tolist(), out.top_log_probs.tolist()
        tops = [
            tuple(zip(i[: d.params.top_logprobs], p[: d.params.top_logprobs], strict=True))
            for d, i, p in zip(decoders, ids, lps, strict=True)
        ]
    return Drawn(out.token_ids.tolist(), out.log_probs.tolist(), tops)


def accept(d: _SampleDecoder, token_id: int, count: int) -> tuple[str | None, Finish | None]:
    """Adds a drawn token: its text piece (None when it ends the sample unseen) and why the
    sample ends, if it does. `count` is the tokens drawn so far, this one included."""
    st = d.params.stopping
    if token_id == d.eos_id and not st.ignore_eos:
        return None, Finish.END_OF_SENTENCE
    word = d.words[token_id]
    d.text = f"{d.text} {word}" if d.text else word
    if token_id in st.stop_token_ids:
        return _piece(d, len(d.text)), Finish.STOP
    for s in st.stop:
        at = d.text.find(s, max(0, d.emitted - len(s)))
        if at >= 0:
            d.text = d.text[:at]
            return _piece(d, len(d.text)), Finish.STOP
    if count >= st.max_new_tokens:
        return _piece(d, len(d.text)), Finish.LENGTH
    # Hold back a tail that could still become a stop string.
    hold = max((len(s) - 1 for s in st.stop), default=0)
    return _piece(d, max(d.emitted, len(d.text) - hold)), None


def _piece(d: _SampleDecoder, upto: int) -> str:
    piece = d.text[d.emitted : upto]
    d.emitted = max(d.emitted, upto)
    return piece


def final_text(d: _SampleDecoder) -> str:
    return d.text
