"""`lmserve rescore-lattice`: rescore word lattices (HTK SLF or Kaldi text) with a served model.

Input: lattice files (`-` for stdin). An SLF file holds one lattice (its id: the file name); a
Kaldi text file (`lattice-copy ark:in ark,t:-`) may hold an archive of several, one per key,
separated by blank lines. Kaldi labels that are word ids need `--words words.txt`. Output, in
input order: the best path per lattice (`id<TAB>text`, the default), the n best
(`--output nbest`: `id<TAB>rank<TAB>combined<TAB>text`), or the rescored lattices in their
format (`--output lattice`: Kaldi's as one archive on stdout, SLF's into `--out-dir` as
`<id>.slf`); `--json` prints each lattice's result as a JSON line instead.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from lmserve.client.commands._common import add_connection_arguments, fail, with_client

if TYPE_CHECKING:
    from lmserve.client import LmServeClient
    from lmserve.client.lattices import LatticeText

HELP = "Rescore word lattices (HTK SLF or Kaldi text) with a model of a running server."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="lattice files ('-': stdin)")
    parser.add_argument("--model", required=True, help="the served model")
    parser.add_argument("--format", choices=("kaldi", "slf"), default="kaldi")
    parser.add_argument("--words", metavar="WORDS_TXT", help="Kaldi's symbol table (word id)")
    parser.add_argument("--acoustic-scale", type=float, default=1.0)
    parser.add_argument("--lm-weight", type=float, default=1.0)
    parser.add_argument(
        "--old-lm-weight", type=float, default=0.0, help="weight of the old LM score (default 0)"
    )
    parser.add_argument("--word-insertion-penalty", type=float, default=0.0)
    parser.add_argument("--nbest", type=int, default=1, help="paths per lattice (default 1)")
    parser.add_argument(
        "--max-history", type=int, help="neural models: merge histories at this many tokens"
    )
    parser.add_argument("--beam", type=float, help="prune the expansion (nats)")
    parser.add_argument("--output", choices=("1best", "nbest", "lattice"), default="1best")
    parser.add_argument("--out-dir", type=Path, help="--output lattice with SLF: write here")
    parser.add_argument("--json", action="store_true", help="print JSON lines, one per lattice")
    parser.add_argument("--batch", type=int, default=100, help="lattices per call (default 100)")
    add_connection_arguments(parser, timeout=600.0)


def kaldi_archive(text: str) -> list[str]:
    """A Kaldi text archive split into its lattices (a key line, arcs, a blank line)."""
    out: list[str] = []
    current: list[str] = []
    for line in text.splitlines():
        if line.strip():
            current.append(line)
        elif current:
            out.append("\n".join(current) + "\n")
            current = []
    if current:
        out.append("\n".join(current) + "\n")
    return out


def read_lattices(files: list[str], fmt: str) -> Iterator[LatticeText]:
    from lmserve.client.lattices import LatticeText

    for name in files:
        text = sys.stdin.read() if name == "-" else Path(name).read_text(encoding="utf-8")
        if fmt == "slf":
            yield LatticeText(text, "slf", "stdin" if name == "-" else Path(name).stem)
        else:
            for lattice in kaldi_archive(text):
                yield LatticeText(lattice, "kaldi")


def run(args: argparse.Namespace) -> int:
    if args.output == "lattice" and args.format == "slf" and args.out_dir is None and not args.json:
        return fail("rescore-lattice", "--output lattice with --format slf needs --out-dir")
    try:
        words = Path(args.words).read_text(encoding="utf-8") if args.words else ""
        lattices = list(read_lattices(args.files, args.format))
    except OSError as exc:
        return fail("rescore-lattice", f"{exc.filename}: {exc.strerror}")

    def body(client: LmServeClient) -> int:
        for start in range(0, len(lattices), max(1, args.batch)):
            batch = lattices[start : start + max(1, args.batch)]
            result = client.rescore_lattice(
                args.model,
                batch,
                words=words,
                acoustic_scale=args.acoustic_scale,
                lm_weight=args.lm_weight,
                old_lm_weight=args.old_lm_weight,
                word_insertion_penalty=args.word_insertion_penalty,
                nbest=args.nbest,
                max_history=args.max_history,
                beam=args.beam,
                return_lattice=args.output == "lattice",
            )
            for lattice in result.lattices:
                if args.json:
                    print(json.dumps(asdict(lattice)))
                elif args.output == "1best":
                    print(f"{lattice.id}\t{lattice.paths[0].text if lattice.paths else ''}")
                elif args.output == "nbest":
                    for rank, path in enumerate(lattice.paths):
                        print(f"{lattice.id}\t{rank}\t{path.combined_score:.6f}\t{path.text}")
                elif args.format == "kaldi":
                    sys.stdout.write(lattice.lattice)
                else:
                    args.out_dir.mkdir(parents=True, exist_ok=True)
                    (args.out_dir / f"{lattice.id}.slf").write_text(lattice.lattice, "utf-8")
        return 0

    return with_client("rescore-lattice", args, body)
