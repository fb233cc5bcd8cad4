"""`lmserve train-rnn` (alias `train-neural`): train a neural LM on a text corpus and checkpoint
the best model: a recurrent one (`--cell rnn|lstm|gru`), a feed-forward (Bengio) one over a
fixed window of `--order - 1` previous tokens (`--cell ffnn`), or a decoder-only transformer
(`--cell transformer`: a Hugging Face GPT-2 or Llama of `--layers`, `--hidden-size`, `--heads`;
see transformer.py).

The output folder holds `checkpoint-best.pt` (model, vocabulary, tokenizer, configs, history) and
`checkpoint-last.pt` (for `--resume`); `lmserve export-rnn` turns a checkpoint into a model folder,
and `--export MODEL_DIR` does that at the end of training.

Tokenizers: `word` (the default), `char` (one token per character) and `bpe` (Hugging Face
`tokenizers`, trained here on the training text). Character and BPE perplexities are reported per
word, as the word tokenizer counts words, plus one `</s>` a line, so all three compare.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from lmserve.export.cli_types import existing_file, regex
from lmserve.export.trainers.flag_errors import (
    DEFAULT_FFNN_ORDER,
    DEFAULT_HEADS,
    DEFAULT_MAX_POSITIONS,
    MIN_VOCAB_SIZE,
    architecture_problem,
    flag_messages,
)

if TYPE_CHECKING:
    import numpy as np

    from lmserve.export.rnn.nets import NeuralLM
    from lmserve.export.trainers.loop import BatchStep, Scorer
    from lmserve.export.trainers.transformer import TransformerLM
    from lmserve.server.text.bpe import BpeCodec
    from lmserve.server.text.char import CharCodec

HELP = (
    "Train an RNN/LSTM/GRU, feed-forward (ffnn) or transformer language model on a text corpus "
    "(one sentence per line)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("corpus", type=existing_file, help="training text, one sentence per line")
    parser.add_argument("output_dir", type=Path, help="folder for checkpoints and the report")
    parser.add_argument("--heldout", type=existing_file, required=True, help="validation text")
    parser.add_argument(
        "--test", type=existing_file, help="test text, evaluated with the best model"
    )
    arch = parser.add_argument_group("architecture")
    arch.add_argument(
        "--cell", choices=["rnn", "lstm", "gru", "ffnn", "transformer"], default="lstm"
    )
    arch.add_argument(
        "--order",
        type=int,
        help=f"ffnn only: n-gram order, the window is order - 1 tokens "
        f"(default {DEFAULT_FFNN_ORDER})",
    )
    arch.add_argument(
        "--embedding-size", type=int, help="default: --hidden-size (a transformer's only width)"
    )
    arch.add_argument("--hidden-size", type=int, default=512)
    arch.add_argument("--layers", type=int, default=1)
    arch.add_argument("--dropout", type=float, default=0.3)
    arch.add_argument(
        "--tie-weights",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="share the embedding and decoder matrices (needs equal sizes)",
    )
    arch.add_argument(
        "--heads", type=int, help=f"transformer only: attention heads (default {DEFAULT_HEADS})"
    )
    arch.add_argument(
        "--max-positions",
        type=int,
        help=f"transformer only: the longest sentence, <s> included (default "
        f"{DEFAULT_MAX_POSITIONS})",
    )
    arch.add_argument(
        "--family",
        choices=["gpt2", "llama"],
        help="transformer only: GPT-2 (learned positions, dropout everywhere; the default) or "
        "Llama (RoPE, RMSNorm, SwiGLU; attention dropout only)",
    )
    tok = parser.add_argument_group("tokenizer")
    tok.add_argument(
        "--tokenizer",
        choices=["word", "char", "bpe"],
        default="word",
        help="word-level, character-level, or BPE subwords",
    )
    tok.add_argument(
        "--bpe-vocab-size", type=int, default=8000, help="BPE vocabulary (specials included)"
    )
    tok.add_argument("--lowercase", action="store_true")
    tok.add_argument("--token-pattern", type=regex, help="words are the matches of this regex")
    tok.add_argument(
        "--min-count",
        type=int,
        default=1,
        help="rarer words (characters; BPE: merge pairs) become <unk> (are not merged)",
    )
    tok.add_argument(
        "--vocab-size", type=int, help="keep only the most frequent words (characters)"
    )
    opt = parser.add_argument_group("training")
    opt.add_argument("--epochs", type=int, default=20)
    opt.add_argument("--batch-size", type=int, default=64, help="sentences per batch")
    opt.add_argument("--bptt", type=int, default=100, help="truncated BPTT window (tokens)")
    opt.add_argument("--optimizer", choices=["adam", "adamw", "sgd"], default="adam")
    opt.add_argument("--lr", type=float, default=2e-3)
    opt.add_argument("--weight-decay", type=float, default=0.0)
    opt.add_argument("--clip", type=float, default=0.25, help="gradient-norm clip")
    opt.add_argument("--lr-decay", type=float, default=0.5, help="factor on plateau")
    opt.add_argument(
        "--warmup-steps", type=int, default=0, help="batches over which the rate rises from 0"
    )
    opt.add_argument(
        "--lr-schedule",
        choices=["plateau", "cosine"],
        default="plateau",
        help="after warm-up: constant, or half a cosine to 0 by --epochs (or --max-minutes, "
        "whichever comes first); halved on a plateau either way",
    )
    opt.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default="fp32",
        help="transformer only: bf16 trains under CPU bfloat16 autocast (evaluation is fp32)",
    )
    opt.add_argument("--patience", type=int, default=3, help="epochs without improvement")
    opt.add_argument("--seed", type=int, default=1)
    opt.add_argument("--max-minutes", type=float, help="stop training after this long")
    opt.add_argument("--threads", type=int, help="torch intra-op threads")
    opt.add_argument("--resume", action="store_true", help="continue from checkpoint-last.pt")
    opt.add_argument("--no-progress", action="store_true", help="no progress bar")
    out = parser.add_argument_group("export")
    out.add_argument("--export", type=Path, metavar="MODEL_DIR", help="export the best model here")
    out.add_argument("--export-format", choices=["onnx", "torchscript"], default="onnx")
    out.add_argument("--name", help="model name in the manifest (default: MODEL_DIR's name)")


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from lmserve.export.rnn.data import (
        build_word_vocab,
        count_words,
        encode_sentences,
        split_encoded,
    )
    from lmserve.export.rnn.model import RecurrentLMConfig
    from lmserve.export.rnn.nets import build_model
    from lmserve.export.trainers import transformer
    from lmserve.export.trainers.loop import TrainConfig, train
    from lmserve.server.manifest import TokenizerKind, TokenizerSpec
    from lmserve.server.text.bpe import BpeCodec
    from lmserve.server.text.word import WordTokenizer

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    width = args.hidden_size if args.embedding_size is None else args.embedding_size

    def architecture(vocab_size: int) -> RecurrentLMConfig | transformer.TransformerLMConfig:
        if args.cell == "transformer":
            return transformer.TransformerLMConfig(
                vocab_size=vocab_size,
                family=args.family or "gpt2",
                hidden_size=args.hidden_size,
                num_layers=args.layers,
                heads=args.heads or DEFAULT_HEADS,
                dropout=args.dropout,
                max_positions=args.max_positions or DEFAULT_MAX_POSITIONS,
                tie_weights=args.tie_weights,
            )
        return RecurrentLMConfig(
            vocab_size=vocab_size,
            cell=args.cell,
            embedding_size=width,
            hidden_size=args.hidden_size,
            num_layers=args.layers,
            dropout=args.dropout,
            tie_weights=args.tie_weights,
            order=(args.order or DEFAULT_FFNN_ORDER) if args.cell == "ffnn" else args.order,
        )

    # Every flag is checked before the corpus is read, not after: the architecture with a
    # stand-in vocabulary size, and the training settings.
    problem = architecture_problem(args)
    if problem is not None:
        log(f"lmserve train-rnn: {problem}")
        return 2
    try:
        architecture(MIN_VOCAB_SIZE)
        train_cfg = TrainConfig(
            epochs=args.epochs,
            batch_size=args.batch_size,
            bptt=args.bptt,
            optimizer=args.optimizer,
            lr=args.lr,
            weight_decay=args.weight_decay,
            clip=args.clip,
            lr_decay=args.lr_decay,
            patience=args.patience,
            seed=args.seed,
            max_minutes=args.max_minutes,
            threads=args.threads,
            warmup_steps=args.warmup_steps,
            lr_schedule=args.lr_schedule,
            precision=args.precision,
        )
    except ValidationError as exc:
        for line in flag_messages(exc):
            log(f"lmserve train-rnn: {line}")
        return 2

    kind = {"word": TokenizerKind.WORD, "char": TokenizerKind.CHARACTER, "bpe": TokenizerKind.BPE}[
        args.tokenizer
    ]
    spec = TokenizerSpec(kind=kind, lowercase=args.lowercase, pattern=args.token_pattern)
    tokenizer = WordTokenizer(lowercase=spec.lowercase, pattern=spec.pattern)

    def read(path: Path) -> list[list[str]]:
        with path.open(encoding="utf-8") as f:
            return [tokenizer.split(line) for line in f]

    def lines(path: Path) -> list[str]:
        with path.open(encoding="utf-8") as f:
            return list(f)

    if args.export is not None:
        from lmserve.export.served_folder import check_writable

        try:  # before hours of training, not after
            check_writable(args.export)
        except FileExistsError as exc:
            log(f"lmserve train-rnn: --export: {exc}")
            return 2
    began = time.monotonic()
    subword = None
    if args.tokenizer == "word":
        train_words = read(args.corpus)
        vocab = build_word_vocab(train_words, min_count=args.min_count, max_size=args.vocab_size)
        index = {w: i for i, w in enumerate(vocab)}

        def encode(path: Path) -> list[np.ndarray]:
            return encode_sentences(read(path), index)

        train_ids = encode_sentences(train_words, index)
    else:
        subword = _train_subword_codec(args, lines(args.corpus))
        vocab = list(subword.vocab.words)

        def encode(path: Path) -> list[np.ndarray]:
            assert subword is not None
            return split_encoded(subword.encode_texts(lines(path)))

        train_ids = encode(args.corpus)
    if len(vocab) < MIN_VOCAB_SIZE:
        log(
            f"lmserve train-rnn: the vocabulary has {len(vocab)} entries (specials included); "
            f"a model needs at least {MIN_VOCAB_SIZE}: a larger corpus, or a larger --vocab-size"
        )
        return 2
    model_cfg = architecture(len(vocab))
    valid_ids = encode(args.heldout)
    test_ids = encode(args.test) if args.test else []
    log(f"vocabulary {len(vocab)} (specials included), {len(train_ids)} training sentences")
    if isinstance(model_cfg, transformer.TransformerLMConfig):
        problem = _too_long(model_cfg.max_positions, train_ids, valid_ids, test_ids)
        if problem is not None:
            log(f"lmserve train-rnn: {problem}")
            return 2
    import torch

    torch.manual_seed(train_cfg.seed)
    model: NeuralLM | TransformerLM
    if isinstance(model_cfg, transformer.TransformerLMConfig):
        model = transformer.TransformerLM(model_cfg)
    else:
        model = build_model(model_cfg)
    step, scorer = _step_and_scorer(model)
    log(f"{sum(p.numel() for p in model.parameters())} parameters")
    extra: dict[str, object] = {
        "vocab": vocab,
        "tokenizer": spec.model_dump(mode="json"),
        "training_corpus": str(args.corpus),
        # shlex: a --token-pattern must come back quoted for the command to be reproducible.
        "command": command_line(args),
        # Converts the per-token validation perplexity into the per-word one (export-rnn).
        "valid_counts": {
            "tokens": sum(len(s) + 1 for s in valid_ids),
            "words": count_words(lines(args.heldout), spec),
        },
    }
    if args.cell == "transformer":
        # The few sentences an export's parity check reads (export-rnn has no corpus).
        extra["sample_ids"] = transformer.sample_ids(valid_ids)
    if isinstance(subword, BpeCodec):
        extra["tokenizer_json"] = subword.to_json()
    valid = train(
        model,
        train_cfg,
        train_ids,
        valid_ids,
        args.output_dir,
        extra=extra,
        resume=args.resume,
        log=log,
        progress=not args.no_progress,
        step=step,
        scorer=scorer,
    )
    report: dict[str, float | int | str] = {
        "valid_perplexity": valid.perplexity,
        "valid_tokens": valid.tokens,
        "train_minutes": round((time.monotonic() - began) / 60, 1),
    }
    if subword is not None:
        # Per word (natural log, one </s> a line); the per-token figure is kept beside it.
        words = count_words(lines(args.heldout), spec)
        report.update(
            valid_perplexity=math.exp(-valid.log_prob / words),
            valid_token_perplexity=valid.perplexity,
            valid_words=words,
        )
    if args.test:
        test = scorer(model, test_ids, train_cfg.batch_size)
        report.update(test_perplexity=test.perplexity, test_tokens=test.tokens)
        if subword is not None:
            words = count_words(lines(args.test), spec)
            report.update(
                test_perplexity=math.exp(-test.log_prob / words),
                test_token_perplexity=test.perplexity,
                test_words=words,
            )
    (args.output_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    if args.export:
        return _export(args, log)
    return 0


def _step_and_scorer(model: NeuralLM | TransformerLM) -> tuple[BatchStep, Scorer]:
    """The batch step and the scorer train.train runs for this model."""
    from lmserve.export.trainers import recurrent, transformer

    if isinstance(model, transformer.TransformerLM):
        return transformer.train_batch, transformer.evaluate
    return recurrent.train_batch, recurrent.evaluate


def _too_long(max_positions: int, *splits: list[np.ndarray]) -> str | None:
    """What to change when a sentence (with its `<s>`) is longer than the transformer's
    positions: said before training, not at the test set after it."""
    longest = max((len(s) + 1 for split in splits for s in split), default=0)
    if longest <= max_positions:
        return None
    return (
        f"the longest sentence has {longest} tokens with its <s>, more than --max-positions "
        f"{max_positions}: raise --max-positions to at least {longest}"
    )


def command_line(args: argparse.Namespace) -> str:
    """`lmserve ...` as this run was called: the arguments `lmserve.server.cli.main` parsed
    (`args.argv`, so an in-process call records its own), else the process's."""
    argv = getattr(args, "argv", None)
    if argv is None:
        argv = sys.argv[1:]
    return "lmserve " + shlex.join(argv)


def _train_subword_codec(args: argparse.Namespace, texts: list[str]) -> CharCodec | BpeCodec:
    from lmserve.server.text.bpe import BpeCodec
    from lmserve.server.text.char import CharCodec

    options = {"lowercase": args.lowercase, "pattern": args.token_pattern}
    if args.tokenizer == "char":
        return CharCodec.train(texts, min_count=args.min_count, max_size=args.vocab_size, **options)
    return BpeCodec.train(
        texts, vocab_size=args.bpe_vocab_size, min_frequency=args.min_count, **options
    )


def _export(args: argparse.Namespace, log: Callable[[str], None]) -> int:
    """Exports checkpoint-best.pt as `lmserve export-rnn` would, its metrics from report.json."""
    from lmserve.export.parity import ParityError
    from lmserve.export.rnn.folder import CheckpointError, load_checkpoint, write_model_folder
    from lmserve.export.trainers.export_command import measured_metrics
    from lmserve.export.trainers.loop import BEST_CHECKPOINT

    if args.cell == "transformer":
        return _export_transformer(args, log)
    try:
        checkpoint = load_checkpoint(args.output_dir / BEST_CHECKPOINT)
        result = write_model_folder(
            checkpoint,
            args.export,
            fmt=args.export_format,
            name=args.name,
            metrics=measured_metrics(checkpoint, log=log),
            log=log,
        )
    except (CheckpointError, ParityError, FileExistsError, ValueError) as exc:
        # The checkpoint is kept: `lmserve export-rnn` can be retried on it.
        log(f"lmserve train-rnn: export failed: {exc}")
        return 1
    log(
        f"exported {args.export_format} to {result.folder} (parity max |diff| "
        f"{result.parity.max_abs_diff:.1e})"
    )
    return 0


def _export_transformer(args: argparse.Namespace, log: Callable[[str], None]) -> int:
    """checkpoint-best.pt -> an ONNX model folder with past key values (transformer_folder)."""
    from lmserve.export.trainers import transformer
    from lmserve.export.trainers.export_command import measured_metrics
    from lmserve.export.trainers.loop import BEST_CHECKPOINT
    from lmserve.export.trainers.transformer_folder import export_model_folder

    try:
        checkpoint = transformer.load_checkpoint(args.output_dir / BEST_CHECKPOINT)
        parity = export_model_folder(
            checkpoint,
            args.export,
            name=args.name,
            metrics=measured_metrics(checkpoint, log=log),
            log=log,
        )
    except (ImportError, FileExistsError, ValueError) as exc:
        # The checkpoint (and hf/, its Hugging Face form) is kept: export-rnn can retry it.
        log(f"lmserve train-rnn: export failed: {exc}")
        return 1
    log(f"exported onnx to {args.export} ({parity})")
    return 0
