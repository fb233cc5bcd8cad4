"""Beam search over any `Stepper`: the n best continuations of a prompt.

Each step extends every live hypothesis ("beam") by every token in one batched backend step:

1. cand(b, w) = logp(b) + log P(w | b)  (natural logs), with `<s>` banned, `</s>` and the stop
   ids banned while fewer than `min_length` tokens were generated, and with
   `no_repeat_ngram_size` n any w that would repeat an n-gram of (prompt + beam) banned.
2. The 2W best candidates (W = beam width), best first, are taken in order: one ending in
   `</s>` (END_OF_SENTENCE) or a stop id (STOP) moves to the finished list if it ranks among
   the first W (HF's rule: W better live continuations exist otherwise); the others become the
   next beams until W are live. The RNN state is reordered with them (`Stepper.select`).
3. At `max_length` the live beams finish with LENGTH.
4. Finished hypotheses are ranked by score = logp / lp(length), length counting the new tokens
   with the ending one, where lp is 1 ("none"), ((5 + length) / 6) ** alpha (GNMT, Wu et al.,
   2016, eq. 14) or length ** alpha ("average"). The best `num_return` are kept.
5. The search ends when `num_return` hypotheses finished and either `early_stopping`, or no live
   beam can still beat the worst kept one. Log-probs only fall as a beam grows and, for
   alpha >= 0, lp only grows with length, so a live beam's best reachable score is
   logp / lp(max_length) (HF's bound for `early_stopping="never"`): the bound is exact, and a
   beam wide enough to hold every hypothesis gives the exhaustive search's n-best.

`BeamSearch` is the step-by-step core (a scheduler can batch its beams with other work);
`beam_search` drives it synchronously over a stepper.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.stepping import Stepper
from lmserve.server.decoding.params import BeamParams
from lmserve.server.decoding.stopping import FinishReason
from lmserve.server.errors import Cancelled

IdArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Hypothesis:
    """One finished continuation: new token ids (the ending `</s>`/stop id included), their
    total log-probability in nats, the length-penalised score it was ranked by, and why it
    ended."""

    token_ids: tuple[int, ...]
    log_prob: float
    score: float
    finish_reason: FinishReason


def length_penalty(kind: str, alpha: float, length: int) -> float:
    """The divisor of a hypothesis' log-prob: 1, GNMT's ((5 + len) / 6)^alpha, or len^alpha."""
    if kind == "gnmt":
        return float(((5.0 + length) / 6.0) ** alpha)
    if kind == "average":
        return float(max(length, 1) ** alpha)
    return 1.0


def ngram_bans(sequence: Sequence[int], n: int) -> list[int]:
    """Tokens that would complete an n-gram already in `sequence` (all seen tokens for n=1)."""
    if n <= 0 or len(sequence) < n - 1:
        return []
    key = list(sequence[len(sequence) - (n - 1) :]) if n > 1 else []
    return [
        sequence[i + n - 1]
        for i in range(len(sequence) - n + 1)
        if list(sequence[i : i + n - 1]) == key
    ]


class BeamSearch:
    """The search state of one request; feed it each step's log-probs of the live beams."""

    def __init__(
        self, params: BeamParams, prompt_ids: Sequence[int], *, eos_id: int, bos_id: int
    ) -> None:
        self.params = params
        self.prompt = [int(t) for t in prompt_ids]
        self.eos_id = eos_id
        self.bos_id = bos_id
        self.ends = {eos_id, *params.stop_token_ids}
        self.live: list[tuple[tuple[int, ...], float]] = [((), 0.0)]
        self.finished: list[Hypothesis] = []  # best first, at most num_return
        self.done = False

    def _score(self, log_prob: float, length: int) -> float:
        p = self.params
        return log_prob / length_penalty(p.length_penalty, p.length_penalty_alpha, length)

    def _add_finished(self, tokens: tuple[int, ...], log_prob: float, why: FinishReason) -> None:
        hyp = Hypothesis(tokens, log_prob, self._score(log_prob, len(tokens)), why)
        self.finished.append(hyp)
        self.finished.sort(key=lambda h: -h.score)
        del self.finished[self.params.num_return :]

    def _can_improve(self) -> bool:
        """Whether some live beam could still beat the worst kept finished hypothesis."""
        if len(self.finished) < self.params.num_return:
            return True
        if self.params.early_stopping:
            return False
        best_live = max(lp for _, lp in self.live)
        bound = self._score(best_live, self.params.max_length)
        return bound > self.finished[-1].score

    def advance(self, log_probs: npt.ArrayLike) -> tuple[IdArray, IdArray]:
        """Takes log P(next | beam) [live, V] (nats) and returns, for the new live beams, the
        row of their parent in this step's input and the token to feed next. When `done`,
        both are empty and `results()` holds the answer."""
        p = self.params
        scores = np.array(log_probs, dtype=np.float64)
        if scores.shape[0] != len(self.live):
            raise ValueError(f"{scores.shape[0]} rows for {len(self.live)} live beams")
        length = len(self.live[0][0]) + 1  # of the candidates
        if self.bos_id not in self.ends:  # GPT-2's one token starts and ends a text
            scores[:, self.bos_id] = -np.inf
        if length - 1 < p.min_length:
            scores[:, list(self.ends)] = -np.inf
        for b, (tokens, logp) in enumerate(self.live):
            if p.no_repeat_ngram_size:
                scores[b, ngram_bans(self.prompt + list(tokens), p.no_repeat_ngram_size)] = -np.inf
            scores[b] += logp
        flat = scores.reshape(-1)
        width = p.beam_width
        k = min(2 * width, flat.size)
        top = np.argpartition(-flat, k - 1)[:k] if k < flat.size else np.arange(flat.size)
        top = top[np.argsort(-flat[top], kind="stable")]
        vocab = scores.shape[1]
        new_live: list[tuple[tuple[int, ...], float]] = []
        parents: list[int] = []
        for rank, index in enumerate(top.tolist()):
            total = float(flat[index])
            if not np.isfinite(total):
                break
            beam, token = divmod(index, vocab)
            tokens = (*self.live[beam][0], token)
            if token in self.ends:
                if rank < width:
                    why = (
                        FinishReason.END_OF_SENTENCE if token == self.eos_id else FinishReason.STOP
                    )
                    self._add_finished(tokens, total, why)
                continue
            new_live.append((tokens, total))
            parents.append(beam)
            if len(new_live) == width:
                break
        if length >= p.max_length:
            for tokens, total in new_live:
                self._add_finished(tokens, total, FinishReason.LENGTH)
            new_live, parents = [], []
        self.live = new_live
        if not self.live or not self._can_improve():
            self.done = True
            self.live = []
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return (
            np.asarray(parents, dtype=np.int64),
            np.asarray([t[-1] for t, _ in self.live], dtype=np.int64),
        )

    def results(self) -> list[Hypothesis]:
        """The finished hypotheses, best score first (at most num_return)."""
        return list(self.finished)


def beam_search(
    stepper: Stepper,
    prompt_ids: Sequence[int],
    params: BeamParams,
    *,
    bos: bool = True,
    should_stop: Callable[[], bool] | None = None,
) -> list[Hypothesis]:
    """Runs a whole search, one batched step over the live beams per length.

    `should_stop` is asked before the prompt is read and before every step: when it answers
    True the search ends with `Cancelled` (it may raise an error of its own instead, such as
    DeadlineExceeded), so a search nobody waits for costs one step more at most.
    """
    vocab = stepper.vocab
    _check(should_stop, 0)
    log_probs, state = stepper.prefill([list(prompt_ids)], bos=bos)
    search = BeamSearch(params, prompt_ids, eos_id=vocab.eos_id, bos_id=vocab.bos_id)
    steps = 0
    while True:
        parents, tokens = search.advance(log_probs)
        if search.done:
            break
        _check(should_stop, steps)
        # Each new beam continues from its parent's state: reorder (and duplicate) the rows.
        state = stepper.select(state, parents)
        log_probs, state = stepper.step(tokens, state)
        steps += 1
    return search.results()


def _check(should_stop: Callable[[], bool] | None, steps: int) -> None:
    if should_stop is not None and should_stop():
        raise Cancelled(f"beam search stopped after {steps} steps: nobody waits for it")
