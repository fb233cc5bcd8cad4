"""Lattices for tests and benchmarks: seeded random word lattices in HTK SLF and Kaldi text, every
path of one enumerated (the brute-force reference), and n-best lists as a lattice.

    lattice = random_lattice(random.Random(3), WORDS, nodes=7)
    slf, kaldi = lattice.slf(), lattice.kaldi("utt1")
    for path in lattice.paths(): path.words, path.acoustic, path.old_lm, path.arcs
    union = nbest_lattice(hypotheses)       # [(words, acoustic score)]: each one path

Nothing here imports the server: the tests compare what it answers with these.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

EPSILON = "!NULL"


@dataclass(frozen=True)
class Path:
    arcs: tuple[int, ...]
    words: tuple[str, ...]
    acoustic: float
    old_lm: float


@dataclass
class WordLattice:
    """Arcs `(src, dst, word, acoustic, old_lm)` over nodes 0..nodes-1, start 0, final nodes-1
    (word EPSILON: no word)."""

    nodes: int
    arcs: list[tuple[int, int, str, float, float]] = field(default_factory=list)

    def paths(self) -> Iterator[Path]:
        """Every path from the start to the final node, arcs in input order (brute force)."""
        out: dict[int, list[int]] = {}
        for i, (a, *_rest) in enumerate(self.arcs):
            out.setdefault(a, []).append(i)

        def walk(node: int, taken: tuple[int, ...]) -> Iterator[Path]:
            if node == self.nodes - 1:
                arcs = [self.arcs[i] for i in taken]
                yield Path(
                    taken,
                    tuple(w for _, _, w, _, _ in arcs if w != EPSILON),
                    sum(a[3] for a in arcs),
                    sum(a[4] for a in arcs),
                )
                return
            for i in out.get(node, []):
                yield from walk(self.arcs[i][1], (*taken, i))

        yield from walk(0, ())

    def slf(self) -> str:
        lines = ["VERSION=1.0", "UTTERANCE=test", f"N={self.nodes} L={len(self.arcs)}"]
        lines += [f"I={n} t={n / 100:.2f}" for n in range(self.nodes)]
        lines += [
            f"J={j} S={a} E={b} W={w} a={ac!r} l={old!r}"
            for j, (a, b, w, ac, old) in enumerate(self.arcs)
        ]
        return "\n".join(lines) + "\n"

    def kaldi(self, key: str = "utt", symbols: dict[str, int] | None = None) -> str:
        """Costs negated; labels ids when a symbol table is given (epsilon: 0)."""
        lines = [key]
        for a, b, w, ac, old in self.arcs:
            label = (
                ("0" if w == EPSILON else w)
                if symbols is None
                else str(0 if w == EPSILON else symbols[w])
            )
            lines.append(f"{a} {b} {label} {-old!r},{-ac!r}")
        lines.append(str(self.nodes - 1))
        return "\n".join(lines) + "\n"


def random_lattice(
    rng: random.Random, words: Sequence[str], nodes: int = 7, epsilon: float = 0.15
) -> WordLattice:
    """A DAG: each node has an arc to the next and sometimes one or two further (skipping one),
    words drawn from `words`, some arcs epsilons (never out of the start), scores random."""
    lattice = WordLattice(nodes)
    for a in range(nodes - 1):
        targets = [a + 1] * rng.randint(1, 2) + (
            [a + 2] if a + 2 < nodes and rng.random() < 0.5 else []
        )
        for b in targets:
            word = EPSILON if a > 0 and rng.random() < epsilon else rng.choice(words)
            lattice.arcs.append((a, b, word, rng.uniform(-8.0, 0.0), rng.uniform(-4.0, 0.0)))
    return lattice


def nbest_lattice(hypotheses: Sequence[tuple[Sequence[str], float]]) -> WordLattice:
    """The union of n-best hypotheses as a word graph: a prefix tree of their words (shared
    prefixes share arcs, acoustic 0), each hypothesis's end linked to the final node by an
    epsilon arc carrying its acoustic score, so every hypothesis is exactly one path with its own
    acoustic score (two equal hypotheses: two paths)."""
    children: dict[tuple[int, str], int] = {}
    arcs: list[tuple[int, int, str, float, float]] = []
    ends: list[tuple[int, float]] = []
    count = 1
    for words, acoustic in hypotheses:
        node = 0
        for word in words:
            nxt = children.get((node, word))
            if nxt is None:
                nxt = children[(node, word)] = count
                count += 1
                arcs.append((node, nxt, word, 0.0, 0.0))
            node = nxt
        ends.append((node, acoustic))
    final = count
    for node, acoustic in ends:
        arcs.append((node, final, EPSILON, acoustic, 0.0))
    return WordLattice(final + 1, arcs)
