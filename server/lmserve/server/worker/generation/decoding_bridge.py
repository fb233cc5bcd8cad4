"""The scheduler's few touch points with the decoding layer, gathered in one module.

    decoders = new_decoders(request, vocab)                # one per sample
    drawn = sample(decoders, log_probs, vocab)             # one vectorised draw over [B, V]
    piece, finish = accept(decoder, token_id, count)       # detokenize + stop conditions

Sampling is `decoding.sampling` (vectorised, one generator per sample); text and stop
conditions are `decoding.stopping.StopChecker` over the model's detokenizer
(`decoding.detokenize`), so word, character and BPE models stream their own text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lmserve.server.backends.base import FloatArray, Vocabulary
from lmserve.server.decoding.detokenize import Detokenizer
from lmserve.server.decoding.params import GenerateParams
from lmserve.server.decoding.sampling import SequenceSampler, request_generators, sample_next
from lmserve.server.decoding.stopping import FinishReason, StopChecker
from lmserve.server.worker.generation.sequence import GenerationRequest


class SampleDecoder:
    """One sample's decoding state: the decoding layer's sampler and its stop checker."""

    __slots__ = ("params", "sampler", "checker", "eos_id")

    def __init__(
        self, params: GenerateParams, sampler: SequenceSampler, checker: StopChecker, eos_id: int
    ) -> None:
        self.params = params
        self.sampler = sampler
        self.checker = checker
        self.eos_id = eos_id


def new_decoders(
    request: GenerationRequest, vocab: Vocabulary, detokenizer: Callable[[], Detokenizer]
) -> list[SampleDecoder]:
    """One decoder per sample; sample k draws from its own generator seeded by (seed, k), so
    its tokens depend on the seed and index only, never on the batch around it."""
    params: GenerateParams = request.params
    st = params.stopping
    return [
        SampleDecoder(
            params,
            SequenceSampler(
                params.sampling,
                rng,
                request.prompt_ids,
                min_new_tokens=st.min_new_tokens,
                ignore_eos=st.ignore_eos,
                stop_token_ids=st.stop_token_ids,
            ),
            StopChecker(st, detokenizer(), eos_id=vocab.eos_id),
            vocab.eos_id,
        )
        for rng in request_generators(params.sampling.seed, params.n)
    ]


@dataclass(frozen=True)
class Drawn:
    """One token per row: ids, their natural log-probs (unfiltered), and the best alternatives;
    `failed`: rows the model gave NaN/inf (or no possible token), where nothing was drawn."""

    ids: list[int]
    log_probs: list[float]
    top: list[tuple[tuple[int, float], ...]]
    failed: tuple[int, ...] = ()


def sample(decoders: Sequence[SampleDecoder], log_probs: FloatArray, vocab: Vocabulary) -> Drawn:
    """Draws the next token of every active sequence (its decoder) from its row of
    `log_probs` [B, V]."""
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
    return Drawn(out.token_ids.tolist(), out.log_probs.tolist(), tops, out.failed)


def accept(d: SampleDecoder, token_id: int, count: int) -> tuple[str | None, FinishReason | None]:
    """Adds a drawn token: its text piece and why the sample ends, if it does. The piece is None
    for a token that ends the sample unseen (`</s>` or a stop token id) unless the sample had
    text held back (a possible stop string's start): that text goes out with this token, else
    the stream would lose it. `count` is the tokens drawn so far, this one included."""
    st = d.params.stopping
    ends_unseen = (token_id == d.eos_id and not st.ignore_eos) or (
        token_id in st.stop_token_ids and count > st.min_new_tokens
    )
    step = d.checker.add(token_id)
    return (None if ends_unseen and not step.text else step.text), step.finish_reason


def final_text(d: SampleDecoder) -> str:
    """A sample's text for its FinishEvent: what its tokens streamed, so the two always agree
    (a sample cancelled mid-way, by its deadline or a shutdown, leaves held-back text out)."""
    return d.checker.sent_text
