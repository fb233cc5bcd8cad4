"""Training loop for recurrent LMs: truncated BPTT, clipping, plateau decay, early stopping.

Choices follow the PyTorch word-language-model example and Merity et al. (2018): gradient-norm
clipping, the learning rate halved when validation perplexity stops improving, the best
validation model checkpointed, training stopped after `patience` epochs without improvement or
at a time limit. A seed fixes initialisation, dropout and batch order.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from lmserve.export.rnn.data import IGNORE_INDEX, Batch, length_bucketed_batches
from lmserve.export.rnn.model import RecurrentLMConfig, State
from lmserve.export.rnn.nets import NeuralLM, build_model

BEST_CHECKPOINT = "checkpoint-best.pt"
LAST_CHECKPOINT = "checkpoint-last.pt"


class TrainConfig(BaseModel):
    """How to train; recorded in the checkpoint and the manifest's provenance."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    epochs: int = Field(default=20, ge=1)
    batch_size: int = Field(default=64, ge=1)
    bptt: int = Field(default=100, ge=1)
    optimizer: Literal["adam", "sgd"] = "adam"
    lr: float = Field(default=2e-3, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    clip: float = Field(default=0.25, gt=0)
    lr_decay: float = Field(default=0.5, gt=0, le=1)
    patience: int = Field(default=3, ge=1)
    seed: int = 1
    max_minutes: float | None = Field(default=None, gt=0)
    threads: int | None = Field(default=None, ge=1)


@dataclass(frozen=True)
class Evaluation:
    """Natural-log totals over a set of sentences, every token plus `</s>` counted."""

    log_prob: float
    tokens: int

    @property
    def perplexity(self) -> float:
        return math.exp(-self.log_prob / self.tokens) if self.tokens else float("nan")


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


def _train_batch(
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


def _make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)


def save_checkpoint(path: Path, model: NeuralLM, payload: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(
        {"model_config": model.config.model_dump(), "state_dict": model.state_dict(), **payload},
        tmp,
    )
    tmp.replace(path)


def load_checkpoint(path: Path) -> tuple[NeuralLM, dict[str, Any]]:
    """The model (in eval mode) and everything else the checkpoint holds."""
    data: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    model = build_model(RecurrentLMConfig(**data["model_config"]))
    model.load_state_dict(data["state_dict"])
    model.eval()
    return model, data


def train(
    model: NeuralLM,
    cfg: TrainConfig,
    train_sentences: Sequence[np.ndarray],
    valid_sentences: Sequence[np.ndarray],
    out_dir: Path,
    *,
    extra: dict[str, Any] | None = None,
    resume: bool = False,
    log: Callable[[str], None] = print,
    progress: bool = True,
) -> Evaluation:
    """Trains in place, checkpointing the best validation model; returns its validation score."""
    from tqdm import tqdm

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    optimizer = _make_optimizer(model, cfg)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(
        optimizer, mode="min", factor=cfg.lr_decay, patience=0
    )
    payload = {"train_config": cfg.model_dump(), **(extra or {})}
    start_epoch, best, stale, history = 1, math.inf, 0, []
    if resume and (out_dir / LAST_CHECKPOINT).is_file():
        data = torch.load(out_dir / LAST_CHECKPOINT, map_location="cpu", weights_only=True)
        model.load_state_dict(data["state_dict"])
        optimizer.load_state_dict(data["optimizer"])
        scheduler.load_state_dict(data["scheduler"])
        rng.bit_generator.state = data["rng"]
        torch.set_rng_state(data["torch_rng"])
        start_epoch, best, stale, history = (
            data["epoch"] + 1,
            data["best"],
            data["stale"],
            data["history"],
        )
        log(f"resumed after epoch {data['epoch']} (best valid ppl {best:.2f})")
    deadline = time.monotonic() + cfg.max_minutes * 60 if cfg.max_minutes else math.inf
    n_train_tokens = sum(len(s) + 1 for s in train_sentences)
    for epoch in range(start_epoch, cfg.epochs + 1):
        model.train()
        began, seen, loss_sum = time.monotonic(), 0, 0.0
        bar = tqdm(total=n_train_tokens, desc=f"epoch {epoch}", unit="tok", disable=not progress)
        for batch in length_bucketed_batches(train_sentences, cfg.batch_size, rng):
            loss_sum += _train_batch(model, batch, optimizer, cfg)
            seen += batch.tokens
            bar.update(batch.tokens)
            bar.set_postfix(loss=f"{loss_sum / seen:.3f}", ppl=f"{math.exp(loss_sum / seen):.1f}")
            if time.monotonic() > deadline:
                break
        bar.close()
        valid = evaluate(model, valid_sentences, cfg.batch_size)
        scheduler.step(valid.perplexity)
        record = {
            "epoch": epoch,
            "train_ppl": math.exp(loss_sum / max(seen, 1)),
            "valid_ppl": valid.perplexity,
            "lr": optimizer.param_groups[0]["lr"],
            "seconds": round(time.monotonic() - began, 1),
        }
        history.append(record)
        log(
            f"epoch {epoch}: train ppl {record['train_ppl']:.2f}  valid ppl {valid.perplexity:.2f}"
            f"  lr {record['lr']:.2e}  {record['seconds']:.0f}s"
        )
        if valid.perplexity < best:
            best, stale = valid.perplexity, 0
            save_checkpoint(
                out_dir / BEST_CHECKPOINT,
                model,
                {**payload, "epoch": epoch, "valid_ppl": best, "history": history},
            )
        else:
            stale += 1
        save_checkpoint(
            out_dir / LAST_CHECKPOINT,
            model,
            {
                **payload,
                "epoch": epoch,
                "best": best,
                "stale": stale,
                "history": history,
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "rng": rng.bit_generator.state,
                "torch_rng": torch.get_rng_state(),
            },
        )
        if stale >= cfg.patience:
            log(f"early stop: no validation improvement for {stale} epochs")
            break
        if time.monotonic() > deadline:
            log("stopped at the time limit")
            break
    best_model, _ = load_checkpoint(out_dir / BEST_CHECKPOINT)
    model.load_state_dict(best_model.state_dict())
    model.eval()
    return evaluate(model, valid_sentences, cfg.batch_size)
