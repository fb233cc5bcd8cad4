"""Typed, immutable results of reranking, and the n-best lists the client sends: checked here,
before any call, so that a malformed list fails with the field path the server would name.

Log-probabilities are nats, as on the wire. Re-exported by `types.py`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmserve.v1 import lm_service_pb2 as pb

# The keys a hypothesis of the JSON-lines n-best shape may have; anything else is a typo.
_HYPOTHESIS_KEYS = frozenset({"text", "tokens", "scores"})


class NBestInputError(ValueError):
    """An n-best list given to the client is malformed; `field` is its path, as the server
    would name it (`lists[3].hypotheses[7].scores["acoustic"]`)."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


def finite_number(value: object, field: str) -> float:
    """A caller's score or weight as a float; bools, strings, NaN and infinities are refused
    because the server would refuse them too, later and with less context."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise NBestInputError(field, f"must be a number, got {type(value).__name__}")
    number = float(value)
    if not math.isfinite(number):
        raise NBestInputError(field, f"must be finite, got {number}")
    return number


def finite_scores(scores: Mapping[str, object], field: str) -> dict[str, float]:
    """`{name: number}` checked key by key, each error naming `field["name"]`."""
    if not isinstance(scores, Mapping):
        raise NBestInputError(field, f"must be a mapping of names to numbers, got {scores!r}")
    checked: dict[str, float] = {}
    for name, value in scores.items():
        if not isinstance(name, str):
            raise NBestInputError(field, f"keys must be strings, got {name!r}")
        checked[name] = finite_number(value, f'{field}["{name}"]')
    return checked


@dataclass(frozen=True, slots=True)
class NBestHypothesis:
    """One hypothesis: its `text` or its `tokens` (exactly one), and the caller's own scores
    (e.g. `{"acoustic": -1234.5}`), which the server weights and adds to the LM's."""

    text: str | None = None
    tokens: tuple[str, ...] | None = None
    scores: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    def __init__(
        self,
        text: str | None = None,
        tokens: Sequence[str] | None = None,
        scores: Mapping[str, float] | None = None,
    ) -> None:
        # Frozen and slotted: set through object.__setattr__, normalizing as we go.
        if isinstance(tokens, str | Mapping):
            raise TypeError("tokens must be a sequence of strings (scores go in scores=)")
        object.__setattr__(self, "text", text)
        object.__setattr__(self, "tokens", None if tokens is None else tuple(tokens))
        object.__setattr__(self, "scores", MappingProxyType(dict(scores or {})))

    def display(self) -> str:
        """The hypothesis as one line of text (tokens joined by spaces)."""
        return self.text if self.text is not None else " ".join(self.tokens or ())

    def checked(self, field: str) -> NBestHypothesis:
        """Itself, after the checks the wire format cannot express; errors name `field`."""
        if (self.text is None) == (self.tokens is None):
            raise NBestInputError(field, "set exactly one of text and tokens")
        if self.text is not None and not isinstance(self.text, str):
            raise NBestInputError(f"{field}.text", f"must be a string, got {self.text!r}")
        for i, token in enumerate(self.tokens or ()):
            if not isinstance(token, str):
                raise NBestInputError(f"{field}.tokens[{i}]", f"must be a string, got {token!r}")
        finite_scores(self.scores, f"{field}.scores")
        return self

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], field: str) -> NBestHypothesis:
        """From the JSON-lines shape `{"text": ..., "scores": {...}}` (or `"tokens": [...]`)."""
        if not isinstance(data, Mapping):
            raise NBestInputError(field, f"must be an object, got {type(data).__name__}")
        unknown = sorted(set(data) - _HYPOTHESIS_KEYS)
        if unknown:
            raise NBestInputError(
                f"{field}.{unknown[0]}", f"unknown field (expected {sorted(_HYPOTHESIS_KEYS)})"
            )
        tokens = data.get("tokens")
        if tokens is not None and (isinstance(tokens, str) or not isinstance(tokens, Sequence)):
            raise NBestInputError(f"{field}.tokens", "must be a list of strings")
        scores = finite_scores(data.get("scores") or {}, f"{field}.scores")
        return cls(data.get("text"), tokens, scores).checked(field)


@dataclass(frozen=True, slots=True)
class NBestList:
    """The hypotheses for one utterance. `reference` (the true text, when known) never goes to
    the server; `rerank-tune` and the benchmarks measure word error rates with it."""

    id: str
    hypotheses: tuple[NBestHypothesis, ...]
    reference: str | None = None

    def __init__(
        self,
        id: str,
        hypotheses: Sequence[NBestHypothesis],
        reference: str | None = None,
    ) -> None:
        object.__setattr__(self, "id", id)
        object.__setattr__(self, "hypotheses", tuple(hypotheses))
        object.__setattr__(self, "reference", reference)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], field: str = "list") -> NBestList:
        """From `{"id": ..., "hypotheses": [...], "reference": ...}`; other keys are ignored
        (callers keep their own metadata there)."""
        if not isinstance(data, Mapping):
            raise NBestInputError(field, f"must be an object, got {type(data).__name__}")
        list_id = data.get("id", "")
        if not isinstance(list_id, str | int) or isinstance(list_id, bool):
            raise NBestInputError(f"{field}.id", f"must be a string, got {list_id!r}")
        hypotheses = data.get("hypotheses")
        if isinstance(hypotheses, str) or not isinstance(hypotheses, Sequence):
            raise NBestInputError(f"{field}.hypotheses", "must be a list of hypotheses")
        reference = data.get("reference")
        if reference is not None and not isinstance(reference, str):
            raise NBestInputError(f"{field}.reference", f"must be a string, got {reference!r}")
        return cls(
            str(list_id),
            [
                NBestHypothesis.from_dict(h, f"{field}.hypotheses[{j}]")
                for j, h in enumerate(hypotheses)
            ],
            reference,
        )

    def to_dict(self) -> dict[str, Any]:
        """The JSON-lines shape `from_dict` reads (texts as given, tokens as lists)."""
        hyps: list[dict[str, Any]] = []
        for h in self.hypotheses:
            item: dict[str, Any] = {"text": h.text} if h.text is not None else {}
            if h.tokens is not None:
                item["tokens"] = list(h.tokens)
            item["scores"] = dict(h.scores)
            hyps.append(item)
        data: dict[str, Any] = {"id": self.id, "hypotheses": hyps}
        if self.reference is not None:
            data["reference"] = self.reference
        return data


def as_nbest_list(item: NBestList | Mapping[str, Any], field: str) -> NBestList:
    """An NBestList, or a dict of the JSON-lines shape, checked; errors name `field`."""
    if isinstance(item, NBestList):
        if not isinstance(item.id, str):
            raise NBestInputError(f"{field}.id", f"must be a string, got {item.id!r}")
        for j, hypothesis in enumerate(item.hypotheses):
            if not isinstance(hypothesis, NBestHypothesis):
                raise NBestInputError(
                    f"{field}.hypotheses[{j}]",
                    f"must be an NBestHypothesis, got {type(hypothesis).__name__}",
                )
            hypothesis.checked(f"{field}.hypotheses[{j}]")
        return item
    return NBestList.from_dict(item, field)


@dataclass(frozen=True, slots=True)
class RerankedHypothesis:
    """One hypothesis after reranking. `index` is its position in the list sent, `rank` its new
    place (0 = best; equal combined scores keep the lower index first), `lm_log_prob` the
    model's log-probability in nats (as Score gives), `length` in the request's unit."""

    index: int
    rank: int
    lm_log_prob: float
    combined_score: float
    length: int
    oov_count: int
    bias: float = 0.0
    """With a bias list: the nats its matched phrases added to `combined_score`."""
    bias_phrases: tuple[int, ...] = ()
    """With a bias list: the matched phrases, as indexes into it, in text order."""

    @classmethod
    def from_proto(cls, msg: pb.RerankedHypothesis) -> RerankedHypothesis:
        return cls(
            msg.index,
            msg.rank,
            msg.lm_log_prob,
            msg.combined_score,
            msg.length,
            msg.oov_count,
            msg.bias,
            tuple(msg.bias_phrases),
        )


@dataclass(frozen=True, slots=True)
class RerankedList:
    """One list after reranking: the request's `id`, hypotheses best first."""

    id: str
    hypotheses: tuple[RerankedHypothesis, ...]

    @property
    def best(self) -> RerankedHypothesis:
        return self.hypotheses[0]

    @classmethod
    def from_proto(cls, msg: pb.RerankedList) -> RerankedList:
        return cls(msg.id, tuple(RerankedHypothesis.from_proto(h) for h in msg.hypotheses))


class RerankedLists(list[RerankedList]):
    """The answer to one Rerank request: a plain list of RerankedList (request order) that also
    carries the response's `model`, `request_tokens` (tokens the hypotheses hold, `</s>`
    included when scored) and `computed_tokens` (tokens the model computed; fewer when shared
    prefixes are computed once)."""

    model: str
    request_tokens: int
    computed_tokens: int

    @classmethod
    def from_proto(cls, msg: pb.RerankResponse) -> RerankedLists:
        lists = cls(RerankedList.from_proto(item) for item in msg.lists)
        lists.model = msg.model
        lists.request_tokens = msg.request_tokens
        lists.computed_tokens = msg.computed_tokens
        return lists
