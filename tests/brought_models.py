"""Neural LMs written the way teams outside this project write them, for the bring-your-own-model
tests: none uses lmserve's trainer or model classes.

- `TinyLSTM`: the README's example, states batch-first [B, layers, dim], logits [B, T, V].
- `GruLM`: a GRU with torch's own state layout [layers, B, dim], exported to ONNX by
  `torch.onnx.export` under names of its own (`export_gru_onnx`), or scripted (`save_gru_script`).
- `WindowLM`: a feed-forward model whose state is its window of previous ids (int64).
- `SeqFirstLM`: PyTorch's word-language-model example style: tokens [T, B], the LSTM state as
  one (h, c) tuple argument, log_softmax output flattened to [T * B, V].

`eager_log_probs` is the reference every served answer is compared with: the module's own
log-probabilities, computed here by calling it on one whole text.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from lmserve.export.custom import ModelContract, StateSpec

WORDS = "the cat sat on mat a dog ran to and in house big small red god said let there be".split()
VOCAB = ["<unk>", "<s>", "</s>", *WORDS]
BOS, EOS = 1, 2
DIM, LAYERS = 16, 2


def _visible(model: nn.Module, seed: int) -> nn.Module:
    """Seeded weights with visible structure (not near-uniform outputs), eval mode."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.6)
    return model.eval()


class TinyLSTM(nn.Module):
    def __init__(self, vocab_size: int, dim: int = DIM, layers: int = LAYERS) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.lstm = nn.LSTM(dim, dim, layers, batch_first=True)
        self.out = nn.Linear(dim, vocab_size)

    def forward(self, tokens: Tensor, h: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        state = (h.transpose(0, 1).contiguous(), c.transpose(0, 1).contiguous())
        x, (h, c) = self.lstm(self.embed(tokens), state)
        return self.out(x), h.transpose(0, 1), c.transpose(0, 1)


LSTM_CONTRACT = ModelContract(
    states=(
        StateSpec(name="h", shape=("batch", LAYERS, DIM)),
        StateSpec(name="c", shape=("batch", LAYERS, DIM)),
    )
)


class GruLM(nn.Module):
    def __init__(self, vocab_size: int, dim: int = DIM, layers: int = LAYERS) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, dim)
        self.gru = nn.GRU(dim, dim, layers, batch_first=True)
        self.head = nn.Linear(dim, vocab_size)

    def forward(self, ids: Tensor, hidden: Tensor) -> tuple[Tensor, Tensor]:
        y, hidden = self.gru(self.embed(ids), hidden)
        return self.head(y), hidden


class SeqFirstLM(nn.Module):
    """tokens [T, B]; forward(input, (h, c)) -> (log-probs [T * B, V], (h, c))."""

    def __init__(self, vocab_size: int, dim: int = DIM) -> None:
        super().__init__()
        self.encoder = nn.Embedding(vocab_size, dim)
        self.rnn = nn.LSTM(dim, dim, 1)
        self.decoder = nn.Linear(dim, vocab_size)

    def forward(
        self, tokens: Tensor, hidden: tuple[Tensor, Tensor]
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        output, hidden = self.rnn(self.encoder(tokens), hidden)
        decoded = self.decoder(output).view(-1, self.decoder.out_features)
        return torch.log_softmax(decoded, dim=1), hidden


SEQ_FIRST_CONTRACT = ModelContract(
    states=(
        StateSpec(name="h", shape=(1, "batch", DIM)),
        StateSpec(name="c", shape=(1, "batch", DIM)),
    ),
    scores="log_probs",
    time_major=True,
    states_as_tuple=True,
)


def tiny_lstm(seed: int = 0) -> TinyLSTM:
    torch.manual_seed(seed)
    model = TinyLSTM(len(VOCAB))
    _visible(model, seed)
    return model


def gru_lm(seed: int = 1) -> GruLM:
    torch.manual_seed(seed)
    model = GruLM(len(VOCAB))
    _visible(model, seed)
    return model


def seq_first_lm(seed: int = 2) -> SeqFirstLM:
    torch.manual_seed(seed)
    model = SeqFirstLM(len(VOCAB))
    _visible(model, seed)
    return model


def export_gru_onnx(
    model: nn.Module, path: Path, *, batch_first_state: bool = False, **kw: Any
) -> None:
    """The team's own export: its names, dynamic batch and time (unless `kw` says otherwise)."""
    module: nn.Module = model if not batch_first_state else _BatchFirstState(model)
    hidden = torch.zeros(1, LAYERS, DIM) if batch_first_state else torch.zeros(LAYERS, 1, DIM)
    batch_axis = 0 if batch_first_state else 1
    axes = {
        "input_ids": {0: "b", 1: "t"},
        "hidden_in": {batch_axis: "b"},
        "next_logits": {0: "b", 1: "t"},
        "hidden_out": {batch_axis: "b"},
    }
    with torch.no_grad():
        torch.onnx.export(
            module,
            (torch.zeros(1, 4, dtype=torch.long), hidden),
            str(path),
            dynamo=False,
            input_names=["input_ids", "hidden_in"],
            output_names=["next_logits", "hidden_out"],
            dynamic_axes=kw.pop("dynamic_axes", axes),
            opset_version=kw.pop("opset_version", 17),
        )


class _BatchFirstState(nn.Module):
    """The same GRU, exported with its state batch-first [B, layers, dim]."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: Tensor, hidden: Tensor) -> tuple[Tensor, Tensor]:
        y, h = self.model(ids, hidden.transpose(0, 1).contiguous())
        return y, h.transpose(0, 1)


def save_gru_script(model: nn.Module, path: Path) -> None:
    torch.jit.save(torch.jit.script(model), str(path))


def ids_of(text: str) -> list[int]:
    return [VOCAB.index(w) if w in VOCAB else 0 for w in text.split()]


@torch.no_grad()
def eager_log_probs(model: nn.Module, inputs: Sequence[int]) -> np.ndarray:
    """log P(. | inputs[:t+1]) [len(inputs), V] (float64) from the team's module, in one call
    from its zero state, whatever its own layout."""
    tokens = torch.tensor([list(inputs)])
    if isinstance(model, TinyLSTM):
        zeros = torch.zeros(1, LAYERS, DIM)
        out = model(tokens, zeros, zeros)[0][0]
    elif isinstance(model, GruLM):
        out = model(tokens, torch.zeros(LAYERS, 1, DIM))[0][0]
    elif isinstance(model, WindowLM):
        out = model(tokens, torch.full((1, model.context), BOS))[0][0]
    elif isinstance(model, SeqFirstLM):
        zeros = torch.zeros(1, 1, DIM)
        out = model(tokens.T, (zeros, zeros))[0]  # [T * 1, V]
    else:
        raise TypeError(type(model))
    return torch.log_softmax(out.double(), dim=-1).numpy()


def eager_token_log_probs(model: nn.Module, ids: Sequence[int]) -> list[float]:
    """Each token's log-prob and then </s>'s, after <s>: what Score returns per token."""
    lp = eager_log_probs(model, [BOS, *ids])
    return [float(lp[t, w]) for t, w in enumerate([*ids, EOS])]


class WindowLM(nn.Module):
    """A feed-forward LM over the `context` previous tokens: its state is that window of ids
    [B, context] (int64, batch first), which starts filled with <s>."""

    def __init__(self, vocab_size: int, dim: int = DIM, context: int = 2) -> None:
        super().__init__()
        self.context = context
        self.embed = nn.Embedding(vocab_size, dim)
        self.hidden = nn.Linear(context * dim, dim)
        self.out = nn.Linear(dim, vocab_size)

    def forward(self, tokens: Tensor, window: Tensor) -> tuple[Tensor, Tensor]:
        full = torch.cat([window, tokens], dim=1)  # [B, context + T]
        length = full.shape[1]
        # Position t reads the `context` ids ending at tokens[t].
        views = [full[:, i + 1 : length - (self.context - 1 - i)] for i in range(self.context)]
        x = torch.cat([self.embed(v) for v in views], dim=-1)
        return self.out(torch.tanh(self.hidden(x))), full[:, -self.context :]


WINDOW_CONTRACT = ModelContract(
    states=(StateSpec(name="window", shape=("batch", 2), dtype="int64"),)
)


def window_lm(seed: int = 3) -> WindowLM:
    torch.manual_seed(seed)
    model = WindowLM(len(VOCAB))
    _visible(model, seed)
    return model
