"""Exact word lookups of the n-gram model (`NgramModel.score_next`, `state_distributions`):
no distribution computed, yet every value equal to what the model's other paths give.

References, each independent of the lookup: Score's per-token log-probs (KenLM's FullScore,
its own sums), the full next-token distribution of the same history (the stepper's float32
row, bit for bit), and `context_slots`' walk of the history for the next state. The models
cover back-off through missing n-grams (a pruned toy model, KJV 3-gram text with random
words), unknown words, `</s>`, a quantized table, and both kernels.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from lattices import EPSILON, random_lattice

from lmserve.server.backends.ngram.model import Kernel, NgramModel, NgramState
from lmserve.server.backends.positions import Positions
from lmserve.server.backends.stepping import ContextStepper, WordLookup, word_lookup
from lmserve.server.decoding.lattice.expand import (
    LatticeExpansion,
    LatticeParams,
    RescoredPaths,
    TokenLattice,
)
from lmserve.server.families.catalog import history_key, make_stepper
from lmserve.server.settings import FusionSettings
from lmserve.server.shared.fusion import FuseAnswer, FuseStep
from lmserve.server.text.word import encode_token_lists
from lmserve.server.worker.fusion.sessions import Fuser

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ngram"
SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"


def _load(name: str, kernel: Kernel) -> NgramModel:
    if name == "toy":
        return NgramModel.from_arpa(FIXTURES / "toy.arpa", kernel=kernel)
    if name == "toy_pruned":
        return NgramModel.from_arpa(FIXTURES / "toy_pruned.arpa", kernel=kernel)
    if name == "test.arpa":
        return NgramModel.from_arpa(SHARED / "kenlm-tests" / "test.arpa", kernel=kernel)
    exact = NgramModel.from_arpa(SHARED / "kjv" / "kenlm" / "kjv.3gram.arpa")
    if name == "kjv3":
        return exact if kernel == "c" else NgramModel(exact.tables, kernel="numpy")
    return NgramModel(exact.tables.quantize(), kernel=kernel)


@pytest.fixture(
    scope="module",
    params=[
        ("toy", "c"),
        ("toy", "numpy"),
        ("toy_pruned", "c"),
        ("toy_pruned", "numpy"),
        ("test.arpa", "c"),
        ("kjv3", "c"),
        ("kjv3", "numpy"),
        ("kjv3_quantized", "c"),
    ],
    ids=lambda p: "-".join(p),
)
def model(request: pytest.FixtureRequest) -> NgramModel:
    name, kernel = request.param
    return _load(name, kernel)


def _texts(model: NgramModel, count: int = 60) -> list[list[int]]:
    """KJV lines (where the model is KJV's), random words (back-off through missing n-grams)
    and unknown words, as ids."""
    rng = np.random.default_rng(7)
    v = len(model.vocab)
    texts: list[list[int]] = []
    if len(model.vocab) > 1000:
        lines = (SHARED / "kjv" / "test.txt").read_text().splitlines()[:count]
        batch = encode_token_lists([line.split() for line in lines], model.vocab)
        bounds = batch.offsets.tolist()
        texts += [batch.ids[a:b].tolist() for a, b in zip(bounds, bounds[1:], strict=False)]
    specials = {model.vocab.bos_id, model.vocab.eos_id}
    words = [i for i in range(v) if i not in specials]
    for _ in range(count):
        texts.append([words[int(i)] for i in rng.integers(0, len(words), rng.integers(0, 9))])
    texts.append([model.vocab.unk_id, words[0], model.vocab.unk_id])
    texts.append([])
    return texts


def _walk(model: NgramModel, text: list[int], *, bos: bool) -> tuple[list[float], NgramState]:
    """The text then `</s>` looked up token by token from the start state."""
    state = model.lookup_start(bos=bos)
    lps = []
    for token in [*text, model.vocab.eos_id]:
        (lp,), (nxt,) = model.score_next([state], [token])
        lps.append(lp)
        if token != model.vocab.eos_id:
            state = nxt
    return lps, state


@pytest.mark.parametrize("bos", [True, False])
def test_lookups_along_a_text_equal_scores_per_token(model: NgramModel, bos: bool) -> None:
    texts = _texts(model)
    batch = encode_token_lists([[model.vocab.words[i] for i in t] for t in texts], model.vocab)
    scores = model.score(batch, bos=bos, eos=True, per_token=True)
    assert scores.token_log_probs is not None and scores.token_offsets is not None
    bounds = scores.token_offsets.tolist()
    for k, text in enumerate(texts):
        lps, _ = _walk(model, text, bos=bos)
        expected = scores.token_log_probs[bounds[k] : bounds[k + 1]]
        # float32 values against Score's float64 sums (another order of the same terms).
        assert lps == pytest.approx(expected.tolist(), rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("bos", [True, False])
def test_lookups_equal_the_distribution_bit_for_bit_at_random_states(
    model: NgramModel, bos: bool
) -> None:
    v = len(model.vocab)
    rng = np.random.default_rng(11)
    every = list(range(v))
    picks = every if v <= 64 else rng.choice(v, size=64, replace=False).tolist()
    picks = sorted({*picks, model.vocab.eos_id, model.vocab.unk_id})
    for text in _texts(model, count=25):
        cut = text[: int(rng.integers(0, len(text) + 1))]
        state = model.lookup_start(bos=bos)
        if cut:
            _, (state,) = model.score_next([model.lookup_start(bos=bos)], [cut[0]])
            for token in cut[1:]:
                _, (state,) = model.score_next([state], [token])
        row = model.next_token_log_probs_batch([cut], bos=bos)[0]
        assert np.array_equal(model.state_distributions([state])[0], row)
        lps, nexts = model.score_next([state] * len(picks), picks)
        assert np.array_equal(np.asarray(lps, dtype=np.float32), row[picks])
        assert all(float(np.float32(lp)) == lp for lp in lps)  # float32 values, widened
        # The state after each word: KenLM's minimised state of the extended history.
        for word, nxt in zip(picks, nexts, strict=True):
            assert nxt == tuple(model.context_slots([*cut, word], bos=bos))


def test_equal_histories_meet_in_one_state(model: NgramModel) -> None:
    """Histories that differ only before the model's longest matching suffix reach equal
    (hashable) states, whose lookups agree: what lattice rescoring merges by."""
    texts = [t[:8] for t in _texts(model, count=12) if len(t) >= 2]
    seen: dict[NgramState, list[float]] = {}
    probe = [model.vocab.eos_id, model.vocab.unk_id, *range(min(len(model.vocab), 40))]
    merged = 0
    for text in texts:
        for start in range(len(text)):
            _, state = _walk(model, text[start:], bos=False)
            lps, _ = model.score_next([state] * len(probe), probe)
            if state in seen:
                merged += 1
                assert seen[state] == lps
            seen[state] = lps
    assert merged > 0
    assert all(len(s) <= model.order - 1 for s in seen)


def test_refuses_what_is_not_a_state_or_a_word() -> None:
    model = _load("toy", "c")
    start = model.lookup_start(bos=True)
    with pytest.raises(ValueError, match="not a vocabulary id"):
        model.score_next([start], [len(model.vocab)])
    with pytest.raises(ValueError, match="differ in length|states for"):
        model.score_next([start, start], [3])
    with pytest.raises(ValueError, match="not a state of this model"):
        model.score_next([(len(model.vocab),)], [3])
    with pytest.raises(ValueError, match="more than order - 1"):
        model.score_next([(3,) * model.order], [3])
    with pytest.raises(TypeError, match="tuple of ints"):
        model.score_next([[3]], [3])  # type: ignore[list-item]


def test_the_ngram_stepper_offers_the_lookup_and_others_do_not() -> None:
    model = _load("toy", "c")
    stepper = make_stepper(model)
    lookup = word_lookup(stepper)
    assert lookup is model and isinstance(lookup, WordLookup)
    assert word_lookup(ContextStepper(model, max_context=model.order - 1)) is None


# -- the rescorers: the lookup way answers as the distribution way ------------------------------


def _token_lattice(
    model: NgramModel, seed: int, nodes: int, multi: bool
) -> tuple[TokenLattice, int]:
    """A seeded random lattice over the model's words; with `multi`, some arcs carry two or
    three tokens (a subword model's word), and some none (epsilons)."""
    rng = random.Random(seed)
    specials = {model.vocab.bos_id, model.vocab.eos_id}
    ids = [i for i in range(len(model.vocab)) if i not in specials]
    words = [model.vocab.words[i] for i in ids[:300]]
    graph = random_lattice(rng, words, nodes=nodes)
    offsets, tokens = [0], []
    for _, _, word, _, _ in graph.arcs:
        if word != EPSILON:
            tokens.append(model.vocab.index[word])
            if multi and rng.random() < 0.4:
                tokens += [rng.choice(ids) for _ in range(rng.randint(1, 2))]
        offsets.append(len(tokens))
    lattice = TokenLattice(
        nodes=graph.nodes,
        start=0,
        src=[a for a, *_ in graph.arcs],
        dst=[b for _, b, *_ in graph.arcs],
        token_offsets=offsets,
        tokens=tokens,
        word_counts=[0 if w == EPSILON else 1 for _, _, w, _, _ in graph.arcs],
        acoustic=[a for *_, a, _ in graph.arcs],
        old_lm=[o for *_, o in graph.arcs],
        final_nodes=[graph.nodes - 1],
        final_acoustic=[-0.5],
        final_old_lm=[-0.25],
    )
    return lattice, len(list(graph.paths()))


def _expand(stepper: ContextStepper, lattice: TokenLattice, params: LatticeParams) -> RescoredPaths:
    expansion = LatticeExpansion(stepper, lattice, params, history_key(stepper.backend))
    for _ in expansion.steps():
        pass
    return expansion.result


@pytest.mark.parametrize("name", ["toy_pruned", "kjv3"])
@pytest.mark.parametrize(
    "params",
    [
        LatticeParams(paths=6, expanded=True, old_lm_weight=-1.0, word_insertion_penalty=0.5),
        LatticeParams(paths=3, bos=False, eos=False, lm_weight=0.7),
        LatticeParams(paths=4, beam=3.0, acoustic_scale=0.1),
    ],
    ids=["weights", "no-bos-eos", "beam"],
)
def test_lattice_lookups_give_the_distribution_ways_answer(
    name: str, params: LatticeParams
) -> None:
    model = _load(name, "c")
    by_lookup = make_stepper(model)
    by_steps = ContextStepper(model, max_context=model.order - 1)
    assert isinstance(by_lookup, ContextStepper) and word_lookup(by_steps) is None
    for seed in range(12):
        lattice, _ = _token_lattice(model, seed, nodes=5 + seed % 6, multi=seed % 2 == 1)
        got = _expand(by_lookup, lattice, params)
        expected = _expand(by_steps, lattice, params)
        # The same expansion, paths and scores, bit for bit (only the work counted differs).
        assert replace(got, computed=0) == replace(expected, computed=0)
        assert got.paths and (params.beam is not None or got.exact)


@pytest.mark.parametrize("name", ["toy_pruned", "kjv3"])
@pytest.mark.parametrize("bos", [True, False])
def test_fuse_lookups_give_the_distribution_ways_answers(name: str, bos: bool) -> None:
    """A beam over seeded random tokens, fused with lookups (the n-gram stepper) and with
    distributions kept per hypothesis (the same model stepped without lookups): every answer
    equal, token and candidate log-probs, `</s>`, top k (computed only where asked)."""
    model = _load(name, "c")
    rng = np.random.default_rng(5)
    v = len(model.vocab)
    ids = [i for i in range(v) if i != model.vocab.bos_id]

    async def run(stepper: ContextStepper) -> list[FuseAnswer]:
        fuser = Fuser(name, stepper, FusionSettings(), Positions(None))
        answers = []
        try:
            live = [0]
            answers.append(
                await fuser.apply(
                    1, FuseStep(opens=True, bos=bos, query=[0], candidates=[3], top_k=3)
                )
            )
            next_id = 1
            for frame in range(6):
                parents = [int(p) for p in rng.choice(live, size=6)]
                tokens = [ids[int(t)] for t in rng.integers(0, len(ids), size=6)]
                new = list(range(next_id, next_id + 6))
                next_id += 6
                answer = await fuser.apply(
                    1,
                    FuseStep(
                        ids=new,
                        parents=parents,
                        tokens=tokens,
                        drop=live,
                        candidates=[int(c) for c in rng.choice(ids, size=4)],
                        top_k=5 if frame % 2 else 0,
                        end=frame % 3 == 0,
                    ),
                )
                answers.append(answer)
                live = new
            return answers
        finally:
            fuser.close()

    state = rng.bit_generator.state
    stepper = make_stepper(model)
    assert isinstance(stepper, ContextStepper)
    got = asyncio.run(run(stepper))
    rng.bit_generator.state = state
    expected = asyncio.run(run(ContextStepper(model, max_context=model.order - 1)))
    for a, b in zip(got, expected, strict=True):
        assert a.ids == b.ids and a.live == b.live
        for field in ("token_log_probs", "candidate_log_probs", "top_ids", "top_log_probs",
                      "end_log_probs"):  # fmt: skip
            x, y = getattr(a, field), getattr(b, field)
            assert x.shape == y.shape and x.dtype == y.dtype and np.array_equal(x, y), field
