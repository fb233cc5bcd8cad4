"""HTK Standard Lattice Format: read into a `LatticeGraph`, written back.

    graph = read_slf(text)      # LatticeSyntaxError names the line
    text = write_slf(graph)

A header (`VERSION=`, `UTTERANCE=`, `base=`, `start=`, `end=`, `N=` / `NODES=`, `L=` /
`LINKS=`, ...), then node lines (`I=3 t=0.42 W=word`) and link lines (`J=0 S=0 E=3 W=word
a=-212.4 l=-4.1`); fields are `name=value` pairs separated by blanks, a `#` line is a comment.
A link's word is its `W=`, else its end node's (HTK puts words on nodes or on links). `a=` and
`l=` are log-likelihoods in base `base` (e when absent), read as natural logs; `base=0` (linear
scores) is refused. Without `start=` / `end=` the start is the one node no link enters and the
finals the nodes no link leaves.
"""

from __future__ import annotations

import math

from lmserve.server.decoding.lattice.graph import LatticeGraph, LatticeSyntaxError

_LONG = {
    "NODES": "N",
    "LINKS": "L",
    "START": "S",
    "END": "E",
    "WORD": "W",
    "acoustic": "a",
    "language": "l",
    "time": "t",
}


def _fields(line: str, number: int) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in line.split():
        name, eq, value = part.partition("=")
        if not eq or not name:
            raise LatticeSyntaxError("expected name=value fields", number, part)
        value = value.strip('"') if len(value) > 1 and value[0] == value[-1] == '"' else value
        out[_LONG.get(name, name)] = value
    return out


def _int(fields: dict[str, str], name: str, number: int) -> int:
    try:
        return int(fields[name])
    except ValueError:
        raise LatticeSyntaxError(f"{name}= is not an integer", number, fields[name]) from None


def _float(fields: dict[str, str], name: str, number: int, scale: float) -> float:
    text = fields.get(name)
    if text is None:
        return 0.0
    try:
        value = float(text) * scale
    except ValueError:
        raise LatticeSyntaxError(f"{name}= is not a number", number, text) from None
    if not math.isfinite(value):
        raise LatticeSyntaxError(f"{name}= is not finite", number, text)
    return value


def read_slf(text: str) -> LatticeGraph:
    """The lattice of an SLF text (see the module doc)."""
    header: list[str] = []
    scale = 1.0
    start = end = -1
    node_words: dict[int, str] = {}
    times: dict[int, str] = {}
    links: list[tuple[int, dict[str, str]]] = []
    max_node = -1
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = _fields(line, number)
        if "J" in fields:
            for name in ("S", "E"):
                if name not in fields:
                    raise LatticeSyntaxError(f"the link has no {name}=", number, line)
            links.append((number, fields))
        elif "I" in fields:
            node = _int(fields, "I", number)
            if node < 0:
                raise LatticeSyntaxError("a node number is negative", number, line)
            max_node = max(max_node, node)
            if "W" in fields:
                node_words[node] = fields["W"]
            if "t" in fields:
                times[node] = fields["t"]
        else:
            if "base" in fields:
                base = float(fields["base"]) if _is_number(fields["base"]) else -1.0
                if base <= 0 or base == 1:
                    raise LatticeSyntaxError(
                        "base= must be a number > 0 other than 1 (linear "
                        "scores, base=0, are not read)",
                        number,
                        line,
                    )
                scale = math.log(base)
            if "start" in fields:
                start = _int(fields, "start", number)
            if "end" in fields:
                end = _int(fields, "end", number)
            header.append(line)
    declared = max_node + 1
    for number, fields in links:
        for name in ("S", "E"):
            if _int(fields, name, number) >= declared:
                raise LatticeSyntaxError(
                    f"the link's {name}={fields[name]} names no node line "
                    f"(nodes 0..{declared - 1})",
                    number,
                )
    if declared <= 0:
        raise LatticeSyntaxError("the lattice has no node lines (I=)")
    graph = LatticeGraph(nodes=declared, start=0, finals={})
    has_in = [False] * declared
    has_out = [False] * declared
    for number, fields in links:
        a, b = _int(fields, "S", number), _int(fields, "E", number)
        if a < 0 or b < 0:
            raise LatticeSyntaxError("a link names a negative node", number)
        has_out[a] = has_in[b] = True
        word = fields.get("W", node_words.get(b, "!NULL"))
        graph.add_arc(
            a,
            b,
            word,
            acoustic=_float(fields, "a", number, scale),
            old_lm=_float(fields, "l", number, scale),
        )
    if start < 0:
        starts = [n for n in range(declared) if not has_in[n]]
        if len(starts) != 1:
            raise LatticeSyntaxError(
                f"no start= and {len(starts)} nodes that no link enters; give start="
            )
        start = starts[0]
    graph.start = start
    if end >= 0:
        graph.finals = {end: (0.0, 0.0)}
    else:
        graph.finals = {n: (0.0, 0.0) for n in range(declared) if not has_out[n] and n != start}
    graph.extras = {"header": header, "times": times}
    return graph


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _word(word: str) -> str:
    """A word as SLF writes it: quoted when it holds a blank or a quote would be misread."""
    return f'"{word}"' if any(c.isspace() for c in word) else word


def write_slf(
    graph: LatticeGraph,
    *,
    lm: list[float] | None = None,
    node_of: list[int] | None = None,
) -> str:
    """The lattice as SLF: natural-log scores (`base=` is not written), words on links,
    `start=` and `end=` in the header when there is one final node (else an extra `!NULL`
    end node is added, linked from each final node with its final weights). `lm` replaces
    the links' `l=` (a rescored lattice); `node_of` maps each node to the input node whose
    time it takes (an expanded lattice's nodes)."""
    header = [
        h
        for h in _list(graph.extras.get("header"))
        if not _sets(h, ("base", "start", "end", "N", "L", "NODES", "LINKS"))
    ]
    times = graph.extras.get("times")
    times = times if isinstance(times, dict) else {}
    finals = dict(graph.finals)
    arcs = list(range(graph.arcs))
    nodes = graph.nodes
    extra_links: list[tuple[int, int, float, float]] = []
    if len(finals) == 1 and next(iter(finals.values())) == (0.0, 0.0):
        end = next(iter(finals))
    else:
        end = nodes
        nodes += 1
        extra_links = [(n, end, ac, old) for n, (ac, old) in sorted(finals.items())]
    lines = [*header, f"start={graph.start} end={end}"]
    lines.append(f"N={nodes} L={graph.arcs + len(extra_links)}")
    for n in range(nodes):
        source = node_of[n] if node_of is not None and n < len(node_of) else n
        t = times.get(source)
        lines.append(f"I={n}" + (f" t={t}" if t is not None else ""))
    scores = graph.old_lm if lm is None else lm
    for j in arcs:
        lines.append(
            f"J={j} S={graph.src[j]} E={graph.dst[j]} W={_word(graph.words[j])} "
            f"a={graph.acoustic[j]!r} l={scores[j]!r}"
        )
    for k, (a, b, ac, old) in enumerate(extra_links, start=graph.arcs):
        lines.append(f"J={k} S={a} E={b} W=!NULL a={ac!r} l={old!r}")
    return "\n".join(lines) + "\n"


def _list(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


def _sets(line: str, names: tuple[str, ...]) -> bool:
    """Whether a header line sets one of `names` (those the writer writes itself)."""
    return any(part.partition("=")[0] in names for part in line.split())
