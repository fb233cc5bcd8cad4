"""Beam search: a beam holding every hypothesis equals exhaustive search; width 1 is greedy."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from test_stepping import EagerBackend

from lmserve.server.backends.ngram.model import NgramModel
from lmserve.server.backends.stepping import Stepper
from lmserve.server.decoding.beam import Hypothesis, beam_search, length_penalty, ngram_bans
from lmserve.server.decoding.params import BeamParams, SamplingParams
from lmserve.server.decoding.sampling import SequenceSampler, sample_next
from lmserve.server.decoding.stopping import FinishReason
from lmserve.server.errors import InvalidArgument
from lmserve.server.families.catalog import make_stepper

BIGRAM = """\\data\\
ngram 1=8
ngram 2=9

\\1-grams:
-1.3\t<unk>\t0
-99\t<s>\t-0.3
-0.7\t</s>
-0.6\ta\t-0.2
-0.8\tb\t-0.25
-0.9\tc\t-0.1
-1.1\td\t-0.4
-1.0\te\t-0.15

\\2-grams:
-0.2\t<s> a
-0.5\t<s> c
-0.3\ta b
-0.6\ta </s>
-0.25\tb c
-0.4\tc </s>
-0.7\tc d
-0.35\td e
-0.3\te </s>

\\end\\
"""


@pytest.fixture(scope="module")
def bigram(tmp_path_factory: pytest.TempPathFactory) -> NgramModel:
    path = tmp_path_factory.mktemp("arpa") / "bigram.arpa"
    path.write_text(BIGRAM)
    return NgramModel.from_arpa(path)


def exhaustive(stepper: Stepper, prompt: list[int], params: BeamParams) -> list[Hypothesis]:
    """Every continuation up to max_length, scored and ranked as the search ranks them."""
    vocab = stepper.vocab
    ends = {vocab.eos_id, *params.stop_token_ids}
    tokens = [i for i in range(len(vocab)) if i != vocab.bos_id]
    dist = {}  # prefix -> next-token log-probs, one batched prefill per prefix length
    for length in range(params.max_length):
        prefixes = [p for p in itertools.product(tokens, repeat=length) if not ends & set(p)]
        lp, _ = stepper.prefill([prompt + list(p) for p in prefixes])
        dist.update(zip(prefixes, lp, strict=True))
    found = []
    for length in range(1, params.max_length + 1):
        for seq in itertools.product(tokens, repeat=length):
            if any(t in ends for t in seq[:-1]):
                continue
            if seq[-1] in ends and length - 1 < params.min_length:
                continue
            if seq[-1] not in ends and length < params.max_length:
                continue
            if params.no_repeat_ngram_size and any(
                seq[i] in ngram_bans(prompt + list(seq[:i]), params.no_repeat_ngram_size)
                for i in range(length)
            ):
                continue
            # Summed in float64 as the search sums (the n-gram stepper's rows are float32).
            total = sum(float(dist[seq[:i]][t]) for i, t in enumerate(seq))
            lpen = length_penalty(params.length_penalty, params.length_penalty_alpha, length)
            found.append((total / lpen, seq, total))
    found.sort(key=lambda f: -f[0])
    return [Hypothesis(s, t, sc, FinishReason.LENGTH) for sc, s, t in found[: params.num_return]]


def _same(got: list[Hypothesis], want: list[Hypothesis]) -> None:
    assert [h.token_ids for h in got] == [h.token_ids for h in want]
    np.testing.assert_allclose([h.log_prob for h in got], [h.log_prob for h in want], atol=1e-6)
    np.testing.assert_allclose([h.score for h in got], [h.score for h in want], atol=1e-6)


@pytest.mark.parametrize(
    "kw",
    [
        {"length_penalty": "none"},
        {"length_penalty": "gnmt", "length_penalty_alpha": 2.0},
        {"length_penalty": "average", "length_penalty_alpha": 1.0, "min_length": 1},
        {"length_penalty": "none", "no_repeat_ngram_size": 1, "stop_token_ids": (6,)},
    ],
)
def test_wide_beam_equals_exhaustive_search_ngram(bigram: NgramModel, kw: dict) -> None:
    stepper = make_stepper(bigram)
    params = BeamParams(beam_width=300, max_length=3, num_return=5, **kw)
    got = beam_search(stepper, [], params)
    _same(got, exhaustive(stepper, [], params))
    eos = bigram.vocab.eos_id
    for h in got:
        last = h.token_ids[-1]
        if last == eos:
            assert h.finish_reason == FinishReason.END_OF_SENTENCE
        elif last in params.stop_token_ids:
            assert h.finish_reason == FinishReason.STOP
        else:
            assert h.finish_reason == FinishReason.LENGTH and len(h.token_ids) == 3


def test_wide_beam_equals_exhaustive_search_recurrent() -> None:
    stepper = make_stepper(EagerBackend("gru"))
    params = BeamParams(beam_width=400, max_length=2, num_return=4, length_penalty="gnmt")
    _same(beam_search(stepper, [3, 4], params), exhaustive(stepper, [3, 4], params))


@pytest.mark.parametrize("which", ["ngram", "lstm"])
def test_beam_width_one_is_greedy(bigram: NgramModel, which: str) -> None:
    stepper = make_stepper(bigram if which == "ngram" else EagerBackend("lstm"))
    vocab = stepper.vocab
    [hyp] = beam_search(stepper, [3], BeamParams(beam_width=1, max_length=6))
    row = SequenceSampler(SamplingParams(temperature=0), np.random.default_rng(0), [3])
    lp, state = stepper.prefill([[3]])
    greedy: list[int] = []
    for _ in range(6):
        token = int(sample_next(lp, [row], eos_id=vocab.eos_id, bos_id=vocab.bos_id).token_ids[0])
        greedy.append(token)
        if token == vocab.eos_id:
            break
        lp, state = stepper.step(np.array([token]), state)
    assert list(hyp.token_ids) == greedy


def test_early_stopping_and_min_length(bigram: NgramModel) -> None:
    stepper = make_stepper(bigram)
    eos = bigram.vocab.eos_id
    hyps = beam_search(stepper, [], BeamParams(beam_width=4, max_length=5, min_length=2,
                                               num_return=2))  # fmt: skip
    assert all(len(h.token_ids) >= 3 or h.token_ids[-1] != eos for h in hyps)
    early = beam_search(stepper, [], BeamParams(beam_width=4, max_length=5, num_return=1,
                                                early_stopping=True))  # fmt: skip
    assert len(early) == 1 and early[0].token_ids[-1] == eos


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"beam_width": 0, "max_length": 3}, "beam_width"),
        ({"beam_width": 2, "max_length": 3, "num_return": 3}, "num_return"),
        ({"beam_width": 2, "max_length": 0}, "max_length"),
        ({"beam_width": 2, "max_length": 3, "min_length": 4}, "min_length"),
        ({"beam_width": 2, "max_length": 3, "length_penalty": "x"}, "length_penalty"),
        ({"beam_width": 2, "max_length": 3, "length_penalty_alpha": -1.0}, "length_penalty_alpha"),
    ],
)
def test_invalid_beam_params_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        BeamParams(**kwargs)
    assert info.value.field == field
    with pytest.raises(InvalidArgument) as info:
        BeamParams(beam_width=8, max_length=3).validate(max_beam_width=4, max_length=10)
    assert info.value.field == "beam_width"
