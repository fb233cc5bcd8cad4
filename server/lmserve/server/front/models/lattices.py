"""Rescoring lattices on a served model: words to model tokens here, the expansion on the
model's engine, bias and the rescored lattice's text here.

    inputs = [LatticeInput(graph, LatticeFormat.KALDI_TEXT, "utt1", "lattices[0]")]
    found = await rescore_lattices(served, inputs, LatticeParams(paths=10), None, None, None)
    found.lattices[0].paths[0].words, found.lattices[0].exact, found.computed

Each distinct word of the request is tokenized once by the model's tokenizer (a word model's
word is one token, `<unk>` when unknown; a subword model's the word's pieces), so a path's LM
score is Score's of its words joined by spaces. The engine (`EngineCore.rescore_lattices`)
expands and finds the paths (`decoding.lattice.expand`); with a bias list it returns
`lattice_bias_candidates` paths by the unbiased score (or `nbest`, when more), which are
biased as Rerank biases a hypothesis (`decoding.bias`, the path's words as its text) and
re-ranked here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from lmserve.server.decoding.bias import PhraseBias
from lmserve.server.decoding.lattice.expand import (
    ExpandedGraph,
    FoundPath,
    LatticeParams,
    TokenLattice,
)
from lmserve.server.decoding.lattice.formats import LatticeFormat, write_lattice
from lmserve.server.decoding.lattice.graph import LatticeGraph, is_word
from lmserve.server.front.models.biasing import bias_matches
from lmserve.server.front.models.served_model import ServedModel, TextInput


@dataclass(frozen=True)
class LatticeInput:
    """One request lattice: its graph, format, the caller's id, and its field path."""

    graph: LatticeGraph
    kind: LatticeFormat
    id: str
    where: str


@dataclass(frozen=True)
class LatticePathResult:
    """A path as the response gives it: its words, input arcs and scores (nats)."""

    words: list[str]
    found: FoundPath
    combined: float
    bias: float


@dataclass(frozen=True)
class LatticeResult:
    id: str
    paths: list[LatticePathResult]
    text: str  # the rescored lattice in its format ("" unless asked for)
    nodes: int
    arcs: int
    expanded_nodes: int
    expanded_arcs: int
    exact: bool


@dataclass(frozen=True)
class LatticesResult:
    lattices: list[LatticeResult]
    computed: int


def _token_lattice(
    graph: LatticeGraph, where: str, tokens: dict[str, tuple[list[int], int]]
) -> TokenLattice:
    offsets = [0]
    ids: list[int] = []
    oov: list[int] = []
    for word in graph.words:
        found, unknown = tokens.get(word, ([], 0))
        ids.extend(found)
        offsets.append(len(ids))
        oov.append(unknown)
    finals = sorted(graph.finals)
    return TokenLattice(
        nodes=graph.nodes,
        start=graph.start,
        src=list(graph.src),
        dst=list(graph.dst),
        token_offsets=offsets,
        tokens=ids,
        word_counts=[1 if is_word(w) else 0 for w in graph.words],
        acoustic=list(graph.acoustic),
        old_lm=list(graph.old_lm),
        final_nodes=finals,
        final_acoustic=[graph.finals[n][0] for n in finals],
        final_old_lm=[graph.finals[n][1] for n in finals],
        where=where,
        oov_counts=oov,
    )


def _word_tokens(
    served: ServedModel, graphs: list[LatticeGraph]
) -> dict[str, tuple[list[int], int]]:
    """Each distinct word's model tokens and how many of them are unknown, by the model's
    tokenizer (one batch)."""
    words = sorted({w for g in graphs for w in g.words if is_word(w)})
    if not words:
        return {}
    batch = served.codec.encode_texts(words)
    bounds = np.asarray(batch.offsets).tolist()
    ids = np.asarray(batch.ids).tolist()
    oov = np.asarray(batch.oov, dtype=bool)
    return {
        word: (ids[a:b], int(oov[a:b].sum()))
        for word, a, b in zip(words, bounds, bounds[1:], strict=False)
    }


async def rescore_lattices(
    served: ServedModel,
    inputs: list[LatticeInput],
    params: LatticeParams,
    bias: PhraseBias | None,
    symbols: dict[int, str] | None,
    deadline: float | None,
    *,
    bias_candidates: int = 100,
) -> LatticesResult:
    """Every lattice rescored on `served`'s engine, its `params.paths` best paths first; with
    a bias list, the best of `bias_candidates` (or more) unbiased paths once biased."""
    nbest = params.paths
    tokens = _word_tokens(served, [i.graph for i in inputs])
    jobs = [_token_lattice(i.graph, f"{i.where} (id {i.id!r})", tokens) for i in inputs]
    if bias is not None:
        params = replace(params, paths=max(nbest, bias_candidates))
    found = await served.rescore_lattices(jobs, params, deadline)
    results: list[LatticeResult] = []
    computed = 0
    for given, rescored in zip(inputs, found, strict=True):
        computed += rescored.computed
        paths = [
            LatticePathResult(given.graph.path_words(p.arcs), p, p.combined, 0.0)
            for p in rescored.paths
        ]
        if bias is not None and paths:
            texts = TextInput(texts=[" ".join(p.words) for p in paths])
            boosts = [m.boost for m in bias_matches(served.codec, bias, texts)]
            paths = [
                replace(p, combined=p.combined + b, bias=b)
                for p, b in zip(paths, boosts, strict=True)
            ]
            paths.sort(key=lambda p: -p.combined)  # stable: ties keep the unbiased order
        text = ""
        if rescored.graph is not None:
            text = rescored_text(given, rescored.graph, symbols)
        results.append(
            LatticeResult(
                given.id,
                paths[:nbest],
                text,
                given.graph.nodes,
                given.graph.arcs,
                rescored.expanded_nodes,
                rescored.expanded_arcs,
                rescored.exact,
            )
        )
    return LatticesResult(results, computed)


def rescored_text(
    given: LatticeInput, expanded: ExpandedGraph, symbols: dict[int, str] | None
) -> str:
    """The expanded lattice in the input's format: a node per (lattice node, history), each arc
    with its input arc's word and acoustic score and the model's LM log-prob in place of the
    old LM score; final weights carry the `</s>` log-prob in place of theirs."""
    graph = given.graph
    final_of = dict(zip(expanded.final_states, expanded.final_lm, strict=True))
    out = LatticeGraph(
        nodes=len(expanded.node_of),
        start=0,
        finals={
            s: (graph.finals[expanded.node_of[s]][0], lm) for s, lm in sorted(final_of.items())
        },
    )
    for a, b, arc in zip(expanded.src, expanded.dst, expanded.arc, strict=True):
        extra = graph.arc_extras[arc] if graph.arc_extras else ""
        out.add_arc(a, b, graph.words[arc], acoustic=graph.acoustic[arc], old_lm=0.0, extra=extra)
    extras = dict(graph.extras)
    final_ids = extras.get("final_ids")
    if isinstance(final_ids, dict):
        extras["final_ids"] = {s: final_ids.get(expanded.node_of[s], "") for s in final_of}
    out.extras = extras
    return write_lattice(given.kind, out, symbols, lm=list(expanded.lm), node_of=expanded.node_of)
