"""The lattice formats by name: one reader and one writer each (`slf`, `kaldi`).

graph = read_lattice(LatticeFormat.KALDI_TEXT, text, symbols)
text = write_lattice(LatticeFormat.KALDI_TEXT, graph, symbols, lm=new_scores)
"""

from __future__ import annotations

import enum

from lmserve.server.decoding.lattice.graph import LatticeGraph
from lmserve.server.decoding.lattice.kaldi import read_kaldi, write_kaldi
from lmserve.server.decoding.lattice.slf import read_slf, write_slf


class LatticeFormat(enum.Enum):
    HTK_SLF = "htk_slf"
    KALDI_TEXT = "kaldi_text"


def read_lattice(
    kind: LatticeFormat, text: str, symbols: dict[int, str] | None = None
) -> LatticeGraph:
    """The graph of a lattice text (LatticeSyntaxError naming the line when it is none)."""
    if kind is LatticeFormat.HTK_SLF:
        return read_slf(text)
    return read_kaldi(text, symbols)


def write_lattice(
    kind: LatticeFormat,
    graph: LatticeGraph,
    symbols: dict[int, str] | None = None,
    *,
    lm: list[float] | None = None,
    node_of: list[int] | None = None,
) -> str:
    """The graph in `kind`'s format; `lm` replaces the arcs' old LM scores (a rescored lattice)
    and `node_of` names each node's input node (SLF's times)."""
    if kind is LatticeFormat.HTK_SLF:
        return write_slf(graph, lm=lm, node_of=node_of)
    return write_kaldi(graph, symbols, lm=lm)
