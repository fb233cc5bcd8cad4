"""The recurrent and feed-forward models' trainer: their batch step and scorer for the loop
(`loop.train`), and their checkpoints read back.

A batch is read in truncated-BPTT windows of `bptt` steps, the state carried between windows
with its gradient cut; a sentence is scored from the model's initial state.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from lmserve.export.rnn.data import IGNORE_INDEX, Batch, length_bucketed_batches
from lmserve.export.rnn.model import RecurrentLMConfig, State
from lmserve.export.rnn.nets import NeuralLM, build_model
from lmserve.export.trainers.loop import Evaluation, TrainConfig


def detach(state: State) -> State:
    return tuple(s.detach() for s in state)


@torch.no_grad()
def evaluate(model: NeuralLM, sentences: Sequence[np.ndarray], batch_size: int = 64) -> Evaluation:
    """Sum of log p(target) over every sentence, each scored from the initial state."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for batch in length_bucketed_batches(sentences, batch_size, rng=None):
        logits, _ = model(batch.inputs, model.initial_state(batch.inputs.shape[0]))
        log_probs = torch.log_softmax(logits.float(), dim=-1)
        mask = batch.targets != IGNORE_INDEX
        picked = log_probs.gather(-1, batch.targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        total += float(picked[mask].double().sum())
        count += int(mask.sum())
    model.train(was_training)
    return Evaluation(total, count)


def train_batch(
    model: NeuralLM, batch: Batch, optimizer: torch.optim.Optimizer, cfg: TrainConfig
) -> float:
    """One batch in BPTT windows of `cfg.bptt` steps; the state is carried, its gradient cut."""
    loss_fn = nn.CrossEntropyLoss(ignore_index=IGNORE_INDEX, reduction="sum")
    state = model.initial_state(batch.inputs.shape[0])
    total = 0.0
    width = batch.inputs.shape[1]
    for start in range(0, width, cfg.bptt):
        inputs = batch.inputs[:, start : start + cfg.bptt]
        targets = batch.targets[:, start : start + cfg.bptt]
        n_tokens = int((targets != IGNORE_INDEX).sum())
        if n_tokens == 0:
            break
        logits, state = model(inputs, detach(state))
        loss = loss_fn(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        (loss / n_tokens).backward()
        nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
        optimizer.step()
        total += float(loss.detach())
    return total


def load_checkpoint(path: Path) -> tuple[NeuralLM, dict[str, Any]]:
    """The model (in eval mode) and everything else the checkpoint holds."""
    data: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    model = build_model(RecurrentLMConfig(**data["model_config"]))
    model.load_state_dict(data["state_dict"])
    model.eval()
    return model, data
