"""The lattice readers and writers: SLF and Kaldi text round trips (read -> write -> read gives
the same graph), the costs' signs and bases, and the lines they refuse."""

from __future__ import annotations

import math
import random

import pytest
from lattices import random_lattice

from lmserve.server.decoding.lattice.formats import LatticeFormat, read_lattice, write_lattice
from lmserve.server.decoding.lattice.graph import LatticeSyntaxError
from lmserve.server.decoding.lattice.kaldi import read_symbols

WORDS = "a b c d e".split()


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("kind", list(LatticeFormat))
def test_round_trip(seed: int, kind: LatticeFormat) -> None:
    lattice = random_lattice(random.Random(seed), WORDS, nodes=3 + seed % 7)
    text = lattice.slf() if kind is LatticeFormat.HTK_SLF else lattice.kaldi(f"k{seed}")
    first = read_lattice(kind, text)
    first.check()
    second = read_lattice(kind, write_lattice(kind, first))
    assert second.same_as(first)
    assert write_lattice(kind, second) == write_lattice(kind, first)
    assert first.arcs == len(lattice.arcs) and first.nodes == lattice.nodes
    for got, (a, b, _, ac, old) in zip(range(first.arcs), lattice.arcs, strict=True):
        assert (first.src[got], first.dst[got]) == (a, b)
        assert math.isclose(first.acoustic[got], ac) and math.isclose(first.old_lm[got], old)


def test_kaldi_costs_are_negated_and_symbols_mapped() -> None:
    symbols = read_symbols("<eps> 0\nthe 1\ncat 2\n")
    graph = read_lattice(
        LatticeFormat.KALDI_TEXT,
        "utt7\n0 1 1 2.5,10.25\n1 2 0 0,1,3_4_5\n2 3 2 1,2\n3 0.5,0.25\n\n",
        symbols,
    )
    assert graph.words == ["the", "<eps>", "cat"]
    assert graph.acoustic == [-10.25, -1.0, -2.0] and graph.old_lm == [-2.5, -0.0, -1.0]
    assert graph.finals == {3: (-0.25, -0.5)}
    assert graph.arc_extras[1] == "3_4_5" and graph.extras["key"] == "utt7"
    again = read_lattice(
        LatticeFormat.KALDI_TEXT, write_lattice(LatticeFormat.KALDI_TEXT, graph, symbols), symbols
    )
    assert again.same_as(graph) and again.arc_extras == graph.arc_extras


def test_slf_words_on_nodes_and_log_base() -> None:
    text = (
        "base=10\nstart=0 end=2\nI=0 W=!NULL\nI=1 W=the\nI=2 W=cat\n"
        "J=0 S=0 E=1 a=-1 l=-2\nJ=1 S=1 E=2 a=-3\n"
    )
    graph = read_lattice(LatticeFormat.HTK_SLF, text)
    assert graph.words == ["the", "cat"]
    assert math.isclose(graph.acoustic[0], -math.log(10))
    assert math.isclose(graph.old_lm[0], -2 * math.log(10)) and graph.old_lm[1] == 0.0
    assert graph.start == 0 and graph.finals == {2: (0.0, 0.0)}


BAD = [
    (LatticeFormat.KALDI_TEXT, "utt\n0 1 a 0,0\n1 2 b 0,0\n2 1 c 0,0\n2\n", "cycle"),
    (LatticeFormat.KALDI_TEXT, "utt\n0 1 a x,0\n1\n", "line 2"),
    (LatticeFormat.KALDI_TEXT, "utt\n0 1 a 0,0\n", "no final"),
    (LatticeFormat.KALDI_TEXT, "utt\n0 1 a 0,0\n1\n\nutt2\n0 1 a 0,0\n", "second lattice"),
    (LatticeFormat.KALDI_TEXT, "", "empty"),
    (LatticeFormat.HTK_SLF, "I=0\nI=1\nJ=0 S=0 E=4 W=a\n", "E=4"),
    (LatticeFormat.HTK_SLF, "I=0\nI=1\nJ=0 S=0 W=a\n", "no E="),
    (LatticeFormat.HTK_SLF, "I=0\nI=1\nJ=0 S=0 E=1 a=oops\n", "line 3"),
    (LatticeFormat.HTK_SLF, "I=0\nI=1\nI=2\nJ=0 S=0 E=2\nJ=1 S=1 E=2\n", "start="),
    (LatticeFormat.HTK_SLF, "base=0\nI=0\n", "base="),
    (LatticeFormat.HTK_SLF, "VERSION=1.0\n", "no node lines"),
]


@pytest.mark.parametrize(("kind", "text", "says"), BAD)
def test_refused_with_the_reason(kind: LatticeFormat, text: str, says: str) -> None:
    with pytest.raises(LatticeSyntaxError) as caught:
        read_lattice(kind, text).check()
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_symbol_table_lines() -> None:
    with pytest.raises(LatticeSyntaxError, match="line 2"):
        read_symbols("a 1\nb two\n")
