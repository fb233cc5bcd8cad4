"""RescoreLattice: lattices in (HTK SLF or Kaldi text), their best paths, n-best lists and
rescored lattices out.

    response = await rescore_lattice(served_models, limits, request, deadline)

Every field is checked and every lattice read before any work starts: a lattice that is not one
(an unknown format, a line that does not parse, an arc to a missing node, no start or final
node, a cycle) is INVALID_ARGUMENT naming `lattices[i]`, its id and the line; one past the size
limits (`max_lattices`, `max_lattice_nodes`, `max_lattice_arcs`, `max_lattice_nbest`; the
engine checks `max_lattice_states`) is RESOURCE_EXHAUSTED. The work is
`front.models.lattices.rescore_lattices`; this module converts the message to its plain types
and the result back.
"""

from __future__ import annotations

import asyncio

from lmserve.server.decoding.lattice.expand import LatticeParams
from lmserve.server.decoding.lattice.formats import LatticeFormat, read_lattice
from lmserve.server.decoding.lattice.graph import LatticeSyntaxError
from lmserve.server.decoding.lattice.kaldi import read_symbols
from lmserve.server.decoding.params import finite
from lmserve.server.errors import InvalidArgument, RequestTooLarge, clip_repr
from lmserve.server.front.api.bias import StreamBias
from lmserve.server.front.api.model_use import use_model
from lmserve.server.front.api.validation import validate_options
from lmserve.server.front.models.lattices import LatticeInput, LatticesResult, rescore_lattices
from lmserve.server.front.models.served_models import ServedModels
from lmserve.server.settings import RequestLimits
from lmserve.v1 import lm_service_pb2 as pb

_FORMATS = {
    pb.LATTICE_FORMAT_HTK_SLF: LatticeFormat.HTK_SLF,
    pb.LATTICE_FORMAT_KALDI_TEXT: LatticeFormat.KALDI_TEXT,
}
# Lattice texts longer than this are read off the event loop.
_INLINE_CHARS = 65_536


def lattice_params(request: pb.RescoreLatticeRequest, limits: RequestLimits) -> LatticeParams:
    """The weights and knobs, checked (absent ones at their documented defaults)."""

    def weight(name: str, default: float) -> float:
        return finite(name, getattr(request, name)) if request.HasField(name) else default

    nbest = request.nbest if request.HasField("nbest") else 1
    if nbest < 1:
        raise InvalidArgument("nbest", f"{nbest} paths; ask for 1 or more")
    if nbest > limits.max_lattice_nbest:
        raise RequestTooLarge("nbest", nbest, limits.max_lattice_nbest, "paths asked for")
    history = request.max_history if request.HasField("max_history") else None
    if history is not None and history < 1:
        raise InvalidArgument("max_history", f"{history} tokens; merge at 1 or more")
    beam = request.beam if request.HasField("beam") else None
    if beam is not None and not (finite("beam", beam) >= 0):
        raise InvalidArgument("beam", f"{beam} nats; a beam is 0 or more")
    options = validate_options(request)
    return LatticeParams(
        acoustic_scale=weight("acoustic_scale", 1.0),
        lm_weight=weight("lm_weight", 1.0),
        old_lm_weight=finite("old_lm_weight", request.old_lm_weight),
        word_insertion_penalty=finite("word_insertion_penalty", request.word_insertion_penalty),
        paths=nbest,
        max_history=history if history is not None else limits.lattice_max_history,
        beam=beam,
        bos=options.bos,
        eos=options.eos,
        expanded=request.return_lattice,
        max_states=limits.max_lattice_states,
    )


def read_lattices(
    request: pb.RescoreLatticeRequest, limits: RequestLimits
) -> tuple[list[LatticeInput], dict[int, str] | None]:
    """Every lattice read and checked, and the symbol table (None when not given)."""
    if not request.lattices:
        raise InvalidArgument("lattices", "no lattices given")
    if len(request.lattices) > limits.max_lattices:
        raise RequestTooLarge("lattices", len(request.lattices), limits.max_lattices, "lattices")
    symbols = None
    if request.words:
        try:
            symbols = read_symbols(request.words)
        except LatticeSyntaxError as exc:
            raise InvalidArgument("words", str(exc)) from None
    inputs: list[LatticeInput] = []
    for i, lattice in enumerate(request.lattices):
        where = f"lattices[{i}]"
        named = f"id {clip_repr(lattice.id)}: " if lattice.id else ""
        kind = _FORMATS.get(lattice.format)
        if kind is None:
            raise InvalidArgument(
                f"{where}.format",
                f"{named}{lattice.format} is not a lattice format; use LATTICE_FORMAT_HTK_SLF "
                "or LATTICE_FORMAT_KALDI_TEXT",
            )
        # A text with more lines than a lattice may have nodes and arcs is refused unread.
        lines = lattice.text.count("\n")
        most = limits.max_lattice_nodes + limits.max_lattice_arcs + 1_000
        if lines > most:
            raise RequestTooLarge(f"{where}.text", lines, most, "lines")
        try:
            graph = read_lattice(kind, lattice.text, symbols)
            graph.check()
        except LatticeSyntaxError as exc:
            raise InvalidArgument(f"{where}.text", f"{named}{exc}") from None
        if graph.nodes > limits.max_lattice_nodes:
            raise RequestTooLarge(where, graph.nodes, limits.max_lattice_nodes, "nodes")
        if graph.arcs > limits.max_lattice_arcs:
            raise RequestTooLarge(where, graph.arcs, limits.max_lattice_arcs, "arcs")
        key = graph.extras.get("key")
        given_id = lattice.id or (key if isinstance(key, str) else "")
        inputs.append(LatticeInput(graph, kind, given_id, where))
    return inputs, symbols


async def rescore_lattice(
    models: ServedModels,
    limits: RequestLimits,
    request: pb.RescoreLatticeRequest,
    deadline: float | None,
    stream_bias: StreamBias | None = None,
) -> pb.RescoreLatticeResponse:
    """One RescoreLattice request, checked, rescored and answered (lattices in request
    order). On RescoreLatticeStream, `stream_bias` holds the stream's bias list."""
    with use_model(models, request.model) as served:
        params = lattice_params(request, limits)
        if sum(len(lattice.text) for lattice in request.lattices) > _INLINE_CHARS:
            inputs, symbols = await asyncio.to_thread(read_lattices, request, limits)
        else:
            inputs, symbols = read_lattices(request, limits)
        bias = (stream_bias or StreamBias()).bias(request, served, limits)
        candidates = limits.lattice_bias_candidates
        result = await rescore_lattices(
            served, inputs, params, bias, symbols, deadline, bias_candidates=candidates
        )
    return response_of(served.name, result)


def response_of(model: str, result: LatticesResult) -> pb.RescoreLatticeResponse:
    response = pb.RescoreLatticeResponse(model=model, computed_tokens=result.computed)
    for lattice in result.lattices:
        out = response.lattices.add(
            id=lattice.id,
            lattice=lattice.text,
            nodes=lattice.nodes,
            arcs=lattice.arcs,
            expanded_nodes=lattice.expanded_nodes,
            expanded_arcs=lattice.expanded_arcs,
            exact=lattice.exact,
        )
        for path in lattice.paths:
            found = path.found
            out.paths.add(
                words=path.words,
                text=" ".join(path.words),
                combined_score=path.combined,
                acoustic_score=found.acoustic,
                lm_log_prob=found.lm,
                old_lm_score=found.old_lm,
                word_count=found.words,
                bias=path.bias,
                arcs=found.arcs,
                oov_count=found.oov,
            )
    return response
