"""Typed, validated decoding parameters (after vLLM's `SamplingParams`), free of gRPC.

One frozen dataclass per concern. Each checks its ranges when it is built and its server limits
in `validate(...)`; both raise `InvalidArgument(field, problem)` naming the proto field path
(`sampling.top_p`, `stopping.max_new_tokens`, `n`, `beam_width`, ...). The API layer maps
absent proto fields to the defaults below before building these.

Ranges and combinations:

=====================================  ==========================================================
`sampling.temperature`                 finite, >= 0 (0 = greedy argmax)
`sampling.top_k`                       >= 0 (0 = off)
`sampling.top_p`, `sampling.typical_p` (0, 1] (1 = off)
`sampling.min_p`                       [0, 1] (0 = off)
`sampling.repetition_penalty`          [0.01, 100] (1 = off; > 1 discourages repeats)
`sampling.presence_penalty`,           [-2, 2] (0 = off; the OpenAI range)
`sampling.frequency_penalty`
`sampling.no_repeat_ngram_size`        >= 0 (0 = off)
`sampling.seed`                        [0, 2**64) or None (a random seed)
`stopping.max_new_tokens`              1 .. the server's limit
`stopping.min_new_tokens`              0 .. max_new_tokens
`stopping.stop`                        non-empty strings, at most `MAX_STOP_STRINGS`
`stopping.stop_token_ids`              ids in [0, vocabulary size) when the size is given
`n`                                    1 .. the server's limit
`top_logprobs`                         0 .. the server's limit
`beam_width`                           1 .. the server's limit
`num_return`                           1 .. beam_width
`length_penalty_alpha`                 finite, [0, 10] (>= 0 keeps the stopping bound exact)
`min_length`, `max_length`             0 <= min_length <= max_length, 1 <= max_length <= limit
=====================================  ==========================================================
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from lmserve.server.errors import InvalidArgument

LengthPenalty = Literal["none", "gnmt", "average"]
LENGTH_PENALTIES: tuple[str, ...] = ("none", "gnmt", "average")
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_REPETITION_PENALTY = 100.0
# Below this, dividing a logit by the penalty overflows to inf.
MIN_REPETITION_PENALTY = 0.01
MAX_OPENAI_PENALTY = 2.0
MAX_LENGTH_PENALTY_ALPHA = 10.0


def finite(name: str, value: float) -> float:
    """`value` when it is a finite number, else InvalidArgument naming the field `name` (the
    one finiteness check of request numbers: decoding knobs, rerank scores and weights)."""
    if not math.isfinite(value):
        raise InvalidArgument(name, f"must be a finite number, got {value}")
    return value


def _in_range(
    name: str, value: float, lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False
) -> None:
    finite(name, value)
    low_ok = value > lo if lo_open else value >= lo
    high_ok = value < hi if hi_open else value <= hi
    if not (low_ok and high_ok):
        interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
        raise InvalidArgument(name, f"must be in {interval}, got {value:g}")


def _int_at_least(name: str, value: int, lo: int) -> None:
    if value < lo:
        raise InvalidArgument(name, f"must be >= {lo}, got {value}")


def _int_at_most(name: str, value: int, hi: int, why: str) -> None:
    if value > hi:
        raise InvalidArgument(name, f"must be <= {hi} ({why}), got {value}")


def _check_token_ids(name: str, ids: Sequence[int], vocab_size: int | None) -> None:
    for i in ids:
        if i < 0 or (vocab_size is not None and i >= vocab_size):
            bound = f"[0, {vocab_size})" if vocab_size is not None else ">= 0"
            raise InvalidArgument(name, f"token id must be in {bound}, got {i}")


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is drawn; filters apply in field order after the penalties.

    >>> SamplingParams(top_p=1.5)
    Traceback (most recent call last):
    lmserve.server.errors.InvalidArgument: sampling.top_p: must be in (0, 1], got 1.5
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    typical_p: float = 1.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    no_repeat_ngram_size: int = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        p = "sampling."
        finite(p + "temperature", self.temperature)
        if self.temperature < 0:
            raise InvalidArgument(p + "temperature", f"must be >= 0, got {self.temperature:g}")
        _int_at_least(p + "top_k", self.top_k, 0)
        _in_range(p + "top_p", self.top_p, 0.0, 1.0, lo_open=True)
        _in_range(p + "min_p", self.min_p, 0.0, 1.0)
        _in_range(p + "typical_p", self.typical_p, 0.0, 1.0, lo_open=True)
        _in_range(
            p + "repetition_penalty", self.repetition_penalty, MIN_REPETITION_PENALTY,
            MAX_REPETITION_PENALTY,
        )  # fmt: skip
        for name in ("presence_penalty", "frequency_penalty"):
            _in_range(p + name, getattr(self, name), -MAX_OPENAI_PENALTY, MAX_OPENAI_PENALTY)
        _int_at_least(p + "no_repeat_ngram_size", self.no_repeat_ngram_size, 0)
        if self.seed is not None and not 0 <= self.seed < 2**64:
            raise InvalidArgument(p + "seed", f"must be in [0, 2**64), got {self.seed}")

    @property
    def greedy(self) -> bool:
        """Temperature 0: the argmax of the penalised distribution, no randomness."""
        return self.temperature == 0.0

    @property
    def truncates(self) -> bool:
        """True when some filter (top-k, top-p, min-p, typical-p) can drop tokens."""
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0 or self.typical_p < 1.0

    @property
    def penalised(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
        )


@dataclass(frozen=True)
class StoppingParams:
    """When a sample ends. `min_new_tokens` suppresses `</s>` and the stop ids until reached."""

    max_new_tokens: int
    min_new_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        p = "stopping."
        _int_at_least(p + "max_new_tokens", self.max_new_tokens, 1)
        _int_at_least(p + "min_new_tokens", self.min_new_tokens, 0)
        _int_at_most(
            p + "min_new_tokens", self.min_new_tokens, self.max_new_tokens, "max_new_tokens"
        )
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidArgument(
                p + "stop", f"at most {MAX_STOP_STRINGS} stop strings, got {len(self.stop)}"
            )
        for s in self.stop:
            if not s:
                raise InvalidArgument(p + "stop", "stop strings must not be empty")
            if len(s) > MAX_STOP_STRING_CHARS:
                raise InvalidArgument(
                    p + "stop", f"a stop string has at most {MAX_STOP_STRING_CHARS} characters"
                )
        _check_token_ids(p + "stop_token_ids", self.stop_token_ids, None)

    def validate(self, *, max_new_tokens: int, vocab_size: int | None = None) -> StoppingParams:
        """Checks the server limit and, given the model's vocabulary size, the stop ids."""
        _int_at_most(
            "stopping.max_new_tokens", self.max_new_tokens, max_new_tokens, "the server's limit"
        )
        _check_token_ids("stopping.stop_token_ids", self.stop_token_ids, vocab_size)
        return self


@dataclass(frozen=True)
class GenerateParams:
    """Everything a Generate request asks of decoding: n samples, each sampled and stopped."""

    stopping: StoppingParams
    sampling: SamplingParams = field(default_factory=SamplingParams)
    n: int = 1
    logprobs: bool = False
    top_logprobs: int = 0
    # Steps whose tokens travel in one stream message (1: every step, the lowest latency).
    stream_interval: int = 1

    def __post_init__(self) -> None:
        _int_at_least("n", self.n, 1)
        _int_at_least("top_logprobs", self.top_logprobs, 0)
        _int_at_least("stream_interval", self.stream_interval, 1)

    def validate(
        self,
        *,
        max_new_tokens: int,
        max_n: int,
        max_top_logprobs: int,
        vocab_size: int | None = None,
    ) -> GenerateParams:
        """Checks the server limits (settings); returns self for chaining."""
        self.stopping.validate(max_new_tokens=max_new_tokens, vocab_size=vocab_size)
        _int_at_most("n", self.n, max_n, "the server's limit")
        _int_at_most("top_logprobs", self.top_logprobs, max_top_logprobs, "the server's limit")
        if vocab_size is not None:
            _int_at_most("top_logprobs", self.top_logprobs, vocab_size, "the vocabulary size")
        return self


@dataclass(frozen=True)
class BeamParams:
    """A BeamSearch request's knobs. Lengths count new tokens, the ending token included."""

    beam_width: int
    max_length: int
    num_return: int = 1
    length_penalty: LengthPenalty = "none"
    length_penalty_alpha: float = 1.0
    min_length: int = 0
    early_stopping: bool = False
    no_repeat_ngram_size: int = 0
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        _int_at_least("beam_width", self.beam_width, 1)
        _int_at_least("num_return", self.num_return, 1)
        _int_at_most("num_return", self.num_return, self.beam_width, "beam_width")
        if self.length_penalty not in LENGTH_PENALTIES:
            raise InvalidArgument(
                "length_penalty", f"must be one of {LENGTH_PENALTIES}, got {self.length_penalty!r}"
            )
        _in_range("length_penalty_alpha", self.length_penalty_alpha, 0, MAX_LENGTH_PENALTY_ALPHA)
        _int_at_least("max_length", self.max_length, 1)
        _int_at_least("min_length", self.min_length, 0)
        _int_at_most("min_length", self.min_length, self.max_length, "max_length")
        _int_at_least("no_repeat_ngram_size", self.no_repeat_ngram_size, 0)
        _check_token_ids("stop_token_ids", self.stop_token_ids, None)

    def validate(
        self, *, max_beam_width: int, max_length: int, vocab_size: int | None = None
    ) -> BeamParams:
        """Checks the server limits (settings); returns self for chaining."""
        _int_at_most("beam_width", self.beam_width, max_beam_width, "the server's limit")
        _int_at_most("max_length", self.max_length, max_length, "the server's limit")
        _check_token_ids("stop_token_ids", self.stop_token_ids, vocab_size)
        return self
