"""Sampling: filters against hand-made distributions, penalties by hand, seeded draws, params."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lmserve.server.decoding.draw import DRAW_BLOCK, _draw_full, _threshold_weights
from lmserve.server.decoding.params import GenerateParams, SamplingParams, StoppingParams
from lmserve.server.decoding.reference_sampling import draw_cumulative, filtered_probs
from lmserve.server.decoding.sampling import (
    SequenceSampler,
    process_logits,
    request_generators,
    sample_next,
)
from lmserve.server.errors import InvalidArgument

EOS, BOS = 2, 1
# ids 0..4 carry 0.5 .. 0.05; id 5 (<s> in these tests is 1, so keep it simple: no specials)
P = np.array([0.5, 0.2, 0.15, 0.1, 0.05])
LOGP = np.log(P)


def _dense(params: SamplingParams, logits: np.ndarray = LOGP, candidates: int = 256) -> np.ndarray:
    return filtered_probs(logits[None, :], [params], candidates=candidates)[0]


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (SamplingParams(), P),
        (SamplingParams(top_k=2), [5 / 7, 2 / 7, 0, 0, 0]),
        (SamplingParams(top_p=0.55), [5 / 7, 2 / 7, 0, 0, 0]),  # 0.5 < 0.55 <= 0.7
        (SamplingParams(top_p=0.45), [1, 0, 0, 0, 0]),
        (SamplingParams(top_p=0.75), [0.5 / 0.85, 0.2 / 0.85, 0.15 / 0.85, 0, 0]),
        (SamplingParams(min_p=0.35), [5 / 7, 2 / 7, 0, 0, 0]),  # p >= 0.175
        (SamplingParams(min_p=0.15), [0.5 / 0.95, 0.2 / 0.95, 0.15 / 0.95, 0.1 / 0.95, 0]),
        # top-k 3 renormalises to .588 .235 .176; top-p 0.8 then stops before the third
        # (.824 >= .8), which it would keep on the unrenormalised masses (.7 < .8).
        (SamplingParams(top_k=3, top_p=0.8), [5 / 7, 2 / 7, 0, 0, 0]),
        # H = 1.3331 nats; |-log p - H| = .640 .276 .564 .970 1.663: order b, c, a, ...;
        # mass before c is .2 < .3, before a .35 >= .3.
        (SamplingParams(typical_p=0.3), [0, 0.2 / 0.35, 0.15 / 0.35, 0, 0]),
        (
            SamplingParams(typical_p=0.9),
            [0.5 / 0.95, 0.2 / 0.95, 0.15 / 0.95, 0.1 / 0.95, 0],
        ),  # .85 < .9
        (SamplingParams(temperature=2.0), np.sqrt(P) / np.sqrt(P).sum()),
        (SamplingParams(temperature=0.5, top_k=2), [25 / 29, 4 / 29, 0, 0, 0]),
    ],
)
def test_filters_against_hand_made_distributions(
    params: SamplingParams, expected: list[float]
) -> None:
    np.testing.assert_allclose(_dense(params), expected, atol=1e-12)


@pytest.mark.parametrize(
    "params",
    [SamplingParams(top_p=0.9), SamplingParams(typical_p=0.5), SamplingParams(min_p=0.01),
     SamplingParams(top_p=0.95, typical_p=0.9, temperature=1.3)],
)  # fmt: skip
def test_candidate_cut_equals_a_full_sort(params: SamplingParams) -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(3, 500)) * np.array([[0.3], [2.0], [6.0]])
    # The reference path's cut to 4 candidates (then wider) keeps what a full sort keeps.
    cut = filtered_probs(logits, [params] * 3, candidates=4)
    full = filtered_probs(logits, [params] * 3, candidates=500)
    np.testing.assert_allclose(cut, full, atol=1e-12)


@pytest.mark.parametrize("vocab", [5, DRAW_BLOCK, 3 * DRAW_BLOCK + 17])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_two_level_draw_equals_the_full_cumulative_draw(vocab: int, temperature: float) -> None:
    # The whole-vocabulary draw (block sums, then one block) picks exactly the token a cumsum
    # over the whole row picks, for the same uniforms; banned (-inf) tokens and a row's last
    # tokens included.
    rng = np.random.default_rng(vocab)
    logits = rng.normal(size=(400, vocab)) * 3
    logits[:, rng.integers(0, vocab, 3)] = -np.inf
    logits[::7, -1] = 8.0  # mass at the very end (the padded last block)
    uniforms = 1.0 - rng.random(400)
    uniforms[:3] = 1.0  # the top of the CDF
    inv = np.full(400, 1.0 / temperature)
    weights = np.exp((logits - logits.max(axis=1, keepdims=True)) * inv[:, None])
    expected = draw_cumulative(weights, uniforms)
    drawn = _draw_full(logits, logits.max(axis=1), inv, uniforms)
    np.testing.assert_array_equal(drawn, expected)
    assert np.isfinite(logits[np.arange(400), expected]).all()


def test_plain_sampling_frequencies_over_a_multi_block_vocabulary() -> None:
    # Chi-square goodness of fit of untruncated sampling from float32 log-probs (the model's
    # precision) over 3 blocks; tokens grouped into 10 bins of equal expected mass (df = 9,
    # 0.001 critical value 27.88). Fixed seed: deterministic.
    vocab = 2 * DRAW_BLOCK + 50
    rng = np.random.default_rng(4)
    x = rng.normal(size=vocab) * 1.5
    lp = (x - np.log(np.exp(x).sum())).astype(np.float32)
    params = SamplingParams(temperature=0.8, seed=11)
    expected = _dense(params, np.where(np.arange(vocab) == BOS, -np.inf, lp.astype(np.float64)))
    rows = [SequenceSampler(params, g) for g in request_generators(params.seed, 500)]
    batch = np.repeat(lp[None, :], len(rows), axis=0)
    draws = np.concatenate(
        [sample_next(batch, rows, eos_id=EOS, bos_id=BOS).token_ids for _ in range(40)]
    )
    assert BOS not in draws
    edges = np.searchsorted(np.cumsum(expected), np.linspace(0, 1, 11)[1:-1])
    observed = np.bincount(np.searchsorted(edges, draws, side="right"), minlength=10)
    mass = np.add.reduceat(expected, np.concatenate([[0], edges]))
    n = len(draws)
    chi2 = float((((observed - n * mass) ** 2) / (n * mass)).sum())
    assert chi2 < 27.88, (observed, n * mass)


@pytest.mark.parametrize(
    "params",
    [SamplingParams(top_k=1), SamplingParams(top_k=7), SamplingParams(top_p=0.7),
     SamplingParams(top_p=1e-9), SamplingParams(top_k=12, top_p=0.8, temperature=0.7),
     SamplingParams(min_p=0.05), SamplingParams(top_p=0.95, min_p=0.02, temperature=1.4),
     SamplingParams(top_k=40, min_p=0.3), SamplingParams(typical_p=0.3),
     SamplingParams(typical_p=0.9), SamplingParams(typical_p=0.5, top_k=30),
     SamplingParams(typical_p=0.8, top_p=0.9, temperature=0.8)],
)  # fmt: skip
def test_threshold_filters_equal_the_sorted_candidate_filters(params: SamplingParams) -> None:
    # The sampling path (thresholds on p / p_max, ties by id) keeps exactly the tokens the
    # reference path (a full stable sort of the candidates) keeps, with the same weights;
    # tied values and banned tokens included.
    rng = np.random.default_rng(params.top_k + int(100 * params.top_p * params.typical_p))
    logits = rng.normal(size=(6, 300)) * np.array([[0.2], [1.0], [2.0], [3.0], [5.0], [8.0]])
    logits[:, 10:30] = logits[:, 3:4]  # a block of ties
    logits[:, 40] = -np.inf
    expected = filtered_probs(logits, [params] * 6, candidates=300)
    weights = _threshold_weights(logits / params.temperature, [params] * 6)
    assert weights.shape[1] % DRAW_BLOCK == 0 and not weights[:, 300:].any()
    got = weights[:, :300] / weights.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(got, expected, atol=1e-12)


def test_typical_set_cuts_inside_a_block_of_ties_by_id() -> None:
    # q = .4 and four ties at .15: H = 1.505, the ties are closer to it (.392 vs .589), and with
    # typical_p .35 the prefix takes three of them (mass before: 0, .15, .30), in id order.
    logits = np.log(np.array([[0.4, 0.15, 0.15, 0.15, 0.15]]))
    params = SamplingParams(typical_p=0.35)
    weights = _threshold_weights(logits, [params])[:, :5]
    np.testing.assert_allclose(weights / weights.sum(), [[0, 1 / 3, 1 / 3, 1 / 3, 0]])
    np.testing.assert_allclose(filtered_probs(logits, [params]), [[0, 1 / 3, 1 / 3, 1 / 3, 0]])


def test_penalties_against_hand_computation() -> None:
    logits = np.log(np.array([0.4, 0.05, 0.05, 0.3, 0.2]))
    params = SamplingParams(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25)
    row = SequenceSampler(params, np.random.default_rng(0), prompt_ids=[0])
    row.append(3)
    row.append(3)
    row.append(4)
    out = process_logits(logits[None, :], [row], eos_id=EOS, bos_id=BOS)[0]
    expected = logits.copy()
    expected[[0, 3, 4]] *= 2.0  # CTRL on log-probs (<= 0): multiplied; prompt included
    expected[3] -= 0.5 + 0.25 * 2  # OpenAI: generated tokens only
    expected[4] -= 0.5 + 0.25 * 1
    expected[[BOS]] = -np.inf
    np.testing.assert_allclose(out, expected)


def test_ctrl_rule_divides_positive_logits() -> None:
    row = SequenceSampler(SamplingParams(repetition_penalty=4.0), np.random.default_rng(0), [0, 3])
    out = process_logits(np.array([[2.0, 0.0, 0.0, -1.0, 1.0]]), [row], eos_id=EOS, bos_id=BOS)
    np.testing.assert_allclose(out[0, [0, 3, 4]], [0.5, -4.0, 1.0])


@pytest.mark.parametrize(
    ("n", "prompt", "banned"), [(2, [3, 4, 0, 3], {4}), (3, [3, 4, 0, 3, 4], {0}), (1, [3], {3})]
)
def test_no_repeat_ngram_bans(n: int, prompt: list[int], banned: set[int]) -> None:
    row = SequenceSampler(SamplingParams(no_repeat_ngram_size=n), np.random.default_rng(0), prompt)
    out = process_logits(LOGP[None, :], [row], eos_id=EOS, bos_id=BOS)[0]
    assert set(np.flatnonzero(np.isneginf(out)).tolist()) == banned | {BOS}


def test_min_new_tokens_and_ignore_eos_suppress_end_of_sentence() -> None:
    logits = np.log(np.array([[0.01, 0.01, 0.96, 0.01, 0.01]]))  # </s> almost certain
    rows = [SequenceSampler(SamplingParams(temperature=0), np.random.default_rng(0),
                            min_new_tokens=3, stop_token_ids=[4])]  # fmt: skip
    got = [int(sample_next(logits, rows, eos_id=EOS, bos_id=BOS).token_ids[0]) for _ in range(4)]
    assert got[:3] != [EOS] * 3 and EOS not in got[:3] and 4 not in got[:3] and got[3] == EOS
    row = SequenceSampler(SamplingParams(), np.random.default_rng(0), ignore_eos=True)
    draws = [
        int(sample_next(logits, [row], eos_id=EOS, bos_id=BOS).token_ids[0]) for _ in range(50)
    ]
    assert EOS not in draws and BOS not in draws


def test_greedy_is_argmax_and_reports_unfiltered_log_probs() -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4, 30))
    lp = x - np.log(np.exp(x).sum(axis=1, keepdims=True))
    lp[:, BOS] = -50.0
    rows = [SequenceSampler(SamplingParams(temperature=0), np.random.default_rng(0)) for _ in lp]
    out = sample_next(lp, rows, eos_id=EOS, bos_id=BOS, top_logprobs=3)
    np.testing.assert_array_equal(out.token_ids, lp.argmax(axis=1))
    np.testing.assert_allclose(out.log_probs, lp.max(axis=1))
    assert out.top_ids is not None and out.top_log_probs is not None
    np.testing.assert_array_equal(out.top_ids, np.argsort(-lp, axis=1)[:, :3])
    np.testing.assert_allclose(out.top_log_probs, -np.sort(-lp, axis=1)[:, :3])
    # A sampled, truncated row reports the model's log-prob, not the filtered one.
    row = SequenceSampler(SamplingParams(top_k=1, temperature=0.3), np.random.default_rng(1))
    one = sample_next(lp[:1], [row], eos_id=EOS, bos_id=BOS)
    assert one.log_probs[0] == pytest.approx(lp[0].max())


def test_sampled_frequencies_match_the_filtered_distribution() -> None:
    # Chi-square goodness of fit: 6 tokens, temperature 0.7 and top-k 4 leave 4 categories
    # (df = 3); the 0.001 critical value of chi2(3) is 16.27. Fixed seed: deterministic.
    logits = np.log(np.array([0.3, 0.02, 0.03, 0.25, 0.2, 0.2]))  # ids 1, 2 are <s>, </s>
    params = SamplingParams(temperature=0.7, top_k=4, seed=123)
    expected = _dense(params, np.where(np.isin(np.arange(6), [BOS]), -np.inf, logits))
    rows = [SequenceSampler(params, g) for g in request_generators(params.seed, 400)]
    counts = np.zeros(6)
    batch = np.repeat(logits[None, :], len(rows), axis=0)
    for _ in range(50):  # 20 000 draws
        np.add.at(counts, sample_next(batch, rows, eos_id=EOS, bos_id=BOS).token_ids, 1)
    kept = expected > 0
    assert counts[~kept].sum() == 0
    n = counts.sum()
    chi2 = float((((counts[kept] - n * expected[kept]) ** 2) / (n * expected[kept])).sum())
    assert kept.sum() == 4 and chi2 < 16.27, (counts, expected)


def test_same_seed_same_tokens_alone_and_inside_a_busy_batch() -> None:
    rng = np.random.default_rng(9)
    steps = [rng.normal(size=(4, 40)) * 2 for _ in range(12)]
    target = SamplingParams(top_p=0.9, temperature=0.8, repetition_penalty=1.3, seed=77)

    def run(batch: bool) -> list[int]:
        row = SequenceSampler(target, request_generators(target.seed, 2)[1], [5, 6])
        others = [
            SequenceSampler(SamplingParams(temperature=0), np.random.default_rng(0)),
            SequenceSampler(SamplingParams(top_k=5), request_generators(1, 1)[0]),
            SequenceSampler(SamplingParams(min_p=0.1), request_generators(None, 1)[0]),
        ]
        out = []
        for x in steps:
            if batch:  # the target sits third, among unrelated rows
                rows = [others[0], others[1], row, others[2]]
                out.append(int(sample_next(x, rows, eos_id=EOS, bos_id=BOS).token_ids[2]))
            else:
                out.append(int(sample_next(x[2:3], [row], eos_id=EOS, bos_id=BOS).token_ids[0]))
        return out

    alone = run(False)
    assert alone == run(False) == run(True)
    assert len(set(alone)) > 3  # really sampling
    # Samples of one request get different streams; a re-run gets the same ones.
    a = [g.random() for g in request_generators(77, 3)]
    assert len(set(a)) == 3 and a == [g.random() for g in request_generators(77, 3)]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"temperature": -0.1}, "sampling.temperature"),
        ({"temperature": math.inf}, "sampling.temperature"),
        ({"top_k": -1}, "sampling.top_k"),
        ({"top_p": 0.0}, "sampling.top_p"),
        ({"top_p": 1.5}, "sampling.top_p"),
        ({"min_p": 1.1}, "sampling.min_p"),
        ({"typical_p": 0.0}, "sampling.typical_p"),
        ({"repetition_penalty": 0.0}, "sampling.repetition_penalty"),
        ({"repetition_penalty": 5e-324}, "sampling.repetition_penalty"),  # found by fuzzing
        ({"presence_penalty": 2.5}, "sampling.presence_penalty"),
        ({"frequency_penalty": -3.0}, "sampling.frequency_penalty"),
        ({"no_repeat_ngram_size": -1}, "sampling.no_repeat_ngram_size"),
        ({"seed": -1}, "sampling.seed"),
    ],
)
def test_invalid_sampling_params_name_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        SamplingParams(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


def test_generate_params_limits() -> None:
    ok = GenerateParams(StoppingParams(max_new_tokens=10), n=2, top_logprobs=3)
    assert ok.validate(max_new_tokens=10, max_n=4, max_top_logprobs=5) is ok
    for kwargs, field in [
        ({"max_new_tokens": 9, "max_n": 4, "max_top_logprobs": 5}, "stopping.max_new_tokens"),
        ({"max_new_tokens": 10, "max_n": 1, "max_top_logprobs": 5}, "n"),
        ({"max_new_tokens": 10, "max_n": 4, "max_top_logprobs": 2}, "top_logprobs"),
    ]:
        with pytest.raises(InvalidArgument) as info:
            ok.validate(**kwargs)
        assert info.value.field == field
    with pytest.raises(InvalidArgument, match="^n:"):
        GenerateParams(StoppingParams(max_new_tokens=1), n=0)


# -- the C draw ------------------------------------------------------------------------------


@pytest.mark.parametrize(("vocab", "temperature"), [(7, 1.0), (300, 1.0), (1000, 0.6), (5000, 1.7)])
def test_c_draw_of_logits_equals_the_cumulative_reference(vocab: int, temperature: float) -> None:
    from lmserve.server.decoding import _draw as c_draw

    rng = np.random.default_rng(vocab)
    rows = 2000
    logits = (rng.normal(size=(rows, vocab)) * 3).astype(np.float32)
    logits[:, rng.integers(0, vocab, 2)] = -np.inf  # banned
    uniforms = 1.0 - rng.random(rows)
    uniforms[:5] = 1.0
    out = np.empty(rows, dtype=np.int64)
    inv_temps = np.full(rows, 1.0 / temperature)
    c_draw.draw_logits(logits, vocab, logits.max(axis=1), inv_temps, uniforms, out)
    x = logits.astype(np.float64)
    expected = draw_cumulative(np.exp((x - x.max(axis=1, keepdims=True)) / temperature), uniforms)
    # The same rule; float32 weights may move a draw that lands within ~1e-7 of a boundary.
    assert (out == expected).mean() >= 0.999
    assert np.isfinite(logits[np.arange(rows), out]).all()


def test_c_draw_of_weights_skips_zeros_and_matches_the_numpy_two_level_draw() -> None:
    from lmserve.server.decoding import _draw as c_draw

    rng = np.random.default_rng(3)
    weights = rng.random((1000, 3 * DRAW_BLOCK)).astype(np.float32)
    weights[weights < 0.7] = 0.0  # most tokens dropped, as after top-p
    uniforms = 1.0 - rng.random(1000)
    out = np.empty(1000, dtype=np.int64)
    c_draw.draw_weights(weights, weights.shape[1], uniforms, out)
    assert (weights[np.arange(1000), out] > 0).all()
    expected = draw_cumulative(weights.astype(np.float64), uniforms)
    assert (out == expected).mean() >= 0.999


def test_c_draw_refuses_bad_input_clearly() -> None:
    from lmserve.server.decoding import _draw as c_draw

    out = np.empty(2, dtype=np.int64)
    with pytest.raises(ValueError, match="row 1 has no token of positive weight"):
        dead = np.array([[0.0, -1.0], [-np.inf, -np.inf]], dtype=np.float32)
        c_draw.draw_logits(dead, 2, dead.max(axis=1), np.ones(2), np.ones(2), out)
    with pytest.raises(TypeError, match="rows must hold float32"):
        maxes = np.zeros(2, np.float32)
        c_draw.draw_logits(np.zeros((2, 2)), 2, maxes, np.ones(2), np.ones(2), out)
    with pytest.raises(ValueError, match="one value per row"):
        c_draw.draw_weights(np.ones((2, 2), np.float32), 2, np.ones(3), out)
    with pytest.raises(ValueError, match="width"):
        c_draw.draw_weights(np.ones((2, 2), np.float32), 0, np.ones(2), out)


def test_c_draw_of_a_batch_big_enough_to_release_the_gil() -> None:
    # Above 4M values the C draw runs without the GIL; the answers are the same kind.
    from lmserve.server.decoding import _draw as c_draw

    rows, vocab = 340, 12_352
    rng = np.random.default_rng(11)
    logits = rng.normal(size=(rows, vocab)).astype(np.float32)
    logits[:, :100] = -np.inf
    uniforms = 1.0 - rng.random(rows)
    out = np.empty(rows, dtype=np.int64)
    c_draw.draw_logits(logits, vocab, logits.max(axis=1), np.ones(rows), uniforms, out)
    x = logits.astype(np.float64)
    expected = draw_cumulative(np.exp(x - x.max(axis=1, keepdims=True)), uniforms)
    assert (out == expected).mean() >= 0.99 and (out >= 100).all()


@pytest.mark.parametrize("writable", [True, False], ids=["in-place", "copied"])
def test_a_draw_leaves_the_log_probs_as_they_were_and_draws_the_same_tokens(
    writable: bool,
) -> None:
    """The bans go into a writable float32 step output itself (no [B, V] copy) and are taken
    back after the draw: the caller's array is unchanged, and the tokens and their log-probs
    are those drawn from a read-only array (always copied) with the same generators."""
    rng = np.random.default_rng(7)
    raw = rng.standard_normal((16, 300)).astype(np.float32)
    log_probs = raw - np.log(np.exp(raw).sum(axis=1, keepdims=True))
    kept = log_probs.copy()
    if not writable:
        log_probs.flags.writeable = False
    params = [SamplingParams(seed=3), SamplingParams(top_k=5, seed=4), SamplingParams(seed=5)]

    def draw(source: np.ndarray) -> tuple[list[int], list[float]]:
        rows = [
            SequenceSampler(params[i % 3], g, prompt_ids=[0])
            for i, g in enumerate(request_generators(9, 16))
        ]
        out = sample_next(source, rows, eos_id=EOS, bos_id=BOS)
        return out.token_ids.tolist(), out.log_probs.tolist()

    reference = kept.copy()
    reference.flags.writeable = False
    assert draw(log_probs) == draw(reference)
    assert np.array_equal(log_probs, kept)
    assert BOS not in draw(log_probs)[0]  # banned all the same
