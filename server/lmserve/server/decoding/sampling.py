"""Next-token selection over a batch of rows, each with its own parameters and random generator.

A backend step gives natural-log probabilities `log_probs [B, V]`; `sample_next` turns them into
one token per row in these steps (the order of the proto's `SamplingParams`):

1. Penalties on the tokens already in the sequence, per row:
   - repetition (CTRL, Keskar et al., 2019, eq. 2): a seen token's logit x becomes x / r when
     x > 0 and x * r otherwise, over prompt and generated tokens. Our "logits" are log-softmax
     values (all <= 0), so with r > 1 a seen token's log-prob is multiplied by r;
   - presence and frequency (the OpenAI rule): x -= presence * [count > 0] + frequency * count,
     counting generated tokens only (as vLLM does).
2. Bans (-inf): `<s>` always; `</s>` under `ignore_eos` or before `min_new_tokens` (the stop ids
   too); with `no_repeat_ngram_size` n, any token that would complete an n-gram already in the
   sequence (prompt included).
3. Greedy rows (temperature 0) take the argmax here: no randomness.
4. Temperature: x / T.
5. Truncation, each filter on the distribution renormalised over what earlier filters kept:
   top-k (the k most probable); top-p (nucleus, Holtzman et al., 2020: the smallest set of most
   probable tokens whose mass reaches p); min-p (tokens with p >= min_p * p_max); typical-p
   (Meister et al., 2022: with H the entropy, sort tokens by |-log p - H| and keep the smallest
   such prefix whose mass reaches typical_p).
6. Draw by inverse CDF with one uniform from the row's own generator.

Cost: a full argsort of a 12k vocabulary costs ~0.3 ms a row, more than a model step at batch 64,
so no sampling path argsorts the vocabulary. Every non-greedy row draws in two levels (block
sums, then one block) from weights p / p_max in the model's float32, with no full-vocabulary
cumulative sum and no float64 copy: in C for float32 rows (`_draw.c`), else `_draw_blocks`.
Untruncated rows use those weights as they are (`_draw_full`: at batch 32 over 10k tokens,
~1 ms where a float64 cumsum path took 22 ms).
The filters become thresholds on them (`_threshold_weights`): one value sort for top-p, one
partition per distinct k for top-k, a comparison for min-p, and for typical-p a bisection over
the sorted distances to the entropy (`_typical_set`). `bench/bench_sampling.py` measures each.
`reference_sampling` computes the same filters the straightforward way (candidates, sorted):
the tests check these thresholds and draws against it.

Reproducibility: each sequence owns a `numpy.random.Generator`, seeded from (request seed, sample
index) (`request_generators`), and draws exactly one uniform per sampled step, so a seed gives the
same tokens whatever else shares the batch. Never a shared generator.

The chosen token's log-prob and the top alternatives are reported under the model's unfiltered
distribution (`log_probs` as given), as the proto documents.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.base import FloatArray
from lmserve.server.decoding.draw import (
    IdArray,
    LogitArray,
    _draw_blocks,
    _draw_full,
    _threshold_weights,
)
from lmserve.server.decoding.params import SamplingParams


def request_generators(seed: int | None, n: int) -> list[np.random.Generator]:
    """One generator per sample of a request, derived from (seed, sample index).

    Without a seed a random one is drawn once for the request; sample i's stream depends only on
    (seed, i), never on other requests or on the order of batching.
    """
    base = secrets.randbits(64) if seed is None else int(seed)
    return [np.random.default_rng([base, i]) for i in range(n)]


class SequenceSampler:
    """One sequence's sampling state: its parameters, generator and the tokens so far.

    `sample_next` reads the history for penalties and bans and appends each chosen token.
    """

    def __init__(
        self,
        params: SamplingParams,
        rng: np.random.Generator,
        prompt_ids: Sequence[int] = (),
        *,
        min_new_tokens: int = 0,
        ignore_eos: bool = False,
        stop_token_ids: Sequence[int] = (),
    ) -> None:
        self.params = params
        self.rng = rng
        self.min_new_tokens = min_new_tokens
        self.ignore_eos = ignore_eos
        self.stop_token_ids = tuple(stop_token_ids)
        self.tokens: list[int] = []
        self.num_prompt = len(prompt_ids)
        self._seen: set[int] = set()
        self._counts: dict[int, int] = {}  # generated tokens only
        # no-repeat n-grams: the (n-1)-gram before a position -> the tokens that followed it
        self._followers: dict[tuple[int, ...], set[int]] = {}
        for t in prompt_ids:
            self._push(int(t))

    @property
    def num_generated(self) -> int:
        return len(self.tokens) - self.num_prompt

    def _push(self, token: int) -> None:
        self.tokens.append(token)
        self._seen.add(token)
        n = self.params.no_repeat_ngram_size
        if n and len(self.tokens) >= n:
            key = tuple(self.tokens[len(self.tokens) - n : -1])
            self._followers.setdefault(key, set()).add(token)

    def append(self, token: int) -> None:
        """Records a generated token (done by `sample_next`)."""
        token = int(token)
        self._push(token)
        self._counts[token] = self._counts.get(token, 0) + 1

    def banned(self, eos_id: int, bos_id: int) -> list[int]:
        """Ids that must not come next: `<s>` (unless it also ends a text, as GPT-2's one
        token does), suppressed ends, repeated n-grams."""
        out = [bos_id] if bos_id != eos_id else []
        early = self.num_generated < self.min_new_tokens
        if self.ignore_eos or early:
            out.append(eos_id)
        if early:
            out.extend(self.stop_token_ids)
        n = self.params.no_repeat_ngram_size
        if n and len(self.tokens) >= n - 1:
            key = tuple(self.tokens[len(self.tokens) - (n - 1) :]) if n > 1 else ()
            out.extend(self._followers.get(key, ()))
        return out

    def apply_penalties(self, logits: FloatArray) -> None:
        """Repetition (CTRL), then presence and frequency (OpenAI) penalties, in place [V]."""
        p = self.params
        if p.repetition_penalty != 1.0 and self._seen:
            ids = np.fromiter(self._seen, dtype=np.int64, count=len(self._seen))
            x = logits[ids]
            r = p.repetition_penalty
            logits[ids] = np.where(x > 0, x / r, x * r)
        if (p.presence_penalty or p.frequency_penalty) and self._counts:
            ids = np.fromiter(self._counts.keys(), dtype=np.int64, count=len(self._counts))
            counts = np.fromiter(self._counts.values(), dtype=np.float64, count=len(self._counts))
            logits[ids] -= p.presence_penalty + p.frequency_penalty * counts


@dataclass(frozen=True)
class SampleOutput:
    """One step's choices. Log-probs are natural logs under the unfiltered model distribution.

    `top_ids`/`top_log_probs` [B, k] are the k most probable tokens, best first, when asked.
    `failed` lists the rows no token was drawn for (NaN/+inf log-probs, or no possible token):
    their id is -1, their log-prob NaN, their top lists are meaningless, their samplers unchanged.
    """

    token_ids: IdArray
    log_probs: FloatArray
    top_ids: IdArray | None = None
    top_log_probs: FloatArray | None = None
    failed: tuple[int, ...] = ()


def process_logits(
    log_probs: npt.ArrayLike, rows: Sequence[SequenceSampler], *, eos_id: int, bos_id: int
) -> LogitArray:
    """Steps 1-2: penalties and bans -> a copy [B, V] (-inf for banned ids), float32 when the
    model gave float32 (half the memory traffic of every later pass), else float64.

    A row whose every token ended up banned falls back to the model's distribution minus `<s>`
    (a no-repeat constraint that cannot be met is dropped rather than failing the request).
    """
    return _penalise_and_ban(log_probs, rows, eos_id=eos_id, bos_id=bos_id)[0]


def _nothing() -> None:
    pass


def _penalise_and_ban(
    log_probs: npt.ArrayLike,
    rows: Sequence[SequenceSampler],
    *,
    eos_id: int,
    bos_id: int,
    in_place: bool = False,
) -> tuple[LogitArray, LogitArray, list[int], Callable[[], None]]:
    """`process_logits`, each row's maximum (which its dead-row check computes anyway and the
    draw needs: one pass over [B, V] fewer a step), the rows no token can be drawn from, and
    what restores `log_probs` afterwards.

    `in_place`: when no row is penalised and `log_probs` is a writable C-contiguous float32
    array (a step's own output), the bans are written into it instead of into a copy (the copy
    was a [B, V] pass a step for a few banned ids); the caller calls the returned function once
    it has drawn, which puts the banned values back, before reading the log-probs again.

    A row is bad when the model gave it a NaN or +inf anywhere, or -inf everywhere (no token
    has any probability): drawing from it would pick an arbitrary token. The check costs no
    pass of its own: NaN and +inf survive penalties and show in the row's maximum, and those
    that the bans overwrote are read back from the banned positions alone.
    """
    source = np.asarray(log_probs)
    in_place = (
        in_place
        and source.dtype == np.float32
        and source.flags.writeable
        and source.flags.c_contiguous
        and not any(row.params.penalised for row in rows)
    )
    logits: LogitArray = (
        source if in_place else np.array(source, dtype=np.result_type(source.dtype, np.float32))
    )
    banned_rows: list[int] = []
    banned_ids: list[int] = []
    for i, row in enumerate(rows):
        if row.params.penalised:
            row.apply_penalties(logits[i])
        ids = row.banned(eos_id, bos_id)
        banned_rows.extend([i] * len(ids))
        banned_ids.extend(ids)
    hidden = source[banned_rows, banned_ids]  # what the bans are about to overwrite
    logits[banned_rows, banned_ids] = -np.inf  # one scatter for the whole batch
    row_max: LogitArray = logits.max(axis=1) if len(rows) else np.zeros(0, logits.dtype)

    def restore() -> None:
        source[banned_rows, banned_ids] = hidden

    if in_place and not np.isfinite(row_max).all():  # rare: the copy's way handles it
        restore()
        return _penalise_and_ban(source, rows, eos_id=eos_id, bos_id=bos_id)
    bad: set[int] = set()
    odd = np.isnan(hidden) | (hidden == np.inf)
    if odd.any():
        bad.update(np.asarray(banned_rows)[odd].tolist())
    for i in np.flatnonzero(~np.isfinite(row_max)).tolist():
        if np.isnan(row_max[i]) or row_max[i] == np.inf:
            bad.add(i)
            continue
        logits[i] = source[i]
        if bos_id != eos_id:
            logits[i, bos_id] = -np.inf
        row_max[i] = logits[i].max()
        if not np.isfinite(row_max[i]):
            bad.add(i)
    return logits, row_max, sorted(bad), restore if in_place else _nothing


def _sample_rows(
    logits: LogitArray,
    row_max: LogitArray,
    params: Sequence[SamplingParams],
    uniforms: FloatArray,
) -> IdArray:
    """Steps 4-6 for non-greedy rows: logits (and each row's maximum) -> chosen ids [S]."""
    temps = np.array([p.temperature for p in params])
    truncates = [p.truncates for p in params]
    if not any(truncates):  # the common case: no filter, the whole distribution
        return _draw_full(logits, row_max, 1.0 / temps, uniforms)
    out = np.empty(len(params), dtype=np.int64)
    trunc = np.array(truncates, dtype=bool)
    plain = np.flatnonzero(~trunc)
    if len(plain):
        out[plain] = _draw_full(logits[plain], row_max[plain], 1.0 / temps[plain], uniforms[plain])
    rows = np.flatnonzero(trunc)
    tempered = logits[rows] / temps[rows, None].astype(logits.dtype)
    weights = _threshold_weights(tempered, [params[i] for i in rows.tolist()])
    out[rows] = _draw_blocks(weights, uniforms[rows])
    return out


def top_alternatives(log_probs: LogitArray, k: int) -> tuple[IdArray, FloatArray]:
    """The k most probable ids per row, best first, and their log-probs (float64): [B, k]."""
    v = log_probs.shape[1]
    k = min(k, v)
    if k < v:
        part = np.argpartition(-log_probs, k - 1, axis=1)[:, :k]
    else:
        part = np.broadcast_to(np.arange(v), log_probs.shape)
    values = np.take_along_axis(log_probs, part, axis=1)
    order = np.argsort(-values, axis=1, kind="stable")
    best = np.take_along_axis(values, order, axis=1).astype(np.float64, copy=False)
    return np.take_along_axis(part, order, axis=1), best


def sample_next(
    log_probs: npt.ArrayLike,
    rows: Sequence[SequenceSampler],
    *,
    eos_id: int,
    bos_id: int,
    top_logprobs: int = 0,
) -> SampleOutput:
    """Chooses one token per row of `log_probs [B, V]` (natural logs) and appends it to the row.

    `top_logprobs`: how many alternatives to report per row (the largest any row asked for;
    callers slice). Rows are independent: each uses only its own parameters and generator.
    """
    source = np.asarray(log_probs)
    if source.ndim != 2 or source.shape[0] != len(rows):
        raise ValueError(f"log_probs {source.shape} for {len(rows)} rows")
    logits, row_max, bad, restore = _penalise_and_ban(
        source, rows, eos_id=eos_id, bos_id=bos_id, in_place=True
    )
    try:
        # Bad rows: draw the good rows alone; the bad ones get -1 and keep their samplers.
        if bad:
            good = np.setdiff1d(np.arange(len(rows)), bad)
            chosen = np.full(len(rows), -1, dtype=np.int64)
            if len(good):
                picked = [rows[i] for i in good.tolist()]
                chosen[good] = _choose(logits[good], row_max[good], picked)
        else:
            chosen = _choose(logits, row_max, rows)
    finally:
        restore()  # the caller's log-probs as they were (read below for the chosen ones)
    for row, token in zip(rows, chosen.tolist(), strict=True):
        if token >= 0:
            row.append(token)
    chosen_lp = source[np.arange(len(rows)), np.maximum(chosen, 0)].astype(np.float64)
    if bad:
        chosen_lp[bad] = np.nan
    failed = tuple(bad)
    if top_logprobs > 0:
        top_ids, top_lp = top_alternatives(source, top_logprobs)
        return SampleOutput(chosen, chosen_lp, top_ids, top_lp, failed)
    return SampleOutput(chosen, chosen_lp, failed=failed)


def _choose(logits: LogitArray, row_max: LogitArray, rows: Sequence[SequenceSampler]) -> IdArray:
    """Steps 3-6 over processed rows: greedy rows take the argmax, the others draw."""
    greedy = [r.params.greedy for r in rows]
    # One uniform in (0, 1] per sampled row, from that row's own generator.
    if not any(greedy):  # the common batches take no row copies
        uniforms = np.array([1.0 - r.rng.random() for r in rows])
        return _sample_rows(logits, row_max, [r.params for r in rows], uniforms)
    if all(greedy):
        return np.asarray(logits.argmax(axis=1), dtype=np.int64)
    chosen = np.empty(len(rows), dtype=np.int64)
    g = np.flatnonzero(greedy)
    chosen[g] = logits[g].argmax(axis=1)
    s = np.flatnonzero(np.logical_not(greedy))
    uniforms = np.array([1.0 - rows[i].rng.random() for i in s.tolist()])
    params = [rows[i].params for i in s.tolist()]
    chosen[s] = _sample_rows(logits[s], row_max[s], params, uniforms)
    return chosen
