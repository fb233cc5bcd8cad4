"""A checkpoint folder -> an ONNX graph with past key values beside its tokenizer, parity-checked.

    parity = export_checkpoint(Path("my-gpt2"), Path("out/my-gpt2"))

Refused (ParityError) when the graph is more than PARITY_NATS a token from transformers.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from lmserve.export.hf.checkpoint import Checkpoint, read_checkpoint
from lmserve.export.hf.graph import export_with_past
from lmserve.export.hf.parity import PARITY_NATS, Parity, check_parity

GRAPH = "model.onnx"
SAMPLE_TEXTS = (
    "In the beginning God created the heaven and the earth.",
    "And the earth was without form, and void.",
    "Let there be light",
)


class ParityError(ValueError):
    """The exported graph disagrees with transformers' forward beyond PARITY_NATS."""


def sample_ids(checkpoint: Checkpoint, texts: tuple[str, ...] = SAMPLE_TEXTS) -> list[list[int]]:
    """The sample texts in the checkpoint's own tokens (through its tokenizer.json)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(checkpoint.tokenizer_file))
    encoded = [tokenizer.encode(text).ids for text in texts]
    return [ids for ids in encoded if ids]


def export_checkpoint(folder: Path, out: Path) -> Parity:
    """Export the checkpoint in `folder` into `out`; the parity figures it passed."""
    import onnxruntime as ort  # type: ignore[import-untyped,unused-ignore]
    from transformers import AutoModelForCausalLM

    checkpoint = read_checkpoint(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    out.mkdir(parents=True, exist_ok=True)
    graph = out / GRAPH
    export_with_past(model, checkpoint.cache, graph)
    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    parity = check_parity(model, session, checkpoint.cache, sample_ids(checkpoint))
    if parity.worst > PARITY_NATS:
        graph.unlink()
        raise ParityError(
            f"{folder}: the exported graph is {parity.worst:.2e} nats a token from transformers' "
            f"forward (allowed {PARITY_NATS:g}): {parity}"
        )
    for name in ("tokenizer.json", "config.json"):
        shutil.copyfile(folder / name, out / name)
    return parity
