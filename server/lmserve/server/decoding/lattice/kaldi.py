"""Kaldi's text lattices (`lattice-copy ark:in.lats ark,t:-`): read into a `LatticeGraph`,
written back.

    symbols = read_symbols(words_txt)          # `word id` lines -> {id: word}
    graph = read_kaldi(text, symbols)          # LatticeSyntaxError names the line
    text = write_kaldi(graph, symbols)

The first line is the utterance key, then one line per arc or final state, the lattice ending
at a blank line or the text's end (one lattice per text):

    src dst word graph_cost,acoustic_cost[,transition_ids]     (a compact lattice's arc)
    src dst ilabel olabel graph_cost,acoustic_cost             (a lattice's arc: olabel read)
    state [graph_cost,acoustic_cost[,transition_ids]]          (a final state)

An arc without a weight has costs 0. The start is the first arc's source (OpenFst's text
format). Costs are negated natural-log likelihoods: the graph cost is read as the old LM score
(-graph_cost) and the acoustic cost as -acoustic_cost. Labels are word ids mapped through the
symbol table when one is given, else the words themselves; `0` and `<eps>` are epsilons.
"""

from __future__ import annotations

import math

from lmserve.server.decoding.lattice.graph import LatticeGraph, LatticeSyntaxError


def read_symbols(text: str) -> dict[int, str]:
    """A `words.txt` symbol table (`word id` per line) as {id: word}."""
    table: dict[int, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        parts = raw.split()
        if not parts:
            continue
        if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
            raise LatticeSyntaxError("a symbol table line is `word id`", number, raw)
        table[int(parts[1])] = parts[0]
    return table


def _weight(text: str, number: int) -> tuple[float, float, str]:
    """`graph,acoustic[,ids]` -> (old LM log-prob, acoustic log-likelihood, ids)."""
    parts = text.split(",", 2)
    if len(parts) < 2:
        raise LatticeSyntaxError("a weight is graph_cost,acoustic_cost", number, text)
    try:
        graph, acoustic = float(parts[0]), float(parts[1])
    except ValueError:
        raise LatticeSyntaxError("a cost is not a number", number, text) from None
    if not (math.isfinite(graph) and math.isfinite(acoustic)):
        raise LatticeSyntaxError("a cost is not finite", number, text)
    return -graph + 0.0, -acoustic + 0.0, parts[2] if len(parts) == 3 else ""


def _state(text: str, number: int) -> int:
    if not text.isdigit():
        raise LatticeSyntaxError("a state is a number >= 0", number, text)
    return int(text)


def read_kaldi(text: str, symbols: dict[int, str] | None = None) -> LatticeGraph:
    """The lattice of a Kaldi text lattice (see the module doc)."""
    key: str | None = None
    arcs: list[tuple[int, int, str, float, float, str]] = []
    finals: dict[int, tuple[float, float]] = {}
    final_ids: dict[int, str] = {}
    ended = 0
    first_state = -1
    for number, raw in enumerate(text.splitlines(), start=1):
        parts = raw.split()
        if not parts:
            if key is not None and (arcs or finals):
                ended = number
            continue
        if ended:
            raise LatticeSyntaxError(
                "a second lattice after the blank line that ended the first; send one "
                "lattice per Lattice message",
                number,
                raw,
            )
        if key is None:
            if len(parts) != 1:
                raise LatticeSyntaxError("the first line is the utterance key", number, raw)
            key = parts[0]
            continue
        if first_state < 0:
            first_state = _state(parts[0], number)
        if len(parts) in (1, 2):
            state = _state(parts[0], number)
            old, ac, ids = _weight(parts[1], number) if len(parts) == 2 else (0.0, 0.0, "")
            finals[state] = (ac, old)
            final_ids[state] = ids
            continue
        if len(parts) > 5:
            raise LatticeSyntaxError("an arc line has at most 5 fields", number, raw)
        src, dst = _state(parts[0], number), _state(parts[1], number)
        weight = "0,0"
        if len(parts) == 3:
            label = parts[2]
        elif len(parts) == 4 and "," in parts[3]:
            label, weight = parts[2], parts[3]
        else:
            label = parts[3]  # a lattice's olabel (word) after its ilabel
            weight = parts[4] if len(parts) == 5 else "0,0"
        old, ac, ids = _weight(weight, number)
        arcs.append((src, dst, _label(label, symbols, number), ac, old, ids))
    if key is None:
        raise LatticeSyntaxError("the text is empty: no utterance key, no arcs")
    if not arcs:
        raise LatticeSyntaxError("the lattice has no arcs")
    nodes = 1 + max(max(a for a, *_ in arcs), max(b for _, b, *_ in arcs), *finals.keys(), 0)
    graph = LatticeGraph(nodes=nodes, start=first_state, finals=finals)
    for src, dst, word, ac, old, ids in arcs:
        graph.add_arc(src, dst, word, acoustic=ac, old_lm=old, extra=ids)
    graph.extras = {"key": key, "final_ids": final_ids}
    return graph


def _label(label: str, symbols: dict[int, str] | None, number: int) -> str:
    if symbols is None:
        return "<eps>" if label == "0" else label
    if not label.isdigit():
        raise LatticeSyntaxError("with a symbol table, a word label is an id", number, label)
    word = symbols.get(int(label))
    if word is None:
        raise LatticeSyntaxError(f"word id {label} is not in the symbol table", number)
    return word


def _cost(value: float) -> str:
    """A cost as text: -0.0 written as 0 (Kaldi never writes a negative zero)."""
    cost = -value + 0.0
    return repr(cost)


def write_kaldi(
    graph: LatticeGraph,
    symbols: dict[int, str] | None = None,
    *,
    lm: list[float] | None = None,
) -> str:
    """The lattice as a Kaldi text lattice (compact: `src dst word graph,acoustic[,ids]`);
    labels written as ids when a symbol table is given. `lm` replaces each arc's old LM
    score (a rescored lattice: the graph cost is then -lm)."""
    ids = None if symbols is None else {word: i for i, word in symbols.items()}
    key = str(graph.extras.get("key", "lattice"))
    lines = [key]
    scores = graph.old_lm if lm is None else lm
    extras = graph.arc_extras or [""] * graph.arcs
    for j in range(graph.arcs):
        word = graph.words[j]
        label = word if ids is None else str(ids.get(word, 0))
        if ids is None and word == "<eps>":
            label = "0"
        tail = f",{extras[j]}" if extras[j] else ""
        lines.append(
            f"{graph.src[j]} {graph.dst[j]} {label} "
            f"{_cost(scores[j])},{_cost(graph.acoustic[j])}{tail}"
        )
    final_ids = graph.extras.get("final_ids")
    final_ids = final_ids if isinstance(final_ids, dict) else {}
    for node in sorted(graph.finals):
        ac, old = graph.finals[node]
        tail = f",{final_ids[node]}" if final_ids.get(node) else ""
        lines.append(f"{node} {_cost(old)},{_cost(ac)}{tail}")
    return "\n".join(lines) + "\n\n"
