"""The fused decoder graph (GroupQueryAttention over one shared cache buffer) and its stepper
against transformers' eager forward in torch: scoring rows of different lengths, generation
step by step, and the stepper's states as values (old states kept, others stepped, the old
ones read again), for GPT-2 and a grouped-query Llama (its rotary embedding in its own nodes
at head size 8, inside the attention op at 16)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from hf_models import BUILDERS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmserve.export.hf.fused_graph import fused_decoder
from lmserve.server.backends.fused_transformer import FusedTransformerBackend
from lmserve.server.backends.shared_kv_stepping import SharedKvState, SharedKvStepper
from lmserve.server.backends.transformer import CacheShape
from lmserve.server.text.vocab import Vocabulary

TOL = 1e-4  # lmserve.export.parity.PARITY_NATS
VOCAB = 300


def _llama16() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config)


class Case:
    """A torch model, its fused graph's backend, and torch's log-probs as the reference."""

    def __init__(self, model: Any, folder: Path) -> None:
        self.model = model.eval()
        path = folder / "model.onnx"
        onnx.save_model(fused_decoder(self.model), str(path))
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        words = ["<s>", "</s>", "<unk>", *(f"w{i}" for i in range(VOCAB - 3))]
        vocab = Vocabulary.from_words(words, bos="<s>", eos="</s>", unk="<unk>")
        cache = CacheShape.from_config(self.model.config.to_dict(), "config.json")
        self.backend = FusedTransformerBackend(session, cache, vocab)
        self._memo: dict[tuple[int, ...], np.ndarray] = {}

    def reference(self, ids: list[int]) -> np.ndarray:
        """log-softmax of torch's logits at every position of `ids` read alone."""
        key = tuple(ids)
        if key not in self._memo:
            with torch.no_grad():
                logits = self.model(torch.tensor([ids])).logits[0].double()
            self._memo[key] = torch.log_softmax(logits, -1).numpy()
        return self._memo[key]

    def last(self, ids: list[int]) -> np.ndarray:
        return self.reference(ids)[-1]


@pytest.fixture(scope="module", params=["gpt2", "llama", "llama16"])
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Case:
    torch.manual_seed(0)
    build = _llama16 if request.param == "llama16" else BUILDERS[request.param]
    return Case(build(), tmp_path_factory.mktemp(request.param))


def test_scoring_rows_of_different_lengths_matches_torch(case: Case) -> None:
    rows = [[1, 5, 6, 7, 8, 9], [1, 11], [1, 12, 13, 14, 200, 201, 202, 7, 7, 7]]
    logits = case.backend.prompt_pass(rows)
    for k, row in enumerate(rows):
        got = torch.log_softmax(torch.from_numpy(logits[k, : len(row)]).double(), -1).numpy()
        np.testing.assert_allclose(got, case.reference(row), atol=TOL)


def test_generation_step_by_step_matches_torch(case: Case) -> None:
    stepper = SharedKvStepper(case.backend)
    bos = case.backend.vocab.bos_id
    prompts = [[5, 6, 7, 8, 9, 10], [11], [12, 13, 14]]
    lp, state = stepper.prefill(prompts)
    histories = [[bos, *p] for p in prompts]
    for step in range(6):
        for row, history in enumerate(histories):
            np.testing.assert_allclose(lp[row], case.last(history), atol=TOL)
        tokens = [20 + step, 30 + step, 40 + step]
        lp, state = stepper.step(np.array(tokens), state)
        for history, token in zip(histories, tokens, strict=True):
            history.append(token)
    assert state.lengths.tolist() == [len(h) for h in histories]
    # chunks of different lengths after a past, then a step
    lp, state = stepper.feed([[60], [61, 62, 63], [64, 65]], state)
    for history, chunk in zip(histories, ([60], [61, 62, 63], [64, 65]), strict=True):
        history.extend(chunk)
    for row, history in enumerate(histories):
        np.testing.assert_allclose(lp[row], case.last(history), atol=TOL)


def test_steps_write_in_place_and_rows_leaving_move_at_most_one(case: Case) -> None:
    stepper = SharedKvStepper(case.backend)
    _, state = stepper.prefill([[5 + i] * (i + 1) for i in range(8)])
    pool, slots = state.pool, state.slots.tolist()
    _, state = stepper.step(np.arange(8) + 20, state)
    assert state.pool is pool and state.slots.tolist() == slots  # in place
    same = stepper.select(state, list(range(8)))
    _, stepped = stepper.step(np.arange(8) + 30, same)
    assert stepped.slots.tolist() == slots
    del same, state
    keep = [0, 1, 2, 4, 5, 6, 7]  # row 3 leaves: a hole, stepped over as a dummy
    _, state = stepper.step(np.arange(7) + 40, stepper.select(stepped, keep))
    assert state.slots.tolist() == [slots[i] for i in keep]
    del stepped
    keep2 = [0, 1, 4, 6]  # more holes than a quarter: compacted, moving the fewest rows
    before = state.slots.tolist()
    chosen = stepper.select(state, keep2)
    del state  # the rows that left are free once no state holds them
    _, state = stepper.step(np.arange(4) + 50, chosen)
    del chosen
    moved = sum(
        a != b for a, b in zip(state.slots.tolist(), [before[i] for i in keep2], strict=True)
    )
    assert moved <= 2 and max(state.slots) - min(state.slots) == 3
    # beams: a forked row is copied, the others stay
    parents = state.slots.tolist()
    state = stepper.select(state, [0, 0, 2, 3])  # as beam search reorders: the old one goes
    _, beams = stepper.step(np.array([1, 2, 3, 4]), state)
    assert beams.slots.tolist() == [parents[0], parents[1], *parents[2:]]


Op = tuple[str, int, int]


@st.composite
def programs(draw: st.DrawFn) -> list[Op]:
    return draw(
        st.lists(
            st.tuples(
                st.sampled_from(["step", "select", "merge", "truncate", "feed", "prefill"]),
                st.integers(0, 1000),
                st.integers(0, 1000),
            ),
            min_size=4,
            max_size=14,
        )
    )


def _check(
    case: Case, stepper: SharedKvStepper, state: SharedKvState, hist: list[list[int]]
) -> None:
    """Read `state` again: one more token per row equals torch on that row's history."""
    token = 77
    lp, _ = stepper.step(np.full(state.batch, token), state)
    for row, history in enumerate(hist):
        np.testing.assert_allclose(lp[row], case.last([*history, token]), atol=TOL)


def _live(held: list[tuple[SharedKvState, list[list[int]]]]) -> Iterator[int]:
    return (i for i, (s, _) in enumerate(held) if s.batch)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    derandomize=True,
)
@given(program=programs())
def test_states_are_values_whatever_is_stepped_after_them(case: Case, program: list[Op]) -> None:
    """Every state ever made is kept; after a random program of steps, selects (repeats
    included), merges (across pools too), truncations and chunks, each is read again."""
    stepper = SharedKvStepper(case.backend)
    bos = case.backend.vocab.bos_id
    _, first = stepper.prefill([[5, 6, 7], [8], [9, 10]])
    held: list[tuple[SharedKvState, list[list[int]]]] = [
        (first, [[bos, 5, 6, 7], [bos, 8], [bos, 9, 10]])
    ]
    for op, a, b in program:
        live = list(_live(held))
        state, hist = held[live[a % len(live)]]
        if op == "step":
            tokens = [(a + 3 * r) % 290 + 3 for r in range(state.batch)]
            _, new = stepper.step(np.array(tokens), state)
            held.append((new, [[*h, t] for h, t in zip(hist, tokens, strict=True)]))
        elif op == "select":
            rows = [(a + k * b) % state.batch for k in range(1 + b % 4)]
            held.append((stepper.select(state, rows), [list(hist[r]) for r in rows]))
        elif op == "merge":
            other, other_hist = held[live[b % len(live)]]
            held.append((stepper.merge([state, other]), [*hist, *other_hist]))
        elif op == "truncate":
            count = min(1 + a % 3, int(state.lengths.min()) - 1)
            if count > 0:
                held.append((stepper.truncate(state, count), [h[:-count] for h in hist]))
        elif op == "feed":
            chunks = [
                [(a + r + k) % 290 + 3 for k in range(1 + (b + r) % 3)] for r in range(state.batch)
            ]
            _, new = stepper.feed(chunks, state)
            held.append((new, [[*h, *c] for h, c in zip(hist, chunks, strict=True)]))
        else:
            prompt = [[(a + k) % 290 + 3 for k in range(1 + b % 5)]]
            _, new = stepper.prefill(prompt)
            held.append((new, [[bos, *prompt[0]]]))
        if max(len(h) for _, hs in held for h in hs) > 40:
            break
    for state, hist in held:
        _check(case, stepper, state, hist)
