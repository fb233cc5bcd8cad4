"""Writes a brought model's folder: checked, then moved into place whole.

    export_module(module, "models/my-lstm", vocab=words, contract=contract)   # a torch module
    import_onnx("lm.onnx", "models/my-gru", vocab="vocab.txt", contract=contract)
    import_torchscript("lm.pt", "models/my-lm", vocab="vocab.txt", contract=contract)

Each checks the model's contract (`checks.check_contract`), writes the served graphs, checks them
against the model's own log-probabilities (`checks.check_parity`, within
`lmserve.export.parity.PARITY_NATS`), and only then renames the staged folder into place
(`lmserve.export.served_folder`); the manifest records where the model came from and the
parity figures (GetModel's `provenance.source` and `provenance.parity`).
"""

from __future__ import annotations

import datetime as dt
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypedDict, Unpack

import numpy as np

from lmserve.export.custom.checks import (
    ParityFigures,
    Reference,
    ServedModel,
    TeamModel,
    check_contract,
    check_parity,
)
from lmserve.export.custom.contract import ContractError, ModelContract
from lmserve.export.custom.vocabulary import BroughtVocabulary, TokenizerName, read_vocabulary
from lmserve.export.quantize import TORCHSCRIPT_NOT_QUANTIZED, Quantize
from lmserve.export.served_folder import Files, check_writable, write_served_folder
from lmserve.server.manifest import (
    FileEntry,
    ModelFormat,
    ModelKind,
    ModelManifest,
    Provenance,
    sha256_of,
)

Cell = Literal["rnn", "lstm", "gru", "ffnn"]
Format = Literal["onnx", "torchscript"]
# The random texts and states the contract checks read: the same for every import.
CHECK_SEED = 0


@dataclass(frozen=True)
class BroughtModel:
    """What was written: the folder, its manifest and the parity figures."""

    folder: Path
    manifest: ModelManifest
    parity: ParityFigures


@dataclass(frozen=True)
class FolderRequest:
    """Where and how to write (what every way in shares)."""

    model_dir: Path
    name: str | None = None
    kind: Cell = "rnn"
    description: str = ""
    source: str = ""
    created_by: str = ""
    overwrite: bool = False
    quantize: Quantize | None = None


def write_brought_folder(
    request: FolderRequest,
    team: TeamModel,
    contract: ModelContract,
    vocabulary: BroughtVocabulary,
    fmt: Format,
    write_graphs: Callable[[Path], dict[str, str]],
) -> BroughtModel:
    """Checks the contract, then writes the folder (`write_served_folder`): the vocabulary and
    the graphs (`write_graphs(staging)`), parity with the team's model, the manifest."""
    if request.quantize is not None and fmt != "onnx":
        raise ContractError("quantize", TORCHSCRIPT_NOT_QUANTIZED)
    vocab = vocabulary.vocab
    reference = Reference(team, contract, len(vocab), vocab.bos_id)
    rng = np.random.default_rng(CHECK_SEED)
    chunk_carry = check_contract(reference, rng)
    model_dir = request.model_dir
    check_writable(model_dir, overwrite=request.overwrite)

    def write(staging: Path) -> Files:
        files = vocabulary.write(staging)
        files.update(write_graphs(staging))
        return files

    def check(staging: Path) -> ParityFigures:
        return check_parity(reference, ServedModel(staging, contract, fmt), rng, chunk_carry)

    def manifest(staging: Path, files: Files, parity: ParityFigures) -> ModelManifest:
        return ModelManifest(
            name=request.name or model_dir.name,
            kind=ModelKind(request.kind),
            format=ModelFormat(fmt),
            description=request.description,
            files={key: FileEntry(path=path) for key, path in files.items()},
            tokenizer=vocabulary.tokenizer,
            special_tokens=vocabulary.specials,
            architecture=architecture(contract, request.kind, len(vocab), fmt),
            provenance=Provenance(
                trained_by=request.created_by or None,
                created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                source=request.source or None,
                parity=parity.as_provenance(),
            ),
        )

    written = write_served_folder(
        model_dir,
        write=write,
        check=check,
        manifest=manifest,
        overwrite=request.overwrite,
        quantize=request.quantize,
    )
    return BroughtModel(written.folder, written.manifest, written.parity)


def architecture(contract: ModelContract, cell: str, vocab_size: int, fmt: str) -> dict[str, Any]:
    """The manifest's block: served states (batch on axis 1) and the team's own layout."""
    states = [
        {
            "name": s.name,
            "shape": s.served_shape(),
            "dtype": s.dtype,
            "initial": s.start,
            "team_shape": list(s.shape),
        }
        for s in contract.states
    ]
    names = contract.state_names
    arch: dict[str, Any] = {
        "cell": cell,
        "vocab_size": vocab_size,
        "states": states,
        "scores": contract.scores,
        "normalized_by_server_graph": contract.scores == "logits" or contract.normalize,
    }
    if fmt == "onnx":
        arch |= {
            "step_inputs": ["tokens", *names],
            "step_outputs": ["log_probs", *[f"{n}_out" for n in names]],
            "score_inputs": ["tokens", "targets", *names],
            "score_outputs": ["token_log_probs", *[f"{n}_out" for n in names]],
        }
    else:
        arch |= {"methods": ["step(tokens, *states)", "score(tokens, targets, *states)"]}
    return arch


class FolderOptions(TypedDict, total=False):
    """What every way in takes beside the model and its contract: `kind` (rnn, lstm, gru, ffnn:
    the family GetModel reports), `name` (default: the folder's), `description`, how texts
    become tokens (`tokenizer` word or character, `lowercase`, `pattern`), the model's special
    tokens (`bos`, `eos`, `unk`; default `<s>`, `</s>`, `<unk>`), and `overwrite` (replace a
    model folder), and `quantize` ("int8" or a `lmserve.export.quantize.Quantize` naming its
    bound and held-out text: int8 ONNX graphs, their measured cost in the manifest; ONNX only)."""

    kind: Cell
    name: str | None
    description: str
    tokenizer: TokenizerName
    lowercase: bool
    pattern: str | None
    bos: str
    eos: str
    unk: str
    overwrite: bool
    quantize: Quantize | Literal["int8"] | None


def _vocabulary(vocab: Sequence[str] | str | Path, options: FolderOptions) -> BroughtVocabulary:
    return read_vocabulary(
        vocab,
        tokenizer=options.get("tokenizer", "word"),
        lowercase=options.get("lowercase", False),
        pattern=options.get("pattern"),
        bos=options.get("bos", "<s>"),
        eos=options.get("eos", "</s>"),
        unk=options.get("unk", "<unk>"),
    )


def _request(
    model_dir: str | Path, options: FolderOptions, source: str, created_by: str
) -> FolderRequest:
    return FolderRequest(
        Path(model_dir),
        name=options.get("name"),
        kind=options.get("kind", "rnn"),
        description=options.get("description", ""),
        source=source,
        created_by=created_by,
        overwrite=options.get("overwrite", False),
        quantize=_quantize(options.get("quantize")),
    )


def _quantize(value: Quantize | str | None) -> Quantize | None:
    if value is None or isinstance(value, Quantize):
        return value
    if value != "int8":
        raise ContractError("quantize", f"quantize={value!r}: only 'int8' is offered")
    return Quantize()


def _command_line() -> str:
    return " ".join(["lmserve", *sys.argv[1:]]) if sys.argv else "lmserve"


def export_module(
    module: Any,
    model_dir: str | Path,
    *,
    vocab: Sequence[str] | str | Path,
    contract: ModelContract,
    format: Format = "onnx",
    opset: int = 17,
    **options: Unpack[FolderOptions],
) -> BroughtModel:
    """Writes a model folder the server serves with every RPC, from a team's own torch module.

    The module follows `lmserve.export.custom.contract`: `forward(tokens [B, T], *states) ->
    (logits or log-probs [B, T, V], *new_states)`, its states described by `contract`
    (names, shapes with "batch" where the batch goes, dtypes). `vocab` is its token list (id =
    position), a `vocab.txt`, or a `tokenizer.json`; `options` are `FolderOptions`. Raises
    `ContractError` naming the part of the contract the module breaks, or the parity figure
    that failed (`PARITY_NATS`).
    """
    import torch

    from lmserve.export.custom.torch_graphs import ServedAdapter, export_onnx, export_torchscript

    vocabulary = _vocabulary(vocab, options)
    if not isinstance(module, torch.nn.Module):
        raise ContractError("module", f"expected a torch.nn.Module, got {type(module).__name__}")
    was_training = module.training
    module.eval()
    adapter = ServedAdapter(module, contract).eval()
    size, bos_id = len(vocabulary.tokens), vocabulary.vocab.bos_id

    def write(staging: Path) -> dict[str, str]:
        if format == "onnx":
            return export_onnx(adapter, staging, size, bos_id, opset)
        return export_torchscript(adapter, staging, size, bos_id)

    source = f"python module {type(module).__module__}.{type(module).__qualname__}"
    request = _request(model_dir, options, source, "lmserve.export.export_module")
    try:
        return write_brought_folder(
            request, torch_team_model(adapter), contract, vocabulary, format, write
        )
    finally:
        module.train(was_training)


def torch_team_model(adapter: Any) -> TeamModel:
    """The team's module (or TorchScript) called eagerly on numpy, on its own layouts."""
    import torch

    def call(tokens: np.ndarray, states: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        with torch.no_grad():
            scores, new = adapter.call_team(
                torch.from_numpy(tokens),
                [torch.from_numpy(np.ascontiguousarray(s)) for s in states],
            )
        return scores.detach().float().numpy(), [s.detach().numpy() for s in new]

    return call


def import_onnx(
    onnx_file: str | Path,
    model_dir: str | Path,
    *,
    vocab: Sequence[str] | str | Path,
    contract: ModelContract,
    **options: Unpack[FolderOptions],
) -> BroughtModel:
    """A team's ONNX file as it is -> a served folder (its graph wrapped, see onnx_graphs)."""
    from lmserve.export.custom.onnx_graphs import (
        OnnxTeamModel,
        inspect_graph,
        load_graph,
        wrap_graph,
    )
    from lmserve.export.custom.torch_graphs import write_graphs

    vocabulary = _vocabulary(vocab, options)
    path = Path(onnx_file)
    view = inspect_graph(load_graph(path), contract, len(vocabulary.tokens))
    team = OnnxTeamModel(view, contract)

    def write(staging: Path) -> dict[str, str]:
        graphs = [wrap_graph(view, contract, graph) for graph in ("step", "score")]
        return write_graphs(graphs, staging)

    source = f"onnx {path.name} sha256:{sha256_of(path)}"
    request = _request(model_dir, options, source, _command_line())
    return write_brought_folder(request, team, contract, vocabulary, "onnx", write)


def import_torchscript(
    script_file: str | Path,
    model_dir: str | Path,
    *,
    vocab: Sequence[str] | str | Path,
    contract: ModelContract,
    **options: Unpack[FolderOptions],
) -> BroughtModel:
    """A team's TorchScript file (`torch.jit.save`) as it is -> a served folder: its code is
    called, not rewritten, by the traced `model.ts` (step and score)."""
    from lmserve.export.custom.torch_graphs import ServedAdapter, export_torchscript
    from lmserve.export.rnn.to_torchscript import load_torchscript

    vocabulary = _vocabulary(vocab, options)
    path = Path(script_file)
    if not path.is_file():
        raise ContractError("file", f"{path}: no such TorchScript file")
    try:
        module = load_torchscript(path)
    except Exception as exc:  # torch's own errors for a file that is not TorchScript
        raise ContractError(
            "file", f"{path}: not a TorchScript file torch can load ({exc})"
        ) from exc
    adapter = ServedAdapter(module, contract).eval()
    size, bos_id = len(vocabulary.tokens), vocabulary.vocab.bos_id
    source = f"torchscript {path.name} sha256:{sha256_of(path)}"
    request = _request(model_dir, options, source, _command_line())
    return write_brought_folder(
        request,
        torch_team_model(adapter),
        contract,
        vocabulary,
        "torchscript",
        lambda staging: export_torchscript(adapter, staging, size, bos_id),
    )
