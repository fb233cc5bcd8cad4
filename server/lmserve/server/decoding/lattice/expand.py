"""Lattice rescoring: a lattice's nodes expanded by model history, every arc scored by the model
through its stepper, and the best paths through the expansion.

    expansion = LatticeExpansion(stepper, lattice, LatticeParams(paths=10), history_key)
    for _ in expansion.steps(): pass       # one batched stepper call per item
    result = expansion.result              # RescoredPaths: paths best first, counts, exact

A path's LM score depends on its whole word history, so a lattice node is split into one node
per distinct (lattice node, history) pair it is reached with: the expanded graph the model
scores. Histories are merged where the model cannot tell them apart. An n-gram model's
distributions depend only on its minimised state (`HistoryKey`, KenLM's state), so merging by it
is exact: every path keeps its exact score. A recurrent or transformer model's state is its whole
history, so histories are merged when their last `max_history` tokens agree (Kaldi's
`max_ngram_order` in `lattice-lmrescore-rnnlm`): the merged node keeps the model state of its best
history, and the paths through it are scored from that state (an approximation, reported as
`exact = False` whenever two different histories were merged). A `beam` prunes the (node,
history) pairs further than `beam` below the best at their lattice node (`exact = False` when it
drops any).

A stepper with exact word lookups (`backends.stepping.WordLookup`: the n-gram model) is not
stepped at all: each arc's tokens are looked up from its source's lookup state (a few probes
each, where a distribution costs a pass over every word that may follow), and states are keyed
by the lookup's minimised state, so the expansion and every score are those of the distribution
way, bit for bit.

The expansion runs in waves: a lattice node's wave is its longest distance (in arcs) from the
start, so every arc leads to a later wave and a node's histories are all known when its wave
comes. Each wave is one batched step for all its new (node, history) states (their last
token, from their best history's state), whatever lattice node they are at; an arc with a
word of several tokens (a subword model) takes the steps of its inner tokens, batched across the
wave too. The n best paths are then found exactly over the expanded graph (k best partial paths
per state, in wave order: the k-shortest-paths recursion on a DAG).

combined = acoustic_scale * acoustic + lm_weight * lm + old_lm_weight * old_lm
           + word_insertion_penalty * words, natural logs (nats) throughout.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

import numpy as np

from lmserve.server.backends.base import FloatArray
from lmserve.server.backends.stepping import (
    HistoryKey,
    LookupState,
    State,
    Stepper,
    WordLookup,
    word_lookup,
)
from lmserve.server.errors import RequestTooLarge

_FIRST = itemgetter(0)  # a partial path's score (ties: the first found, as before)


@dataclass(frozen=True)
class TokenLattice:
    """A lattice as the engine rescores it: arc i is `src[i] -> dst[i]`, its model tokens
    `tokens[token_offsets[i]:token_offsets[i + 1]]` (none: an epsilon or a sentence marker),
    `word_counts[i]` words (what the insertion penalty counts), its acoustic and old LM
    log-likelihoods; final nodes with their final weights. `where` names it in errors;
    `oov_counts[i]` are the arc's tokens the model does not know."""

    nodes: int
    start: int
    src: list[int]
    dst: list[int]
    token_offsets: list[int]
    tokens: list[int]
    word_counts: list[int]
    acoustic: list[float]
    old_lm: list[float]
    final_nodes: list[int]
    final_acoustic: list[float]
    final_old_lm: list[float]
    where: str = "lattice"
    # Per arc, tokens the model does not know (scored as `<unk>`); empty: none.
    oov_counts: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class LatticeParams:
    """The combination's weights and the search's knobs (see the module doc). `paths`: paths
    returned per lattice; `expanded`: also return the expanded graph; `max_states`: the most
    (node, history) states one lattice may expand to (RESOURCE_EXHAUSTED past it)."""

    acoustic_scale: float = 1.0
    lm_weight: float = 1.0
    old_lm_weight: float = 0.0
    word_insertion_penalty: float = 0.0
    paths: int = 1
    max_history: int = 4
    beam: float | None = None
    bos: bool = True
    eos: bool = True
    expanded: bool = False
    max_states: int = 100_000
    rows_per_step: int = 256


@dataclass(frozen=True)
class FoundPath:
    """One path: the input lattice's arcs on it, in order, and its scores (nats)."""

    arcs: list[int]
    combined: float
    acoustic: float
    lm: float
    old_lm: float
    words: int
    oov: int = 0


@dataclass(frozen=True)
class ExpandedGraph:
    """The expanded lattice: state i stands for lattice node `node_of[i]` under one history;
    arc j goes `src[j] -> dst[j]` for input arc `arc[j]`, with the model's log-prob `lm[j]` of
    its tokens; `final_states` end paths, `final_lm` their `</s>` log-prob (0 without eos)."""

    node_of: list[int]
    src: list[int]
    dst: list[int]
    arc: list[int]
    lm: list[float]
    final_states: list[int]
    final_lm: list[float]


@dataclass(frozen=True)
class RescoredPaths:
    """A lattice's result: paths best first, the expansion's size, whether it was exact (no
    inexact merge, nothing pruned), the tokens the model computed, and the expanded graph when
    asked for."""

    paths: list[FoundPath]
    expanded_nodes: int
    expanded_arcs: int
    exact: bool
    computed: int
    graph: ExpandedGraph | None = None


@dataclass
class _States:
    """The expansion's (node, history) states, as parallel lists (index = state id)."""

    node: list[int] = field(default_factory=list)
    recent: list[tuple[int, ...]] = field(default_factory=list)  # the last tokens read
    history: list[int] = field(default_factory=list)  # id of the whole history (a trie node)
    score: list[float] = field(default_factory=list)  # best combined score reaching it
    # The best history's way in: the model state to step from and the token to step (-1:
    # none, an epsilon arc: `rep_dist` is then the distribution already after it).
    rep_state: list[State] = field(default_factory=list)
    rep_token: list[int] = field(default_factory=list)
    rep_dist: list[FloatArray | None] = field(default_factory=list)
    alive: list[bool] = field(default_factory=list)

    def add(
        self,
        node: int,
        recent: tuple[int, ...],
        history: int,
        score: float,
        rep: tuple[State, int, FloatArray | None],
    ) -> int:
        self.node.append(node)
        self.recent.append(recent)
        self.history.append(history)
        self.score.append(score)
        self.rep_state.append(rep[0])
        self.rep_token.append(rep[1])
        self.rep_dist.append(rep[2])
        self.alive.append(True)
        return len(self.node) - 1


@dataclass
class _Arcs:
    """The expansion's arcs, as parallel lists: source state, target state, input arc, LM
    log-prob, and the combined weight."""

    src: list[int] = field(default_factory=list)
    dst: list[int] = field(default_factory=list)
    arc: list[int] = field(default_factory=list)
    lm: list[float] = field(default_factory=list)
    weight: list[float] = field(default_factory=list)


class LatticeExpansion:
    """Rescores one lattice with a stepper, one batched call per `steps()` item."""

    def __init__(
        self,
        stepper: Stepper,
        lattice: TokenLattice,
        params: LatticeParams,
        history_key: HistoryKey | None = None,
    ) -> None:
        self.stepper = stepper
        self.lattice = lattice
        self.params = params
        self.history_key = history_key
        # Tokens kept per state: what the key reads.
        window = history_key.window if history_key is not None else params.max_history
        self._keep = max(1, window, params.max_history)
        self.computed = 0
        self.exact = True
        self.result = RescoredPaths([], 0, 0, True, 0)
        self._trie: dict[tuple[int, int], int] = {}
        # The expansion in progress (set up by `steps`).
        self._wave: list[int] = []
        self._out_arcs: list[list[int]] = []
        self._finals: dict[int, int] = {}
        self._tokens_of: list[list[int]] = []
        self._w_static: list[float] = []
        self._states = _States()
        self._by_wave: dict[int, list[int]] = {}
        self._index: dict[tuple[int, Hashable], int] = {}
        self._arcs = _Arcs()
        self._order: list[int] = []
        self._final_states: list[int] = []
        self._final_lm: list[float] = []

    # -- histories ------------------------------------------------------------------------------

    def _key(self, recent: tuple[int, ...]) -> tuple[int, ...]:
        if self.history_key is not None:
            return self.history_key.key(recent)
        m = self.params.max_history
        return recent[-m:] if m else ()

    def _extend(self, history: int, tokens: Sequence[int]) -> int:
        """The id of a history extended by tokens (equal ids: equal token sequences)."""
        trie = self._trie
        for t in tokens:
            key = (history, t)
            found = trie.get(key)
            if found is None:
                found = trie[key] = len(trie) + 1
            history = found
        return history

    # -- the expansion --------------------------------------------------------------------------

    def _waves(self) -> list[int]:
        """Each node's longest distance from the start in arcs (-1: unreachable)."""
        lat = self.lattice
        out: list[list[int]] = [[] for _ in range(lat.nodes)]
        incoming = [0] * lat.nodes
        for i, (a, b) in enumerate(zip(lat.src, lat.dst, strict=True)):
            out[a].append(i)
            incoming[b] += 1
        wave = [-1] * lat.nodes
        wave[lat.start] = 0
        ready = [n for n in range(lat.nodes) if incoming[n] == 0]
        while ready:
            node = ready.pop()
            for i in out[node]:
                nxt = lat.dst[i]
                if wave[node] >= 0:
                    wave[nxt] = max(wave[nxt], wave[node] + 1)
                incoming[nxt] -= 1
                if incoming[nxt] == 0:
                    ready.append(nxt)
        return wave

    def steps(self) -> Iterator[None]:
        """Expands the lattice wave by wave, yielding after each batched model call; then finds
        the paths (`result`). A stepper with exact word lookups (`WordLookup`: an n-gram model)
        scores every arc of a wave in one lookup call, its states merged by the lookup's own
        minimised state; any other steps each new state's distribution."""
        lat, p = self.lattice, self.params
        self._wave = wave = self._waves()
        self._out_arcs = [[] for _ in range(lat.nodes)]
        for i, a in enumerate(lat.src):
            if wave[a] >= 0:
                self._out_arcs[a].append(i)
        self._finals = {n: k for k, n in enumerate(lat.final_nodes)}
        self._tokens_of = [
            lat.tokens[lat.token_offsets[i] : lat.token_offsets[i + 1]] for i in range(len(lat.src))
        ]
        self._w_static = [
            p.acoustic_scale * lat.acoustic[i]
            + p.old_lm_weight * lat.old_lm[i]
            + p.word_insertion_penalty * lat.word_counts[i]
            for i in range(len(lat.src))
        ]
        self._states = _States()
        self._by_wave = {}
        self._index = {}
        self._arcs = _Arcs()
        self._order = []
        self._final_states = []
        self._final_lm = []
        lookup = word_lookup(self.stepper)
        if lookup is not None:
            yield from self._expand_by_lookup(lookup)
        else:
            yield from self._expand_by_steps()
        self._finish()

    def _wave_members(self) -> Iterator[list[int]]:
        """Each wave's states in turn (pruned; empty waves skipped), taken when its turn
        comes: the earlier waves' arcs add to the later ones."""
        last_wave = max(self._wave) if self._wave else 0
        for w in range(last_wave + 1):
            members = self._by_wave.pop(w, [])
            if members:
                yield self._pruned(self._states, members)

    def _expand_by_steps(self) -> Iterator[None]:
        """Each wave's new states stepped from their best history's model state (one batched
        step), arcs scored from the distributions."""
        lat, p, stepper, states = self.lattice, self.params, self.stepper, self._states
        eos_id = stepper.vocab.eos_id
        tokens_of = self._tokens_of

        # The start: `<s>` read (or nothing, without bos).
        first, root_state = stepper.prefill([[]], bos=p.bos)
        self.computed += 1
        start: tuple[int, ...] = (stepper.vocab.bos_id,) if p.bos else ()
        root = states.add(lat.start, start, 0, 0.0, (stepper.split(root_state)[0], -1, first[0]))
        self._index[(lat.start, self._key(start))] = root
        self._by_wave[0] = [root]
        yield

        for members in self._wave_members():
            # 1. Each new state's model state and next-token distribution: one batched step
            #    from its best history's state with its last token.
            dists: dict[int, FloatArray] = {}
            model: dict[int, State] = {}
            stepped = [s for s in members if states.rep_token[s] >= 0]
            for s in members:
                if states.rep_token[s] < 0:
                    carried = states.rep_dist[s]
                    assert carried is not None
                    dists[s], model[s] = carried, states.rep_state[s]
            for lo in range(0, len(stepped), p.rows_per_step):
                chunk = stepped[lo : lo + p.rows_per_step]
                merged = stepper.merge([states.rep_state[s] for s in chunk])
                out, after = stepper.step(np.array([states.rep_token[s] for s in chunk]), merged)
                self.computed += len(chunk)
                for row, (s, st) in enumerate(zip(chunk, stepper.split(after), strict=True)):
                    dists[s], model[s] = out[row], st
                yield
            for s in members:
                self._order.append(s)
                # The state no longer needs its way in: free the model state it stepped from.
                states.rep_state[s] = None
                states.rep_dist[s] = None
                if states.node[s] in self._finals:
                    self._final_states.append(s)
                    self._final_lm.append(float(dists[s][eos_id]) if p.eos else 0.0)
            # 2. Arcs out of this wave's states: the first token's log-prob from the source's
            #    distribution; a word of several tokens steps its inner tokens (batched).
            pending: list[tuple[int, int, float, State, FloatArray | None]] = []
            chains: list[tuple[int, int, float, State]] = []
            for s in members:
                for i in self._out_arcs[states.node[s]]:
                    toks = tokens_of[i]
                    if not toks:  # the target reads nothing: it takes this distribution
                        pending.append((s, i, 0.0, model[s], np.array(dists[s])))
                    elif len(toks) == 1:
                        pending.append((s, i, float(dists[s][toks[0]]), model[s], None))
                    else:
                        chains.append((s, i, float(dists[s][toks[0]]), model[s]))
            for item in self._chains(chains, tokens_of):
                if item is None:
                    yield
                else:
                    pending.append(item)
            # 3. Each arc leads to the (node, history) state of its target: new, or merged.
            for s, i, lm, st, dist in pending:
                toks = tokens_of[i]
                recent = (states.recent[s] + tuple(toks))[-self._keep :]
                history = self._extend(states.history[s], toks)
                key = (lat.dst[i], self._key(recent))
                self._arrive(s, i, lm, key, recent, history, (st, toks[-1] if toks else -1, dist))

    def _expand_by_lookup(self, lookup: WordLookup) -> Iterator[None]:
        """Each wave's arcs (and its final states' `</s>`) scored in one lookup call from their
        sources' lookup states; a word of several tokens looks its later tokens up in one call
        per position across the wave. A state is keyed by its lookup state, minimised: every
        merge is exact, and the paths' scores equal the distribution way's bit for bit."""
        lat, p, states = self.lattice, self.params, self._states
        eos_id = self.stepper.vocab.eos_id
        tokens_of = self._tokens_of
        root_state = lookup.lookup_start(bos=p.bos)
        root = states.add(lat.start, (), 0, 0.0, (root_state, -1, None))
        self._index[(lat.start, root_state)] = root
        self._by_wave[0] = [root]
        for members in self._wave_members():
            rows_states: list[LookupState] = []
            rows_tokens: list[int] = []
            ends: list[tuple[int, int]] = []  # (index in final_lm, row of its `</s>`)
            # (source, arc, row of its first token; -1: an epsilon arc)
            arcs: list[tuple[int, int, int]] = []
            chains: list[tuple[int, int, int]] = []
            for s in members:
                self._order.append(s)
                st = states.rep_state[s]
                if states.node[s] in self._finals:
                    self._final_states.append(s)
                    self._final_lm.append(0.0)
                    if p.eos:
                        ends.append((len(self._final_lm) - 1, len(rows_tokens)))
                        rows_states.append(st)
                        rows_tokens.append(eos_id)
                for i in self._out_arcs[states.node[s]]:
                    toks = tokens_of[i]
                    if not toks:
                        arcs.append((s, i, -1))
                        continue
                    (arcs if len(toks) == 1 else chains).append((s, i, len(rows_tokens)))
                    rows_states.append(st)
                    rows_tokens.append(toks[0])
            if not rows_tokens:
                lps: list[float] = []
                after: list[LookupState] = []
            else:
                lps, after = lookup.score_next(rows_states, rows_tokens)
                self.computed += len(rows_tokens)
            for f, row in ends:
                self._final_lm[f] = lps[row]
            pending: list[tuple[int, int, float, LookupState]] = [
                (s, i, 0.0, states.rep_state[s]) if row < 0 else (s, i, lps[row], after[row])
                for s, i, row in arcs
            ]
            # Words of several tokens: their later tokens, one call per position, finished
            # arcs handed on shortest first (the order the distribution way hands them on).
            live: list[list[Any]] = [[s, i, lps[row], after[row]] for s, i, row in chains]
            position = 1
            while live:
                step = [c for c in live if len(tokens_of[c[1]]) > position]
                done = [c for c in live if len(tokens_of[c[1]]) <= position]
                pending.extend((c[0], c[1], c[2], c[3]) for c in done)
                if step:
                    more, moved = lookup.score_next(
                        [c[3] for c in step], [tokens_of[c[1]][position] for c in step]
                    )
                    self.computed += len(step)
                    for c, lp, st in zip(step, more, moved, strict=True):
                        c[2] = float(c[2]) + lp
                        c[3] = st
                live = step
                position += 1
            for s, i, lm, st in pending:
                self._arrive(s, i, lm, (lat.dst[i], st), (), 0, (st, -1, None))
            if rows_tokens:
                yield

    def _arrive(
        self,
        s: int,
        i: int,
        lm: float,
        key: tuple[int, Hashable],
        recent: tuple[int, ...],
        history: int,
        rep: tuple[State, int, FloatArray | None],
    ) -> None:
        """Arc i out of state s (LM log-prob lm) leads to the state `key` (its target node and
        history key): a new one, or one it merges into (which keeps its best history's way
        in)."""
        lat, p, states = self.lattice, self.params, self._states
        weight = self._w_static[i] + p.lm_weight * lm
        score = states.score[s] + weight
        found = self._index.get(key)
        if found is None:
            found = states.add(lat.dst[i], recent, history, score, rep)
            self._index[key] = found
            self._by_wave.setdefault(self._wave[lat.dst[i]], []).append(found)
            if len(states.node) > p.max_states:
                raise RequestTooLarge(
                    lat.where,
                    len(states.node),
                    p.max_states,
                    "(node, history) states when expanded (lattice_max_states; a "
                    "lower max_history or a beam expands fewer)",
                )
        else:
            if states.history[found] != history and self.history_key is None:
                self.exact = False  # two different histories share one model state
            if score > states.score[found]:
                states.score[found] = score
                states.recent[found] = recent
                states.history[found] = history
                states.rep_state[found] = rep[0]
                states.rep_token[found] = rep[1]
                states.rep_dist[found] = rep[2]
        arcs = self._arcs
        arcs.src.append(s)
        arcs.dst.append(found)
        arcs.arc.append(i)
        arcs.lm.append(lm)
        arcs.weight.append(weight)

    def _finish(self) -> None:
        """The paths through the expansion, and its size."""
        states, a = self._states, self._arcs
        alive = [s for s in self._order if states.alive[s]]
        arcs = (a.src, a.dst, a.arc, a.lm, a.weight)
        paths = _best_paths(self, alive, arcs, self._final_states, self._final_lm, states)
        graph = None
        if self.params.expanded:
            graph = _expanded_graph(
                alive, states, (a.src, a.dst, a.arc, a.lm), self._final_states, self._final_lm
            )
        self.result = RescoredPaths(
            paths,
            len(alive),
            sum(
                1 for x, y in zip(a.src, a.dst, strict=True) if states.alive[x] and states.alive[y]
            ),
            self.exact,
            self.computed,
            graph,
        )

    def _pruned(self, states: _States, members: list[int]) -> list[int]:
        """The wave's states within `beam` of the best at their lattice node."""
        beam = self.params.beam
        if beam is None:
            return members
        best: dict[int, float] = {}
        for s in members:
            node = states.node[s]
            best[node] = max(best.get(node, -np.inf), states.score[s])
        kept = []
        for s in members:
            if states.score[s] >= best[states.node[s]] - beam:
                kept.append(s)
            else:
                states.alive[s] = False
                states.rep_state[s] = states.rep_dist[s] = None
                self.exact = False
        return kept

    def _chains(
        self, chains: list[tuple[int, int, float, State]], tokens_of: list[list[int]]
    ) -> Iterator[tuple[int, int, float, State, None] | None]:
        """Arcs of several tokens: their inner tokens stepped (one batched call per position
        across the wave, yielding None after each), each arc's log-prob summed, and the state
        before its last token handed on (the target steps that one)."""
        live = [[s, i, lm, st] for s, i, lm, st in chains]
        position = 1
        while live:
            step = [c for c in live if len(tokens_of[c[1]]) > position]
            done = [c for c in live if len(tokens_of[c[1]]) <= position]
            for s, i, lm, st in done:
                yield (s, i, lm, st, None)
            for lo in range(0, len(step), self.params.rows_per_step):
                chunk = step[lo : lo + self.params.rows_per_step]
                merged = self.stepper.merge([c[3] for c in chunk])
                fed = np.array([tokens_of[c[1]][position - 1] for c in chunk])
                out, after = self.stepper.step(fed, merged)
                self.computed += len(chunk)
                for row, (c, st) in enumerate(zip(chunk, self.stepper.split(after), strict=True)):
                    c[2] = float(c[2]) + float(out[row][tokens_of[c[1]][position]])
                    c[3] = st
                yield None
            live = step
            position += 1


def _best_paths(
    expansion: LatticeExpansion,
    order: list[int],
    arcs: tuple[list[int], list[int], list[int], list[float], list[float]],
    final_states: list[int],
    final_lm: list[float],
    states: _States,
) -> list[FoundPath]:
    """The `paths` best paths: k best partial paths per state in wave order, each kept as
    (score, expanded arc in, rank of its source's partial path)."""
    lat, p = expansion.lattice, expansion.params
    e_src, e_dst, e_arc, e_lm, e_w = arcs
    k = max(1, p.paths)
    incoming: dict[int, list[int]] = {}
    for j, (a, b) in enumerate(zip(e_src, e_dst, strict=True)):
        if states.alive[a] and states.alive[b]:
            incoming.setdefault(b, []).append(j)
    best: dict[int, list[tuple[float, int, int]]] = {}
    for s in order:
        ins = incoming.get(s)
        if ins is None:  # the start (every other live state has an arc in)
            best[s] = [(0.0, -1, -1)]
            continue
        candidates = [
            (score + e_w[j], j, r)
            for j in ins
            for r, (score, _, _) in enumerate(best.get(e_src[j], []))
        ]
        best[s] = heapq.nlargest(k, candidates, key=_FIRST)
    finals = expansion._finals
    ends: list[tuple[float, int, int, int]] = []
    for f, s in enumerate(final_states):
        if not states.alive[s]:
            continue
        i = finals[states.node[s]]
        weight = (
            p.acoustic_scale * lat.final_acoustic[i]
            + p.old_lm_weight * lat.final_old_lm[i]
            + p.lm_weight * final_lm[f]
        )
        for r, (score, _, _) in enumerate(best.get(s, [])):
            ends.append((score + weight, f, s, r))
    found: list[FoundPath] = []
    for combined, f, s, r in heapq.nlargest(k, ends, key=_FIRST):
        i = finals[states.node[s]]
        taken: list[int] = []
        lm = final_lm[f]
        while True:
            _, j, r = best[s][r]
            if j < 0:
                break
            taken.append(e_arc[j])
            lm += e_lm[j]
            s = e_src[j]
        taken.reverse()
        found.append(
            FoundPath(
                arcs=taken,
                combined=combined,
                acoustic=sum(lat.acoustic[a] for a in taken) + lat.final_acoustic[i],
                lm=lm,
                old_lm=sum(lat.old_lm[a] for a in taken) + lat.final_old_lm[i],
                words=sum(lat.word_counts[a] for a in taken),
                oov=sum(lat.oov_counts[a] for a in taken) if lat.oov_counts else 0,
            )
        )
    return found


def _expanded_graph(
    order: list[int],
    states: _States,
    arcs: tuple[list[int], list[int], list[int], list[float]],
    final_states: list[int],
    final_lm: list[float],
) -> ExpandedGraph:
    """The live part of the expansion, states renumbered in wave order (the start first)."""
    number = {s: n for n, s in enumerate(order)}
    e_src, e_dst, e_arc, e_lm = arcs
    keep = [j for j in range(len(e_src)) if e_src[j] in number and e_dst[j] in number]
    ends = [f for f, s in enumerate(final_states) if s in number]
    return ExpandedGraph(
        node_of=[states.node[s] for s in order],
        src=[number[e_src[j]] for j in keep],
        dst=[number[e_dst[j]] for j in keep],
        arc=[e_arc[j] for j in keep],
        lm=[e_lm[j] for j in keep],
        final_states=[number[final_states[f]] for f in ends],
        final_lm=[final_lm[f] for f in ends],
    )
