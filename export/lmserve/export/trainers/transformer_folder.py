"""A `--cell transformer` checkpoint -> a served transformer folder (`export-rnn`, and
`train-rnn --export`): through `lmserve.export.hf.folder`, which writes every transformer
folder (staged, parity-checked against transformers' forward, then moved in place).

The Hugging Face checkpoint is saved beside the train-rnn one first (`hf/`), so a failed export
can be redone from it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from lmserve.export.hf.folder import write_transformer_folder
from lmserve.export.hf.parity import Parity
from lmserve.export.quantize import Quantize
from lmserve.export.rnn.data import BOS_ID, EOS_ID, SPECIALS, UNK_ID
from lmserve.export.rnn.folder import trained_provenance
from lmserve.export.served_folder import check_writable
from lmserve.export.trainers.transformer import (
    HF_FOLDER,
    TransformerCheckpoint,
    TransformerLM,
    TransformerLMConfig,
)
from lmserve.server.manifest import SpecialTokensSpec, TokenizerKind


def save_hf_folder(model: TransformerLM, vocab: Sequence[str], folder: Path) -> None:
    """The model as transformers saves it, plus vocab.txt: an export can be redone from it."""
    folder.mkdir(parents=True, exist_ok=True)
    model.net.save_pretrained(folder)
    (folder / "vocab.txt").write_text("".join(f"{w}\n" for w in vocab), encoding="utf-8")


def export_model_folder(
    checkpoint: TransformerCheckpoint,
    model_dir: Path,
    *,
    name: str | None = None,
    description: str = "",
    metrics: dict[str, float] | None = None,
    overwrite: bool = False,
    log: Callable[[str], None] = lambda _: None,
    quantize: Quantize | None = None,
) -> Parity:
    """A checkpoint -> a parity-checked ONNX model folder (lmserve.export.hf.folder, which
    stages it and moves it into place only once it has passed).

    The Hugging Face checkpoint is saved beside the train-rnn one first (`hf/`), so a failed
    export can be redone from it. Word vocabularies only: the served folder lists its words
    as they are.
    """
    model, data, spec = checkpoint.model, checkpoint.data, checkpoint.tokenizer
    if spec.kind != TokenizerKind.WORD:
        raise ValueError(f"a {spec.kind} transformer cannot be exported yet: word models only")
    check_writable(model_dir, overwrite=overwrite)  # never replaces some other folder
    vocab = list(data["vocab"])
    save_hf_folder(model, vocab, checkpoint.path.parent / HF_FOLDER)
    log(f"saved the Hugging Face checkpoint to {checkpoint.path.parent / HF_FOLDER}")
    unk, bos, eos = (SPECIALS[i] for i in (UNK_ID, BOS_ID, EOS_ID))
    parity = write_transformer_folder(
        model.net,
        model_dir,
        name=name or model_dir.name,
        vocab_words=vocab,
        tokenizer=spec,
        special_tokens=SpecialTokensSpec(bos=bos, eos=eos, unk=unk),
        sample_ids=[list(ids) for ids in data.get("sample_ids") or [[BOS_ID, EOS_ID]]],
        provenance=trained_provenance(data, metrics),
        description=description or describe(model.config),
        overwrite=overwrite,
        quantize=quantize,
    )
    log(f"exported the transformer to {model_dir} ({parity})")
    return parity


def describe(cfg: TransformerLMConfig) -> str:
    """The manifest's default description."""
    tied = ", tied" if cfg.tie_weights else ""
    return (
        f"{cfg.num_layers}-layer {cfg.family} transformer (d={cfg.hidden_size}, {cfg.heads} "
        f"heads{tied}, dropout {cfg.dropout}); word-level, trained by lmserve train-rnn"
    )
