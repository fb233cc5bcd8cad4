"""Steppers: token-by-token stepping equals one batched score; split/merge/select round-trip."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from neural_folders import VOCAB, tiny_model

from lmserve.server.backends.base import EncodedBatch, LanguageModelBackend, Vocabulary
from lmserve.server.backends.interpolated import InterpolatedBackend
from lmserve.server.backends.ngram.model import NgramModel
from lmserve.server.backends.recurrent import (
    RecurrentBackend,
    RecurrentSpec,
    RecurrentState,
    TokenArray,
)
from lmserve.server.backends.stepping import (
    ContextStepper,
    InterpolatedStepper,
    RecurrentStepper,
    Stepper,
)
from lmserve.server.families.catalog import make_stepper

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "ngram"


class EagerBackend(RecurrentBackend):
    """The tiny PyTorch model run eagerly behind the recurrent contract (no export needed)."""

    def __init__(self, cell: str = "lstm", chunk: int = 3) -> None:
        self.model = tiny_model(cell)
        c = self.model.config
        names = ("h", "c") if cell == "lstm" else ("h",)
        spec = RecurrentSpec(cell, c.vocab_size, c.hidden_size, c.num_layers, names)
        super().__init__(spec, Vocabulary.from_words(VOCAB), max_chunk_tokens=chunk)

    def _run_step(
        self, tokens: TokenArray, state: RecurrentState
    ) -> tuple[np.ndarray, RecurrentState]:
        with torch.no_grad():
            logits, new = self.model(torch.from_numpy(tokens), tuple(map(torch.from_numpy, state)))
            lp = torch.log_softmax(logits, dim=-1)
        return lp.numpy(), tuple(s.numpy() for s in new)

    def _run_score(
        self, tokens: TokenArray, targets: TokenArray, state: RecurrentState
    ) -> tuple[np.ndarray, RecurrentState]:
        lp, new = self._run_step(tokens, state)
        return np.take_along_axis(lp, targets[..., None], axis=-1)[..., 0], new


def _batch(texts: list[list[int]]) -> EncodedBatch:
    ids = np.array([i for t in texts for i in t], dtype=np.int32)
    offsets = np.cumsum([0, *map(len, texts)]).astype(np.int64)
    return EncodedBatch(ids=ids, offsets=offsets, oov=ids == 0)


@pytest.fixture(scope="module")
def ngram() -> NgramModel:
    return NgramModel.from_arpa(FIXTURES / "toy.arpa")


@pytest.fixture(scope="module", params=["lstm", "gru"])
def recurrent(request: pytest.FixtureRequest) -> EagerBackend:
    return EagerBackend(request.param)


def _backends(ngram: NgramModel, recurrent: EagerBackend) -> list[LanguageModelBackend]:
    return [ngram, recurrent]


def _texts(backend: LanguageModelBackend) -> list[list[int]]:
    v = len(backend.vocab)
    rng = np.random.default_rng(1)
    return [[3, 4, 5], [], rng.integers(3, v, size=7).tolist(), [0, 3, 3]]


def test_make_stepper_picks_the_adapter(ngram: NgramModel, recurrent: EagerBackend) -> None:
    assert isinstance(make_stepper(recurrent), RecurrentStepper)
    s = make_stepper(ngram)
    assert isinstance(s, ContextStepper) and s.max_context == ngram.order - 1
    mix = InterpolatedBackend([(ngram, 0.5), (ngram, 0.5)])
    assert isinstance(make_stepper(mix), InterpolatedStepper)


@pytest.mark.parametrize("which", [0, 1])
def test_stepping_token_by_token_equals_batched_score(
    ngram: NgramModel, recurrent: EagerBackend, which: int
) -> None:
    backend = _backends(ngram, recurrent)[which]
    stepper = make_stepper(backend)
    texts = _texts(backend)
    scores = backend.score(_batch(texts), per_token=True)
    assert scores.token_log_probs is not None and scores.token_offsets is not None
    # All texts stepped together in one batch: empty prompts, then one token per step.
    lp, state = stepper.prefill([[] for _ in texts])
    got: list[list[float]] = [[] for _ in texts]
    width = max(map(len, texts)) + 1
    for t in range(width):
        targets = [(text + [backend.vocab.eos_id])[t] if t <= len(text) else 0 for text in texts]
        for i, text in enumerate(texts):
            if t <= len(text):
                got[i].append(float(lp[i, targets[i]]))
        lp, state = stepper.step(np.array(targets), state)
    for i in range(len(texts)):
        lo, hi = scores.token_offsets[i], scores.token_offsets[i + 1]
        np.testing.assert_allclose(got[i], scores.token_log_probs[lo:hi], atol=1e-5)


@pytest.mark.parametrize("which", [0, 1])
def test_prefill_equals_next_token_log_probs(
    ngram: NgramModel, recurrent: EagerBackend, which: int
) -> None:
    backend = _backends(ngram, recurrent)[which]
    texts = _texts(backend)
    lp, _ = make_stepper(backend).prefill(texts)
    for i, text in enumerate(texts):
        np.testing.assert_allclose(lp[i], backend.next_token_log_probs(text), atol=1e-5)


@pytest.mark.parametrize("which", [0, 1])
def test_split_merge_select_round_trip(
    ngram: NgramModel, recurrent: EagerBackend, which: int
) -> None:
    backend = _backends(ngram, recurrent)[which]
    stepper: Stepper = make_stepper(backend)
    texts = _texts(backend)
    _, state = stepper.prefill(texts)
    rows = stepper.split(state)
    assert len(rows) == len(texts)
    tokens = np.array([3, 4, 5, 3])
    batched, _ = stepper.step(tokens, stepper.merge(rows))
    for i, row in enumerate(rows):  # each row alone steps exactly as inside the batch
        alone, _ = stepper.step(tokens[i : i + 1], row)
        np.testing.assert_allclose(alone[0], batched[i], atol=1e-5)
    order = [2, 0, 0, 3]
    same = np.full(4, 3)
    plain, _ = stepper.step(same, state)
    by_merge, _ = stepper.step(same, stepper.merge([rows[i] for i in order]))
    by_select, _ = stepper.step(same, stepper.select(state, order))
    np.testing.assert_allclose(by_merge, by_select, atol=1e-6)
    np.testing.assert_allclose(by_merge, plain[order], atol=1e-5)


def test_interpolated_stepper_equals_the_mixture(ngram: NgramModel) -> None:
    bigram_like = ContextStepper(ngram, max_context=1).backend  # same model, other weight
    mix = InterpolatedBackend([(ngram, 0.3), (bigram_like, 0.7)])
    stepper = make_stepper(mix)
    lp, state = stepper.prefill([[3], []])
    lp, state = stepper.step(np.array([4, 3]), state)
    np.testing.assert_allclose(lp[0], mix.next_token_log_probs([3, 4]), atol=1e-9)
    np.testing.assert_allclose(lp[1], mix.next_token_log_probs([3]), atol=1e-9)


class _PerContext:
    """An n-gram model seen without its batched call: the stepper's per-context loop."""

    def __init__(self, model: NgramModel) -> None:
        self.model = model
        self.vocab = model.vocab
        self.next_token_log_probs = model.next_token_log_probs


@pytest.mark.parametrize("kernel", ["c", "numpy"])
def test_ngram_steps_in_one_batched_float32_call(ngram: NgramModel, kernel: str) -> None:
    model = NgramModel(ngram.tables, kernel=kernel)  # type: ignore[arg-type]
    batched = make_stepper(model)
    loop = ContextStepper(_PerContext(model), max_context=model.order - 1)  # type: ignore[arg-type]
    texts = [*_texts(model), [3, 4, 5], [], [3, 4, 5]]  # shared contexts, side by side and apart
    got, state = batched.prefill(texts)
    want, want_state = loop.prefill(texts)
    assert got.dtype == np.float32 and want.dtype == np.float64 and state == want_state
    np.testing.assert_allclose(got, want.astype(np.float32), rtol=1e-6, atol=1e-6)
    tokens = np.array([3, 4, 5, 3, 2, 5, 3])
    got, _ = batched.step(tokens, state)
    want, _ = loop.step(tokens, want_state)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want.astype(np.float32), rtol=1e-6, atol=1e-6)


class _ContextEcho:
    """A backend whose distribution records the context it was asked about (its length)."""

    def __init__(self) -> None:
        self.vocab = Vocabulary.from_words(["<unk>", "<s>", "</s>", "a", "b"])
        self.seen: list[tuple[int, ...]] = []

    def score(self, batch: EncodedBatch, **_: bool) -> object:  # unused by the stepper
        raise NotImplementedError

    def next_token_log_probs(self, context: Sequence[int], *, bos: bool = True) -> np.ndarray:
        self.seen.append(tuple(int(i) for i in context))
        return np.full(len(self.vocab), -np.log(len(self.vocab)))


@pytest.mark.parametrize("length", range(8))
def test_context_stepper_keeps_the_last_max_context_ids(length: int) -> None:
    # Regression: a context shorter than max_context but longer than half of it was cut to
    # its last few ids (a negative slice start), so a 5-gram forgot words while generating.
    backend = _ContextEcho()
    stepper = ContextStepper(backend, max_context=4)  # type: ignore[arg-type]
    prompt = [3 + (i % 2) for i in range(length)]
    _, state = stepper.prefill([prompt])
    expected = tuple([backend.vocab.bos_id, *prompt][-4:])
    assert state == (expected,)
    assert backend.seen[-1] == expected
    _, state = stepper.step(np.array([4]), state)
    assert state == (tuple([backend.vocab.bos_id, *prompt, 4][-4:]),)
