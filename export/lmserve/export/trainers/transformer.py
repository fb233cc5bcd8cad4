"""The decoder-only transformer `lmserve train-neural --cell transformer` trains.

A Hugging Face causal LM built from a config (nothing is downloaded): GPT-2 (learned positions,
dropout on embeddings, attention and residuals) or Llama (RoPE, RMSNorm, SwiGLU; attention
dropout only), with the embedding tied to the output layer by default. It is trained on the
recurrent models' batches (data.py): right-padded `<s> w1 .. wn` -> `w1 .. wn </s>`, every
sentence from its own `<s>`, so its perplexities compare with theirs token for token. The
loop, checkpoints, decay and resume are loop.py's; this module brings the model, the batch
step, the scorer and the checkpoint read back (`transformer_folder.py` exports it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import Tensor, nn

from lmserve.export.rnn.data import (
    BOS_ID,
    EOS_ID,
    IGNORE_INDEX,
    Batch,
    length_bucketed_batches,
)
from lmserve.export.trainers.loop import Evaluation, TrainConfig

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel

    from lmserve.server.manifest import TokenizerSpec

Family = Literal["gpt2", "llama"]
HF_FOLDER = "hf"  # the Hugging Face checkpoint beside the train-rnn checkpoints
SAMPLE_SENTENCES = 4  # validation sentences the export's parity check reads


class TransformerLMConfig(BaseModel):
    """The architecture; stored in checkpoints (as `model_config`, cell `transformer`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vocab_size: int = Field(gt=3)
    cell: Literal["transformer"] = "transformer"
    family: Family = "gpt2"
    hidden_size: int = Field(default=256, gt=0)
    num_layers: int = Field(default=4, ge=1)
    heads: int = Field(default=4, ge=1)
    dropout: float = Field(default=0.1, ge=0.0, lt=1.0)
    # Learned positions (GPT-2) end here; no sentence, with its <s>, may be longer.
    max_positions: int = Field(default=256, ge=2)
    tie_weights: bool = True

    @model_validator(mode="after")
    def _heads_divide_width(self) -> TransformerLMConfig:
        if self.hidden_size % self.heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of heads")
        if self.family == "llama" and (self.hidden_size // self.heads) % 2:
            raise ValueError("llama's rotary positions need an even head size (hidden / heads)")
        return self


def hf_config(cfg: TransformerLMConfig) -> PretrainedConfig:
    """The transformers config: the vocabulary's own specials, a 4x (GPT-2) or ~8/3x SwiGLU
    (Llama, so both have about the same parameters) feed-forward width."""
    from transformers import GPT2Config, LlamaConfig

    ids: dict[str, Any] = {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": EOS_ID}
    if cfg.family == "gpt2":
        return GPT2Config(
            vocab_size=cfg.vocab_size,
            n_positions=cfg.max_positions,
            n_embd=cfg.hidden_size,
            n_layer=cfg.num_layers,
            n_head=cfg.heads,
            resid_pdrop=cfg.dropout,
            embd_pdrop=cfg.dropout,
            attn_pdrop=cfg.dropout,
            tie_word_embeddings=cfg.tie_weights,
            **ids,
        )
    return LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=-(-cfg.hidden_size * 8 // 3 // 32) * 32,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.heads,
        max_position_embeddings=cfg.max_positions,
        attention_dropout=cfg.dropout,
        tie_word_embeddings=cfg.tie_weights,
        **ids,
    )


class TransformerLM(nn.Module):
    """The Hugging Face model (`net`) with the pydantic `config` train.py checkpoints."""

    def __init__(self, config: TransformerLMConfig) -> None:
        super().__init__()
        from transformers import AutoModelForCausalLM

        self.config = config
        self.net: PreTrainedModel = AutoModelForCausalLM.from_config(hf_config(config))

    def forward(self, inputs: Tensor, attention_mask: Tensor) -> Tensor:
        """tokens [batch, time] (right-padded; mask 1 on real ones) -> logits [b, t, vocab]."""
        out = self.net(input_ids=inputs, attention_mask=attention_mask, use_cache=False)
        logits: Tensor = out.logits
        return logits


def _mask(batch: Batch) -> Tensor:
    # Input t is real exactly where target t is (`<s> w1..wn` against `w1..wn </s>`).
    return (batch.targets != IGNORE_INDEX).long()


def train_batch(
    model: TransformerLM, batch: Batch, optimizer: torch.optim.Optimizer, cfg: TrainConfig
) -> float:
    """One optimizer step on the batch's mean token loss; returns the summed loss (nats)."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.precision == "bf16"):
        logits = model(batch.inputs, _mask(batch))
    loss = nn.functional.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]),
        batch.targets.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )
    optimizer.zero_grad(set_to_none=True)
    (loss / batch.tokens).backward()
    nn.utils.clip_grad_norm_(model.parameters(), cfg.clip)
    optimizer.step()
    return float(loss.detach())


@torch.no_grad()
def evaluate(
    model: TransformerLM, sentences: Sequence[np.ndarray], batch_size: int = 64
) -> Evaluation:
    """Sum of log p(target) (float32, natural log) over every sentence, each from its `<s>`,
    `</s>` counted: train.evaluate's conventions. Refused (ValueError) for a sentence longer
    than the positions, which would otherwise fail deep inside the model."""
    if n := too_long(sentences, model.config.max_positions):
        raise ValueError(
            f"{n} sentences are longer than the model's {model.config.max_positions} positions "
            "(with their <s>)"
        )
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for batch in length_bucketed_batches(sentences, batch_size, rng=None):
        log_probs = torch.log_softmax(model(batch.inputs, _mask(batch)).float(), dim=-1)
        mask = batch.targets != IGNORE_INDEX
        picked = log_probs.gather(-1, batch.targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        total += float(picked[mask].double().sum())
        count += int(mask.sum())
    model.train(was_training)
    return Evaluation(total, count)


def too_long(sentences: Sequence[np.ndarray], max_positions: int) -> int:
    """How many sentences do not fit the positions with their `<s>` (learned positions have
    nothing past the last)."""
    return sum(1 for s in sentences if len(s) + 1 > max_positions)


@dataclass(frozen=True)
class TransformerCheckpoint:
    """A train-rnn transformer checkpoint: the model (in eval mode) and everything else."""

    path: Path
    model: TransformerLM
    data: dict[str, Any]

    @property
    def tokenizer(self) -> TokenizerSpec:
        from lmserve.server.manifest import TokenizerSpec

        return TokenizerSpec.model_validate(self.data["tokenizer"])


def is_transformer_checkpoint(path: Path) -> bool:
    """Whether `path` is a readable checkpoint of `--cell transformer` (else leave it to the
    recurrent loader and its error messages)."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # unreadable: folder.load_checkpoint says why
        return False
    config = data.get("model_config") if isinstance(data, dict) else None
    return isinstance(config, dict) and config.get("cell") == "transformer"


def load_checkpoint(path: Path) -> TransformerCheckpoint:
    data: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    model = TransformerLM(TransformerLMConfig(**data["model_config"]))
    model.load_state_dict(data["state_dict"])
    model.eval()
    return TransformerCheckpoint(path, model, data)


def sample_ids(sentences: Sequence[np.ndarray]) -> list[list[int]]:
    """A few sentences as the export's parity check reads them, from `<s>`."""
    return [[BOS_ID, *map(int, s)] for s in sentences[:SAMPLE_SENTENCES] if len(s)]
