"""Scoring many token sequences that share prefixes, each shared prefix computed once.

    trie = PrefixTrie.build([[5, 9, 2], [5, 9, 7], [5, 3]])
    scoring = PrefixScoring(stepper, trie, eos=True, rows_per_step=256)
    for _ in scoring.steps(): pass          # one batched stepper call per iteration
    scoring.totals                          # log P(sequence [+ </s>] | <s>) per sequence, nats

The hypotheses of an n-best list share most of their words: a trie over their token ids has
far fewer nodes than the hypotheses have tokens. Walking the trie breadth first, every node is
fed to the model once: the nodes of one depth go through one batched `Stepper.step` (from their
parents' states), and a node's log-probability is its parent's next-token distribution at its
token. A sequence's total is the sum along its path (plus `</s>` from its last node's
distribution when eos is on). `steps()` yields after each stepper call, so a caller can
interleave other work and stop between calls; `computed` counts the positions fed to the model.

The number of trie nodes is sum_i (len_i - lcp(s_i, s_{i-1})) over the sequences sorted, which is
how `build` makes it, without a dictionary per node. Log-probabilities are natural logs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from lmserve.server.backends.stepping import Stepper

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class PrefixTrie:
    """Trie nodes in breadth-first order. Node 0 is the root (the empty prefix).

    `parent[n]` and `token[n]` describe node n (the root's are -1); `depth[n]` is its prefix
    length; `end[i]` is the node where sequence i ends (the root for an empty sequence)."""

    parent: IntArray
    token: IntArray
    depth: IntArray
    end: IntArray

    @property
    def nodes(self) -> int:
        return len(self.parent)

    @classmethod
    def build(cls, sequences: Sequence[Sequence[int]]) -> PrefixTrie:
        order = sorted(range(len(sequences)), key=lambda i: tuple(sequences[i]))
        parents, tokens, depths = [-1], [-1], [0]
        path: list[int] = [0]  # path[d] = node of the previous sequence's prefix of length d
        previous: Sequence[int] = ()
        end = np.zeros(len(sequences), dtype=np.int64)
        for i in order:
            seq = sequences[i]
            common = 0
            limit = min(len(seq), len(previous))
            while common < limit and seq[common] == previous[common]:
                common += 1
            del path[common + 1 :]
            for d in range(common, len(seq)):
                parents.append(path[d])
                tokens.append(int(seq[d]))
                depths.append(d + 1)
                path.append(len(parents) - 1)
            end[i] = path[len(seq)]
            previous = seq
        parent = np.asarray(parents, dtype=np.int64)
        depth = np.asarray(depths, dtype=np.int64)
        # Breadth first: nodes sorted by depth (stable keeps parents before children).
        bfs = np.argsort(depth, kind="stable")
        rank = np.empty_like(bfs)
        rank[bfs] = np.arange(len(bfs))
        parent_bfs = np.where(parent[bfs] >= 0, rank[np.maximum(parent[bfs], 0)], -1)
        return cls(
            parent=parent_bfs.astype(np.int64),
            token=np.asarray(tokens, dtype=np.int64)[bfs],
            depth=depth[bfs],
            end=rank[end],
        )


class PrefixScoring:
    """Scores the sequences of a trie with a stepper, one batched call per `steps()` item."""

    def __init__(
        self, stepper: Stepper, trie: PrefixTrie, *, eos: bool, rows_per_step: int = 256
    ) -> None:
        self.stepper = stepper
        self.trie = trie
        self.eos = eos
        self.rows_per_step = max(1, rows_per_step)
        # log P(node's token | parent's prefix), summed from the root down.
        self._path = np.zeros(trie.nodes, dtype=np.float64)
        self._eos = np.zeros(trie.nodes, dtype=np.float64)
        self.computed = 0
        self.totals = np.zeros(len(trie.end), dtype=np.float64)

    def _needs_output(self) -> npt.NDArray[np.bool_]:
        """Nodes whose next-token distribution is needed: parents, and ends when eos is on."""
        trie = self.trie
        needed = np.zeros(trie.nodes, dtype=bool)
        needed[trie.parent[trie.parent >= 0]] = True
        if self.eos:
            needed[trie.end] = True
        return needed

    def steps(self) -> Iterator[None]:
        """Runs the model over the trie, yielding after each batched call."""
        trie, stepper = self.trie, self.stepper
        eos_id = stepper.vocab.eos_id
        needed = self._needs_output()
        levels = _children_by_depth(trie)
        log_probs, state = stepper.prefill([[]])
        self.computed += 1
        self._eos[0] = float(log_probs[0][eos_id])
        if levels:
            first = levels[0]
            self._path[first] = log_probs[0][trie.token[first]]
        yield
        # `row[n]`: node n's row in the state of the depth above the one being stepped.
        row = np.zeros(trie.nodes, dtype=np.int64)
        for d, level in enumerate(levels):
            stepped = level[needed[level]]
            row[stepped] = np.arange(len(stepped))
            below = levels[d + 1] if d + 1 < len(levels) else level[:0]
            below_parent_row = row[trie.parent[below]]
            states = []
            for start in range(0, len(stepped), self.rows_per_step):
                chunk = stepped[start : start + self.rows_per_step]
                parents = trie.parent[chunk]  # rows of the depth above: `row[parents]`
                out, chunk_state = stepper.step(
                    trie.token[chunk], stepper.select(state, row[parents])
                )
                self.computed += len(chunk)
                self._eos[chunk] = out[:, eos_id]
                # The children's log-probs come from this chunk's distributions.
                mine = (below_parent_row >= start) & (below_parent_row < start + len(chunk))
                kids = below[mine]
                self._path[kids] = (
                    self._path[trie.parent[kids]]
                    + out[below_parent_row[mine] - start, trie.token[kids]]
                )
                states.append(chunk_state)
                yield
            if states:
                state = stepper.merge(states)
        totals = self._path[trie.end]
        if self.eos:
            totals = totals + self._eos[trie.end]
        self.totals = totals


def _children_by_depth(trie: PrefixTrie) -> list[IntArray]:
    """Node ids of each depth from 1 down, in breadth-first order."""
    if trie.nodes <= 1:
        return []
    depth = trie.depth
    bounds = np.searchsorted(depth, np.arange(1, int(depth.max()) + 2))
    return [np.arange(bounds[d], bounds[d + 1]) for d in range(len(bounds) - 1)]
