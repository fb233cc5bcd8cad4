"""How far one model's generated sequences may grow, and how much memory their state holds.

The model's family states both (`families.ModelFamily.positions` and
`cache_bytes_per_position`); generation follows one rule with them, stated here:
- a prompt that does not fit its positions is refused (INVALID_ARGUMENT; `backends.positions`);
- a sample stops at the model's last position: `max_new_tokens` (BeamSearch's `max_length`) is
  lowered to what the positions leave, and such a sample ends with reason "length";
- a request reserves the cache its samples can reach, `samples x (1 + prompt + max_new_tokens)
  x bytes_per_position`, and is admitted only while the model's reservations stay within
  `max_cache_bytes` (as vLLM admits by free KV blocks); one that could never fit is refused
  (RESOURCE_EXHAUSTED), the rest wait their turn.
A model whose state does not grow (recurrent, n-gram) has no positions limit and reserves
nothing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from lmserve.server.backends.positions import Positions
from lmserve.server.decoding.params import BeamParams, GenerateParams
from lmserve.server.errors import RequestTooLarge


@dataclass(frozen=True)
class ContextWindow:
    """One model's positions and cache budget (see the module doc)."""

    positions: Positions = Positions()
    bytes_per_position: int = 0
    max_cache_bytes: int = 0

    def __post_init__(self) -> None:
        if not self.bytes_per_position:  # nothing grows: no budget to keep
            object.__setattr__(self, "max_cache_bytes", 0)

    @property
    def max_positions(self) -> int | None:
        return self.positions.limit

    def new_tokens_room(self, prompt_tokens: int, field: str = "prompt") -> int | None:
        """How many tokens a sample may generate after `<s>` + the prompt (None: no limit);
        a prompt that does not fit is refused."""
        return self.positions.room(prompt_tokens, field)

    def fit(self, params: GenerateParams, prompt_tokens: int) -> GenerateParams:
        """`max_new_tokens` lowered to the room the positions leave."""
        room = self.new_tokens_room(prompt_tokens)
        stopping = params.stopping
        if room is None or stopping.max_new_tokens <= room:
            return params
        lowered = dataclasses.replace(
            stopping,
            max_new_tokens=room,
            min_new_tokens=min(stopping.min_new_tokens, room),
        )
        return dataclasses.replace(params, stopping=lowered)

    def fit_beam(self, params: BeamParams, prompt_tokens: int) -> BeamParams:
        """`max_length` lowered to the room the positions leave."""
        room = self.new_tokens_room(prompt_tokens)
        if room is None or params.max_length <= room:
            return params
        return dataclasses.replace(params, max_length=room, min_length=min(params.min_length, room))

    def request_bytes(self, prompt_tokens: int, max_new_tokens: int, samples: int) -> int:
        """The cache `samples` samples may reach, each (1 + prompt + max_new_tokens) positions
        (0 without a budget)."""
        if not self.max_cache_bytes:
            return 0
        return samples * (1 + prompt_tokens + max_new_tokens) * self.bytes_per_position

    def check(self, needed: int) -> None:
        """Refuses a reservation that alone exceeds the budget."""
        if needed > self.max_cache_bytes > 0:
            raise RequestTooLarge(
                "n x (prompt + max_new_tokens)",
                needed,
                self.max_cache_bytes,
                "bytes of key/value cache (the model's max_cache_bytes)",
            )
