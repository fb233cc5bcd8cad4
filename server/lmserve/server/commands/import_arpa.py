"""`lmserve import-arpa`: turn an ARPA file (e.g. from KenLM's lmplz) into a served model folder."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

HELP = "Import an ARPA n-gram model (.arpa or .arpa.gz) into a model folder the server loads."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("arpa", type=Path, metavar="FILE.arpa[.gz]", help="the ARPA file")
    parser.add_argument("model_dir", type=Path, metavar="MODEL_DIR", help="folder to write")
    parser.add_argument("--name", help="model name (default: the folder's name)")
    parser.add_argument("--lowercase", action="store_true", help="lowercase text before tokenizing")
    parser.add_argument(
        "--token-pattern",
        help="regex whose matches are the words (default: split on whitespace, as KenLM)",
    )
    parser.add_argument("--description", default="", help="free-form description")
    parser.add_argument(
        "--copy-arpa", action="store_true", help="also keep a copy of the ARPA file in the folder"
    )
    parser.add_argument(
        "--quantize",
        action="store_true",
        help="store 8-bit log-probs and backoffs (about 7-9 bytes per n-gram instead of 22); "
        "the largest error this allows is written to the manifest and reported by GetModel",
    )


def written_atomically(model_dir: Path, write: Callable[[Path], T]) -> T:
    """`write(folder)` into a new folder beside `model_dir`, then moved into place: a failed or
    interrupted import leaves no half-written model folder. Into an existing folder the new
    files move one by one, the manifest last, and its other files stay (an ARPA kept there)."""
    from lmserve.server.manifest import MANIFEST_NAMES

    model_dir = Path(model_dir)
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{model_dir.name}.importing-", dir=model_dir.parent))
    try:
        result = write(staging)
        if not model_dir.exists():
            staging.rename(model_dir)
            return result
        written = sorted(staging.iterdir(), key=lambda path: path.name in MANIFEST_NAMES)
        for path in written:
            os.replace(path, model_dir / path.name)
        staging.rmdir()
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return result


def run(args: argparse.Namespace) -> int:
    import re
    import sys
    from datetime import UTC, datetime

    from lmserve.server.backends.ngram.folder import write_model_folder
    from lmserve.server.backends.ngram.model import NgramModel
    from lmserve.server.commands.import_progress import ImportProgress
    from lmserve.server.errors import ModelLoadError
    from lmserve.server.manifest import Provenance, TokenizerSpec

    arpa: Path = args.arpa
    model_dir: Path = args.model_dir
    name = args.name or model_dir.resolve().name
    if args.token_pattern is not None:
        try:
            re.compile(args.token_pattern)
        except re.error as exc:
            print(f"lmserve import-arpa: --token-pattern: {exc}", file=sys.stderr)
            return 2
    progress = ImportProgress()
    try:
        model = NgramModel.from_arpa(arpa, progress=progress)
    except (OSError, ModelLoadError) as exc:
        print(f"lmserve import-arpa: {exc}", file=sys.stderr)
        return 1
    progress.done(f"built the model: order {model.order}, {len(model.vocab):,} words")
    if args.quantize:
        tables = model.tables.quantize()
        model = NgramModel(tables)
        prob, backoff = tables.max_value_errors()
        print(
            f"quantized: {tables.nbytes() / max(1, tables.n_entries()):.1f} bytes per n-gram, "
            f"largest error {prob:.4f} nats a log-prob, {backoff:.4f} a backoff, "
            f"{tables.max_token_error():.4f} a token at most",
            file=sys.stderr,
        )
    try:
        manifest = written_atomically(
            model_dir,
            lambda folder: write_model_folder(
                model,
                folder,
                name=name,
                tokenizer=TokenizerSpec(lowercase=args.lowercase, pattern=args.token_pattern),
                provenance=Provenance(
                    trained_by=f"lmserve import-arpa {arpa.name}",
                    created=datetime.now(UTC).isoformat(timespec="seconds"),
                ),
                arpa_source=arpa if args.copy_arpa else None,
                description=args.description,
            ),
        )
    except OSError as exc:
        print(f"lmserve import-arpa: cannot write {model_dir}: {exc}", file=sys.stderr)
        return 1
    print(
        f"wrote {model_dir}: model {manifest.name!r}, order {model.order}, {len(model.vocab)} words"
    )
    return 0
