"""The feed-forward neural LM (Bengio et al., 2003) trained by `lmserve train-rnn --cell ffnn`.

The previous `order - 1` tokens are embedded, their embeddings concatenated, passed through one
tanh hidden layer and a (possibly tied) decoder to logits. It has the recurrent models' contract,
`forward(tokens, state) -> (logits, state)`, so training, export and serving carry it alike: the
state is the window of the last `order - 1` ids, int64 [1, batch, order - 1] (batch on axis 1,
as the recurrent states have it), filled with `<s>` before anything is read.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lmserve.export.rnn.data import BOS_ID
from lmserve.export.rnn.model import RecurrentLMConfig, State


def window_views(embedded: Tensor, context: int) -> Tensor:
    """[batch, context + time, emb] -> [batch, time, context * emb]: position t sees the
    `context` embeddings ending at the window's t-th new token (oldest first).

    Static slices (negative ends), so an exported graph keeps the time axis free.
    """
    parts: list[Tensor] = []
    for k in range(context):
        end = k + 1 - context
        if end == 0:
            parts.append(embedded[:, k + 1 :])
        else:
            parts.append(embedded[:, k + 1 : end])
    return torch.cat(parts, dim=-1)


class FeedForwardLM(nn.Module):
    """Embedding of a fixed window, one tanh hidden layer, and a (possibly tied) decoder.

    >>> cfg = RecurrentLMConfig(vocab_size=10, cell="ffnn", order=3, embedding_size=8,
    ...                         hidden_size=8)
    >>> logits, state = FeedForwardLM(cfg)(torch.ones(2, 5, dtype=torch.long),
    ...                                    FeedForwardLM(cfg).initial_state(2))
    >>> tuple(logits.shape), tuple(state[0].shape)
    ((2, 5, 10), (1, 2, 2))
    """

    def __init__(self, config: RecurrentLMConfig) -> None:
        super().__init__()
        if config.order is None:
            raise ValueError("a feed-forward LM needs an order")
        self.config = config
        self.context = config.order - 1
        self.embedding = nn.Embedding(config.vocab_size, config.embedding_size)
        self.dropout = nn.Dropout(config.dropout)
        self.hidden = nn.Linear(self.context * config.embedding_size, config.hidden_size)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)
        if config.tie_weights:
            self.decoder.weight = self.embedding.weight
        nn.init.uniform_(self.embedding.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)
        if not config.tie_weights:
            nn.init.uniform_(self.decoder.weight, -0.1, 0.1)

    def initial_state(self, batch: int, device: torch.device | None = None) -> State:
        """A window of `<s>` only: the padding before (and including) the first `<s>`."""
        return (torch.full((1, batch, self.context), BOS_ID, dtype=torch.long, device=device),)

    def features(self, tokens: Tensor, state: State) -> tuple[Tensor, State]:
        """tokens [batch, time] -> hidden activations [batch, time, hidden] and the new window."""
        full = torch.cat([state[0][0], tokens], dim=1)
        x = window_views(self.dropout(self.embedding(full)), self.context)
        return torch.tanh(self.hidden(x)), (full[:, -self.context :].unsqueeze(0),)

    def forward(self, tokens: Tensor, state: State) -> tuple[Tensor, State]:
        """tokens [batch, time] -> logits [batch, time, vocab] and the window after them."""
        out, new_state = self.features(tokens, state)
        return self.decoder(self.dropout(out)), new_state
