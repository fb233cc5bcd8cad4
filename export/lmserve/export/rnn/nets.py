"""The model classes `train-rnn` trains, chosen by the configuration's cell."""

from __future__ import annotations

from lmserve.export.rnn.ffnn import FeedForwardLM
from lmserve.export.rnn.model import RecurrentLM, RecurrentLMConfig

# Both have `config`, `embedding`, `decoder`, `initial_state`, `features` and `forward`.
NeuralLM = RecurrentLM | FeedForwardLM


def build_model(config: RecurrentLMConfig) -> NeuralLM:
    """A fresh (randomly initialised) model of the configured cell."""
    if config.cell == "ffnn":
        return FeedForwardLM(config)
    return RecurrentLM(config)
