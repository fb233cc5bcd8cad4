"""The recurrent language model trained by `lmserve train-rnn` and exported for serving.

After the PyTorch word-language-model example: embedding -> RNN/LSTM/GRU -> linear decoder,
optionally tying the decoder to the embedding (Press & Wolf, 2017; Inan et al., 2017). The model
keeps no state of its own: `forward(tokens, state) -> (logits, state)`, so training, export and
serving all carry the recurrent state explicitly.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import Tensor, nn

CellType = Literal["rnn", "lstm", "gru", "ffnn"]
# h for RNN/GRU; (h, c) for LSTM; each float [layers, batch, hidden]. The feed-forward model
# (ffnn.py) carries its window of previous ids instead: int64 [1, batch, order - 1].
State = tuple[Tensor, ...]


class RecurrentLMConfig(BaseModel):
    """The architecture; stored in checkpoints and in the model folder's manifest."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vocab_size: int = Field(gt=3)
    cell: CellType = "lstm"
    embedding_size: int = Field(default=512, gt=0)
    hidden_size: int = Field(default=512, gt=0)
    num_layers: int = Field(default=1, ge=1)
    dropout: float = Field(default=0.3, ge=0.0, lt=1.0)
    tie_weights: bool = True
    # The n-gram order of the feed-forward model (it reads order - 1 previous tokens).
    order: int | None = Field(default=None, ge=2)

    @model_validator(mode="after")
    def _tying_needs_matching_sizes(self) -> RecurrentLMConfig:
        # A tied decoder reads the hidden state through the embedding matrix [vocab, emb].
        if self.tie_weights and self.embedding_size != self.hidden_size:
            raise ValueError("tie_weights needs embedding_size == hidden_size")
        if (self.cell == "ffnn") != (self.order is not None):
            raise ValueError("order is needed by (and only by) the ffnn cell")
        if self.cell == "ffnn" and self.num_layers != 1:
            raise ValueError("the ffnn cell has one hidden layer (num_layers 1)")
        return self

    @property
    def state_names(self) -> tuple[str, ...]:
        if self.cell == "ffnn":
            return ("window",)
        return ("h", "c") if self.cell == "lstm" else ("h",)

    @property
    def state_size(self) -> int:
        """The last axis of every state tensor: hidden units, or the ffnn's window length."""
        return self.order - 1 if self.order is not None else self.hidden_size


class RecurrentLM(nn.Module):
    """Embedding, a stack of recurrent layers, and a (possibly tied) decoder to logits.

    >>> model = RecurrentLM(RecurrentLMConfig(vocab_size=10, embedding_size=8, hidden_size=8))
    >>> logits, state = model(torch.zeros(2, 5, dtype=torch.long), model.initial_state(2))
    >>> tuple(logits.shape), len(state)
    ((2, 5, 10), 2)
    """

    def __init__(self, config: RecurrentLMConfig) -> None:
        super().__init__()
        if config.cell == "ffnn":
            raise ValueError("the ffnn cell is FeedForwardLM (nets.build_model picks it)")
        self.config = config
        self.embedding = nn.Embedding(config.vocab_size, config.embedding_size)
        self.dropout = nn.Dropout(config.dropout)
        self.rnn = self._make_rnn(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        if config.tie_weights:
            self.decoder.weight = self.embedding.weight
        self._init_weights()

    @staticmethod
    def _make_rnn(config: RecurrentLMConfig) -> nn.RNNBase:
        dropout = config.dropout if config.num_layers > 1 else 0.0
        sizes = (config.embedding_size, config.hidden_size, config.num_layers)
        if config.cell == "lstm":
            return nn.LSTM(*sizes, batch_first=True, dropout=dropout)
        if config.cell == "gru":
            return nn.GRU(*sizes, batch_first=True, dropout=dropout)
        return nn.RNN(*sizes, nonlinearity="tanh", batch_first=True, dropout=dropout)

    def _init_weights(self) -> None:
        nn.init.uniform_(self.embedding.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        if not self.config.tie_weights:
            nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def initial_state(self, batch: int, device: torch.device | None = None) -> State:
        """The all-zero state every sentence starts from (before `<s>` is read)."""
        c = self.config
        zeros = torch.zeros(c.num_layers, batch, c.hidden_size, device=device)
        return (zeros, zeros.clone()) if c.cell == "lstm" else (zeros,)

    def forward(self, tokens: Tensor, state: State) -> tuple[Tensor, State]:
        """tokens [batch, time] -> logits [batch, time, vocab] and the state after them."""
        out, new_state = self.features(tokens, state)
        return self.decoder(self.dropout(out)), new_state

    def features(self, tokens: Tensor, state: State) -> tuple[Tensor, State]:
        """tokens [batch, time] -> the decoder's input [batch, time, hidden] and the new state."""
        x = self.dropout(self.embedding(tokens))
        if self.config.cell == "lstm":
            out, (h, c) = self.rnn(x, (state[0], state[1]))
            return out, (h, c)
        out, h = self.rnn(x, state[0])
        return out, (h,)
