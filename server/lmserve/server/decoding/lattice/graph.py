"""One lattice graph for every format: nodes, arcs with a word, an acoustic log-likelihood and
an old LM log-probability, a start node and final nodes (with final weights).

    graph = LatticeGraph(nodes=3, start=0, finals={2: (0.0, 0.0)})
    graph.add_arc(0, 1, "the", acoustic=-12.5, old_lm=-2.1)
    graph.add_arc(1, 2, "</s>", acoustic=-1.0, old_lm=0.0)
    order = graph.topological_order()         # LatticeSyntaxError on a cycle

Scores are natural-log likelihoods (Kaldi's costs are negated by its reader). A word that is no
word for the LM (an epsilon, a sentence marker: `NON_WORDS`) is kept on its arc, so a lattice
written back has it, and scored as nothing: the LM reads `<s>` before every path and `</s>`
after it. What a format keeps beside the graph (SLF's header and node times, Kaldi's key and
transition-id strings) is in `extras`, for its writer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

# Arc labels that are no word: epsilons, HTK's null node word, the sentence markers.
NON_WORDS = frozenset({"", "<eps>", "!NULL", "<s>", "</s>", "!SENT_START", "!SENT_END"})


def is_word(label: str) -> bool:
    """Whether an arc label is a word the LM scores (and the insertion penalty counts)."""
    return label not in NON_WORDS


class LatticeSyntaxError(ValueError):
    """A lattice text that is not a lattice: `line` is its 1-based line (0: the whole text)."""

    def __init__(self, problem: str, line: int = 0, text: str = "") -> None:
        where = f"line {line}: " if line else ""
        quoted = f" ({text[:80]!r})" if text else ""
        super().__init__(f"{where}{problem}{quoted}")
        self.line = line


@dataclass
class LatticeGraph:
    """A lattice (see the module doc). Arc i is `src[i] -> dst[i]` with `words[i]`."""

    nodes: int
    start: int
    finals: dict[int, tuple[float, float]]  # node -> (acoustic, old LM) final weights
    src: list[int] = field(default_factory=list)
    dst: list[int] = field(default_factory=list)
    words: list[str] = field(default_factory=list)
    acoustic: list[float] = field(default_factory=list)
    old_lm: list[float] = field(default_factory=list)
    # Per arc, what its format keeps beside the scores (Kaldi's transition ids); may be empty.
    arc_extras: list[str] = field(default_factory=list)
    # What the format keeps of the whole lattice (SLF's header lines, Kaldi's key, node times).
    extras: dict[str, object] = field(default_factory=dict)

    @property
    def arcs(self) -> int:
        return len(self.src)

    def add_arc(
        self, src: int, dst: int, word: str, *, acoustic: float, old_lm: float, extra: str = ""
    ) -> None:
        self.src.append(src)
        self.dst.append(dst)
        self.words.append(word)
        self.acoustic.append(acoustic)
        self.old_lm.append(old_lm)
        self.arc_extras.append(extra)

    def check(self) -> list[int]:
        """Checks the graph is a lattice and returns its topological order: every arc between
        existing nodes, a start node, a final node, and no cycle (LatticeSyntaxError)."""
        if self.nodes <= 0:
            raise LatticeSyntaxError("the lattice has no nodes")
        if not 0 <= self.start < self.nodes:
            raise LatticeSyntaxError(f"the start node {self.start} is not a node")
        if not self.finals:
            raise LatticeSyntaxError("the lattice has no final node")
        for node in self.finals:
            if not 0 <= node < self.nodes:
                raise LatticeSyntaxError(f"final node {node} is not a node")
        for i, (a, b) in enumerate(zip(self.src, self.dst, strict=True)):
            if not (0 <= a < self.nodes and 0 <= b < self.nodes):
                missing = a if not 0 <= a < self.nodes else b
                raise LatticeSyntaxError(
                    f"arc {i} ({a} -> {b}) leads to node {missing}, "
                    f"which is not among the {self.nodes} nodes"
                )
        return self.topological_order()

    def topological_order(self) -> list[int]:
        """Nodes with every arc's source before its destination (Kahn's algorithm)."""
        incoming = [0] * self.nodes
        out: list[list[int]] = [[] for _ in range(self.nodes)]
        for a, b in zip(self.src, self.dst, strict=True):
            incoming[b] += 1
            out[a].append(b)
        ready = [n for n in range(self.nodes) if incoming[n] == 0]
        order: list[int] = []
        while ready:
            node = ready.pop()
            order.append(node)
            for nxt in out[node]:
                incoming[nxt] -= 1
                if incoming[nxt] == 0:
                    ready.append(nxt)
        if len(order) < self.nodes:
            stuck = min(n for n in range(self.nodes) if incoming[n] > 0)
            raise LatticeSyntaxError(f"the lattice has a cycle (through node {stuck})")
        return order

    def path_words(self, arcs: Iterable[int]) -> list[str]:
        """The words (no epsilons, no sentence markers) along arcs, in order."""
        return [self.words[a] for a in arcs if is_word(self.words[a])]

    def same_as(self, other: LatticeGraph) -> bool:
        """Equal graphs: nodes, start, finals and every arc (order included), scores within
        1e-9 (a format that prints rounded floats reads back as the same lattice)."""

        def close(x: Iterable[float], y: Iterable[float]) -> bool:
            xs, ys = list(x), list(y)
            return len(xs) == len(ys) and all(
                abs(p - q) <= 1e-9 for p, q in zip(xs, ys, strict=False)
            )

        return (
            self.nodes == other.nodes
            and self.start == other.start
            and self.finals.keys() == other.finals.keys()
            and all(close(self.finals[n], other.finals[n]) for n in self.finals)
            and self.src == other.src
            and self.dst == other.dst
            and self.words == other.words
            and close(self.acoustic, other.acoustic)
            and close(self.old_lm, other.old_lm)
        )
