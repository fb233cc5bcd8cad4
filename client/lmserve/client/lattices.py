"""RescoreLattice's request and result for the client: lattice texts in, paths and rescored
lattices out (plain dataclasses; the server's figures in nats).

    request = lattice_request("kjv-5gram", [LatticeText(text, "kaldi")], nbest=5)
    result = RescoredLattices.from_proto(stub.RescoreLattice(request))
    result.lattices[0].paths[0].text, result.lattices[0].exact
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict, Unpack

from lmserve.v1 import lm_service_pb2 as pb

FORMATS = {"slf": pb.LATTICE_FORMAT_HTK_SLF, "kaldi": pb.LATTICE_FORMAT_KALDI_TEXT}


@dataclass(frozen=True)
class LatticeText:
    """One lattice: its text, its format (`slf`: HTK SLF, `kaldi`: Kaldi text) and an id
    (Kaldi's key is used when empty)."""

    text: str
    format: str = "kaldi"
    id: str = ""

    def to_proto(self) -> pb.Lattice:
        kind = FORMATS.get(self.format)
        if kind is None:
            raise ValueError(f"lattice format {self.format!r}: use 'slf' or 'kaldi'")
        return pb.Lattice(id=self.id, format=kind, text=self.text)


class LatticeOptions(TypedDict, total=False):
    """RescoreLattice's options, by keyword (see `LmServeClient.rescore_lattice`): named once
    here for `lattice_request` and both clients; `OPTION_DEFAULTS` holds the defaults."""

    words: str
    acoustic_scale: float
    lm_weight: float
    old_lm_weight: float
    word_insertion_penalty: float
    nbest: int
    max_history: int | None
    beam: float | None
    return_lattice: bool
    bias: dict[str, float] | None


# The options whose default is not the message's own (the rest: "", 0, false, unset).
OPTION_DEFAULTS: LatticeOptions = {"acoustic_scale": 1.0, "lm_weight": 1.0, "nbest": 1}
# Options that are left unset on the message when None (the server's default then).
UNSET_WHEN_NONE = ("max_history", "beam")


def lattice_request(
    model: str, lattices: Sequence[LatticeText], **options: Unpack[LatticeOptions]
) -> pb.RescoreLatticeRequest:
    """The request (see `LmServeClient.rescore_lattice`); an unknown option is a TypeError,
    as a keyword argument no function takes."""
    unknown = sorted(set(options) - LatticeOptions.__optional_keys__)
    if unknown:
        raise TypeError(f"rescore_lattice() got unexpected keyword arguments: {unknown}")
    fields: dict[str, Any] = {**OPTION_DEFAULTS, **options}
    bias = fields.pop("bias", None)
    for name in UNSET_WHEN_NONE:
        if fields.get(name) is None:
            fields.pop(name, None)
    request = pb.RescoreLatticeRequest(
        model=model, lattices=[lattice.to_proto() for lattice in lattices], **fields
    )
    if bias:
        request.bias.CopyFrom(
            pb.BiasList(phrases=[pb.BiasPhrase(phrase=p, boost=b) for p, b in bias.items()])
        )
    return request


@dataclass(frozen=True)
class LatticePath:
    """A path: its words, combined score and its parts (nats), and the input arcs on it."""

    words: list[str]
    text: str
    combined_score: float
    acoustic_score: float
    lm_log_prob: float
    old_lm_score: float
    word_count: int
    oov_count: int
    bias: float
    arcs: list[int]


@dataclass(frozen=True)
class RescoredLattice:
    id: str
    paths: list[LatticePath]
    lattice: str  # the rescored lattice in its input format, when asked for
    nodes: int
    arcs: int
    expanded_nodes: int
    expanded_arcs: int
    exact: bool


@dataclass(frozen=True)
class RescoredLattices:
    model: str
    lattices: list[RescoredLattice] = field(default_factory=list)
    computed_tokens: int = 0

    @classmethod
    def from_proto(cls, response: pb.RescoreLatticeResponse) -> RescoredLattices:
        return cls(
            response.model,
            [
                RescoredLattice(
                    lattice.id,
                    [
                        LatticePath(
                            list(p.words),
                            p.text,
                            p.combined_score,
                            p.acoustic_score,
                            p.lm_log_prob,
                            p.old_lm_score,
                            p.word_count,
                            p.oov_count,
                            p.bias,
                            list(p.arcs),
                        )
                        for p in lattice.paths
                    ],
                    lattice.lattice,
                    lattice.nodes,
                    lattice.arcs,
                    lattice.expanded_nodes,
                    lattice.expanded_arcs,
                    lattice.exact,
                )
                for lattice in response.lattices
            ],
            response.computed_tokens,
        )
