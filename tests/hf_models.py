"""Tiny Hugging Face causal LMs built from configs with seeded random weights (nothing is
downloaded): a GPT-2 (learned positions) and a Llama (RoPE, RMSNorm, grouped-query attention),
each with a byte-level BPE tokenizer trained here, saved as transformers checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

VOCAB = 300
POSITIONS = 64
CORPUS = [
    "In the beginning God created the heaven and the earth.",
    "And the earth was without form, and void; and darkness was upon the face of the deep.",
    "And God said, Let there be light: and there was light.",
    "And God saw the light, that it was good: and God divided the light from the darkness.",
]
# GPT-2 uses one token to start and end a text; Llama has its own <s> and </s>.
SPECIALS = {"gpt2": ["<|endoftext|>"], "llama": ["<unk>", "<s>", "</s>"]}


def byte_level_tokenizer(specials: list[str]) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=specials,
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    return tokenizer


def gpt2() -> Any:
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=POSITIONS,
        n_embd=32,
        n_layer=2,
        n_head=4,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(config)


def llama() -> Any:
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention
        max_position_embeddings=POSITIONS,
        bos_token_id=1,
        eos_token_id=2,
    )
    return LlamaForCausalLM(config)


BUILDERS = {"gpt2": gpt2, "llama": llama}


def checkpoint(folder: Path, build: str, seed: int = 0) -> Path:
    """A checkpoint folder: config.json, model.safetensors, tokenizer.json."""
    torch.manual_seed(seed)
    BUILDERS[build]().save_pretrained(folder)
    byte_level_tokenizer(SPECIALS[build]).save(str(folder / "tokenizer.json"))
    return folder


def load(folder: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
