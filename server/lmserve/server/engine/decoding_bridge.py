"""The scheduler's few touch points with the decoding layer, gathered in one module.

    decoder = new_decoder(request, sample_index, vocab)    # one per sample
    drawn = sample(active_sequences, log_probs)            # one vectorised draw over [B, V]
    piece, finish = accept(decoder, token_id, count)       # detokenize + stop conditions

`decoding.sampling` / `decoding.stopping` / `decoding.detokenize` are being written alongside;
until they land, the interim `_SampleDecoder` below implements the subset the scheduler needs
(penalties, temperature, top-k, top-p, min-p, per-sample seeded generators, word detokenizing,
stop strings and ids, min/max tokens) so that this is the only module to switch over.
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
from lmserve.server.engine.sequence import Finish, GenerationRequest


def make_stepper(backend: Any) -> Stepper:
    return _make_stepper(backend)


def samples_of(params: GenerateParams) -> int:
    return params.n


def select_rows(stepper: Stepper, state: Any, rows: Sequence[int]) -> Any:
    return stepper.select(state, np.asarray(rows, dtype=np.int64))


def _generator(seed: int | None, sample_index: int) -> np.random.Generator:
    """Sample k of a seeded request draws from its own stream: SeedSequence(seed, k), so the
    draws depend on the seed and sample index only, never on the batch around them."""
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng(np.random.SeedSequence([seed, sample_index]))


class _SampleDecoder:
    """One sample's decoding state: generator, history, text and stop matching."""

    __slots__ = ("params", "rng", "history", "counts", "text", "emitted", "eos_id", "words")

    def __init__(self, request: GenerationRequest, sample_index: int, vocab: Any) -> None:
        self.params: GenerateParams = request.params
        self.rng = _generator(self.params.sampling.seed, sample_index)
        self.history: list[int] = list(request.prompt_ids)
        self.counts: dict[int, int] = {}
        for t in self.history:
            self.counts[t] = self.counts.get(t, 0) + 1
        self.text = ""
        self.emitted = 0  # characters of `text` already sent
        self.eos_id: int = vocab.eos_id
        self.words: Sequence[str] = vocab.words


def new_decoder(request: GenerationRequest, sample_index: int, vocab: Any) -> _SampleDecoder:
    return _SampleDecoder(request, sample_index, vocab)


@dataclass(frozen=True)
class Drawn:
    """One token per row: ids, their natural log-probs (unfiltered), and the best alternatives."""

    ids: list[int]
    log_probs: list[float]
    top: list[tuple[tuple[int, float], ...]]


def _filtered_row(d: _SampleDecoder, row: npt.NDArray[np.float64], generated: int) -> Any:
    """Penalties, suppression, temperature and the truncation filters for one row (logits)."""
    sp = d.params.sampling
    st = d.params.stopping
    logits = row.copy()
    if generated < st.min_new_tokens:
        logits[d.eos_id] = -np.inf
        for t in st.stop_token_ids:
            logits[t] = -np.inf
    elif st.ignore_eos:
        logits[d.eos_id] = -np.inf
    if sp.penalised and d.counts:
        ids = np.fromiter(d.counts, dtype=np.int64)
        counts = np.fromiter(d.counts.values(), dtype=np.float64)
        seen = logits[ids]
        if sp.repetition_penalty != 1.0:  # CTRL: divide positive, multiply negative
            seen = np.where(seen > 0, seen / sp.repetition_penalty, seen * sp.repetition_penalty)
        seen = seen - sp.presence_penalty - sp.frequency_penalty * counts
        logits[ids] = seen
    if sp.greedy:
        return logits
    logits = logits / sp.temperature
    if sp.top_k and sp.top_k < len(logits):
        kth = np.partition(logits, -sp.top_k)[-sp.top_k]
        logits[logits < kth] = -np.inf
    if sp.top_p < 1.0 or sp.min_p > 0.0:
        probs = np.exp(logits - logits.max())
        probs /= probs.sum()
        if sp.min_p > 0.0:
            logits[probs < sp.min_p * probs.max()] = -np.inf
        if sp.top_p < 1.0:
            order = np.argsort(-probs)
            cum = np.cumsum(probs[order])
            cut = int(np.searchsorted(cum, sp.top_p)) + 1
            logits[order[cut:]] = -np.inf
    return logits


def sample(active: Sequence[Any], log_probs: npt.NDArray[Any]) -> Drawn:
    """Draws the next token of every active sequence from its row of `log_probs` [B, V]."""
    ids: list[int] = []
    chosen: list[float] = []
    tops: list[tuple[tuple[int, float], ...]] = []
    for i, seq in enumerate(active):
        d: _SampleDecoder = seq.decoder
        row = log_probs[i]
        logits = _filtered_row(d, row, seq.generated)
        if d.params.sampling.greedy:
            token = int(np.argmax(logits))
        else:
            p = np.exp(logits - logits.max())
            p /= p.sum()
            token = int(d.rng.choice(len(p), p=p))
        ids.append(token)
        chosen.append(float(row[token]))
        k = d.params.top_logprobs
        if k:
            best = np.argpartition(-row, k - 1)[:k]
            best = best[np.argsort(-row[best], kind="stable")]
            tops.append(tuple((int(t), float(row[t])) for t in best))
        else:
            tops.append(())
    return Drawn(ids, chosen, tops)


def accept(d: _SampleDecoder, token_id: int, count: int) -> tuple[str | None, Finish | None]:
    """Adds a drawn token: its text piece (None when it ends the sample unseen) and why the
    sample ends, if it does. `count` is the tokens drawn so far, this one included."""
    st = d.params.stopping
    if token_id == d.eos_id and not st.ignore_eos:
        return None, Finish.END_OF_SENTENCE
    d.history.append(token_id)
    d.counts[token_id] = d.counts.get(token_id, 0) + 1
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
