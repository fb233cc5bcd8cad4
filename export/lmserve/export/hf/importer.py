"""A checkpoint folder -> a served transformer folder, parity-checked (`lmserve import-hf`).

    parity = export_checkpoint(Path("my-gpt2"), Path("models/my-gpt2"))

Refused (`lmserve.export.parity.ParityError`) when the graph is more than PARITY_NATS a token
from transformers.
"""

from __future__ import annotations

import datetime
from pathlib import Path

from lmserve.export.hf.checkpoint import Checkpoint, read_checkpoint
from lmserve.export.hf.folder import write_transformer_folder
from lmserve.export.hf.parity import Parity
from lmserve.export.quantize import Quantize
from lmserve.server.manifest import Provenance

__all__ = ["export_checkpoint", "sample_ids"]

SAMPLE_TEXTS = (
    "In the beginning God created the heaven and the earth.",
    "And the earth was without form, and void.",
    "Let there be light",
)


def sample_ids(checkpoint: Checkpoint, texts: tuple[str, ...] = SAMPLE_TEXTS) -> list[list[int]]:
    """The sample texts in the checkpoint's own tokens (through its tokenizer.json), cut to
    the model's positions."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(checkpoint.tokenizer_file))
    limit = checkpoint.cache.max_positions
    encoded = [tokenizer.encode(text).ids[:limit] for text in texts]
    return [ids for ids in encoded if ids]


def export_checkpoint(
    folder: Path,
    out: Path,
    *,
    name: str | None = None,
    overwrite: bool = False,
    quantize: Quantize | None = None,
    optimize: bool = True,
    shared_cache: bool = True,
) -> Parity:
    """Import the checkpoint in `folder` as the model folder `out` (`overwrite` replaces a
    model folder there; `quantize`: int8 graphs, `lmserve.export.quantize`; `optimize`: ONNX
    Runtime's fusions first, `lmserve.export.hf.optimize`); the parity the float graph passed,
    after its fusions. `shared_cache`: GPT-2 and Llama as the shared-buffer graph
    (`lmserve.export.hf.fused_graph`), optimum's layout when False."""
    from transformers import AutoModelForCausalLM

    checkpoint = read_checkpoint(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    provenance = Provenance(
        source=f"Hugging Face checkpoint {folder.resolve().name} ({checkpoint.architecture})",
        trained_by=f"lmserve import-hf {folder} {out}",
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    )
    return write_transformer_folder(
        model,
        out,
        name=name or out.name,
        sample_ids=sample_ids(checkpoint),
        provenance=provenance,
        description=f"{checkpoint.architecture} imported from a Hugging Face checkpoint",
        tokenizer_json=checkpoint.tokenizer_file,
        overwrite=overwrite,
        quantize=quantize,
        optimize=optimize,
        shared_cache=shared_cache,
    )
