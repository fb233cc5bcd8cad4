"""Training loop for neural LMs: truncated BPTT, clipping, plateau decay, early stopping.

Choices follow the PyTorch word-language-model example and Merity et al. (2018): gradient-norm
clipping, the learning rate halved when validation perplexity stops improving, the best
validation model checkpointed, training stopped after `patience` epochs without improvement or
at a time limit. A seed fixes initialisation, dropout and batch order.

The loop is shared by every cell: `train` takes the batch step and the scorer, which each
trainer brings (`recurrent.py` for RNN/LSTM/GRU/FFNN, `transformer.py`), and keeps the
checkpoints, decay and resume. A
transformer also wants a warm-up and a decaying schedule (`warmup_steps`, `lr_schedule`); both
default to off, which leaves the recurrent models' training exactly as it was.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from lmserve.export.rnn.data import Batch, length_bucketed_batches

BEST_CHECKPOINT = "checkpoint-best.pt"
LAST_CHECKPOINT = "checkpoint-last.pt"


class TrainConfig(BaseModel):
    """How to train; recorded in the checkpoint and the manifest's provenance."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    epochs: int = Field(default=20, ge=1)
    batch_size: int = Field(default=64, ge=1)
    bptt: int = Field(default=100, ge=1)
    # adamw: decoupled weight decay (Loshchilov & Hutter), what transformers are trained with.
    optimizer: Literal["adam", "adamw", "sgd"] = "adam"
    lr: float = Field(default=2e-3, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    clip: float = Field(default=0.25, gt=0)
    lr_decay: float = Field(default=0.5, gt=0, le=1)
    patience: int = Field(default=3, ge=1)
    seed: int = 1
    max_minutes: float | None = Field(default=None, gt=0)
    threads: int | None = Field(default=None, ge=1)
    # The learning rate rises linearly over the first `warmup_steps` batches (a transformer's
    # attention diverges at full rate from a random start). `cosine` then follows half a cosine
    # to zero by the end of `epochs`, or of `max_minutes` if that comes first; plateau halving
    # applies on top of either.
    warmup_steps: int = Field(default=0, ge=0)
    lr_schedule: Literal["plateau", "cosine"] = "plateau"
    # bf16: transformer batches run under CPU bfloat16 autocast (weights, optimizer and the
    # loss stay float32), ~1.5x the tokens/s on CPUs with AVX512-BF16; evaluation is float32.
    precision: Literal["fp32", "bf16"] = "fp32"


@dataclass(frozen=True)
class Evaluation:
    """Natural-log totals over a set of sentences, every token plus `</s>` counted."""

    log_prob: float
    tokens: int

    @property
    def perplexity(self) -> float:
        return math.exp(-self.log_prob / self.tokens) if self.tokens else float("nan")


def _make_optimizer(parameters: Iterator[nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "adam":
        return torch.optim.Adam(parameters, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(parameters, lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(parameters, lr=cfg.lr, weight_decay=cfg.weight_decay)


class LrFactor:
    """The warm-up/cosine multiplier on the (plateau-managed) learning rate at each batch.

    Cosine progress is the larger of the batches done over `epochs` and the time used over this
    run's time limit, so a run stopped by `max_minutes` still ends at a low rate.
    """

    def __init__(
        self, cfg: TrainConfig, batches_per_epoch: int, began: float, deadline: float
    ) -> None:
        self.cfg = cfg
        self.total = max(1, cfg.epochs * batches_per_epoch)
        self.began, self.deadline = began, deadline

    @property
    def active(self) -> bool:
        return self.cfg.warmup_steps > 0 or self.cfg.lr_schedule == "cosine"

    def __call__(self, step: int, now: float) -> float:
        warm = self.cfg.warmup_steps
        if step < warm:
            return (step + 1) / warm
        if self.cfg.lr_schedule == "plateau":
            return 1.0
        progress = (step - warm) / max(1, self.total - warm)
        if math.isfinite(self.deadline):
            progress = max(progress, (now - self.began) / (self.deadline - self.began))
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


BatchStep = Callable[[Any, Batch, torch.optim.Optimizer, TrainConfig], float]
Scorer = Callable[[Any, Sequence[np.ndarray], int], Evaluation]


class Trainable(Protocol):
    """What the loop trains and checkpoints: a torch module with its pydantic `config` (any
    trainer's model; the loop needs no import of theirs)."""

    @property
    def config(self) -> BaseModel: ...

    def parameters(self) -> Iterator[nn.Parameter]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state_dict: Any) -> Any: ...
    def train(self, mode: bool = True) -> Any: ...
    def eval(self) -> Any: ...


def save_checkpoint(path: Path, model: Trainable, payload: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(
        {"model_config": model.config.model_dump(), "state_dict": model.state_dict(), **payload},
        tmp,
    )
    tmp.replace(path)


def train(
    model: Trainable,
    cfg: TrainConfig,
    train_sentences: Sequence[np.ndarray],
    valid_sentences: Sequence[np.ndarray],
    out_dir: Path,
    *,
    extra: dict[str, Any] | None = None,
    resume: bool = False,
    log: Callable[[str], None] = print,
    progress: bool = True,
    step: BatchStep,
    scorer: Scorer,
) -> Evaluation:
    """Trains in place, checkpointing the best validation model; returns its validation score.

    `step` trains on one batch and returns its summed loss (nats); `scorer` evaluates sentences
    (each trainer's own: `recurrent.py`, `transformer.py`).
    """
    from tqdm import tqdm

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    optimizer = _make_optimizer(model.parameters(), cfg)
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
    run_began = time.monotonic()
    deadline = run_began + cfg.max_minutes * 60 if cfg.max_minutes else math.inf
    n_train_tokens = sum(len(s) + 1 for s in train_sentences)
    batches_per_epoch = math.ceil(len(train_sentences) / cfg.batch_size)
    lr_factor = LrFactor(cfg, batches_per_epoch, run_began, deadline)
    # The plateau-managed rate; the per-batch factor scales it, and the scheduler sees it alone.
    base_lr = optimizer.param_groups[0]["lr"]
    n_step = (start_epoch - 1) * batches_per_epoch
    for epoch in range(start_epoch, cfg.epochs + 1):
        model.train()
        began, seen, loss_sum = time.monotonic(), 0, 0.0
        bar = tqdm(total=n_train_tokens, desc=f"epoch {epoch}", unit="tok", disable=not progress)
        for batch in length_bucketed_batches(train_sentences, cfg.batch_size, rng):
            if lr_factor.active:
                for group in optimizer.param_groups:
                    group["lr"] = base_lr * lr_factor(n_step, time.monotonic())
            n_step += 1
            loss_sum += step(model, batch, optimizer, cfg)
            seen += batch.tokens
            bar.update(batch.tokens)
            bar.set_postfix(loss=f"{loss_sum / seen:.3f}", ppl=f"{math.exp(loss_sum / seen):.1f}")
            if time.monotonic() > deadline:
                break
        bar.close()
        valid = scorer(model, valid_sentences, cfg.batch_size)
        last_lr = optimizer.param_groups[0]["lr"]
        for group in optimizer.param_groups:
            group["lr"] = base_lr
        scheduler.step(valid.perplexity)
        base_lr = optimizer.param_groups[0]["lr"]
        record = {
            "epoch": epoch,
            "train_ppl": math.exp(loss_sum / max(seen, 1)),
            "valid_ppl": valid.perplexity,
            "lr": optimizer.param_groups[0]["lr"],
            "seconds": round(time.monotonic() - began, 1),
        }
        shaped = ""
        if lr_factor.active:  # `lr` is the plateau rate; this, the rate of the last batch
            record["last_batch_lr"] = last_lr
            shaped = f" (last batch {last_lr:.2e})"
        history.append(record)
        log(
            f"epoch {epoch}: train ppl {record['train_ppl']:.2f}  valid ppl {valid.perplexity:.2f}"
            f"  lr {record['lr']:.2e}{shaped}  {record['seconds']:.0f}s"
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
    kept = torch.load(out_dir / BEST_CHECKPOINT, map_location="cpu", weights_only=True)
    model.load_state_dict(kept["state_dict"])
    model.eval()
    return scorer(model, valid_sentences, cfg.batch_size)
