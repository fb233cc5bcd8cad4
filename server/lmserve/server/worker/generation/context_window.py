"""How far one model's sequences may grow, and how much key/value cache its generation holds.

A transformer reads at most `max_positions` tokens per sequence (`<s>` included) and holds
`bytes_per_position` of cache for each (every layer's key and value). Generation follows one
rule, stated here:
- a prompt that does not fit (`<s>` + prompt > max_positions) is refused (INVALID_ARGUMENT);
- a sample stops at the model's last position: `max_new_tokens` (BeamSearch's `max_length`) is
  lowered to what the positions leave, and such a sample ends with reason "length";
- a request reserves the cache its samples can reach, `samples x (1 + prompt + max_new_tokens)
  x bytes_per_position`, and is admitted only while the model's reservations stay within
  `max_cache_bytes` (as vLLM admits by free KV blocks); one that could never fit is refused
  (RESOURCE_EXHAUSTED), the rest wait their turn.
Models without a cache (recurrent, n-gram) have no positions limit and reserve nothing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from lmserve.server.errors import InvalidArgument, RequestTooLarge


@dataclass(frozen=True)
class ContextWindow:
    """One model's positions and cache budget (see the module doc)."""

    max_positions: int | None = None
    bytes_per_position: int = 0
    max_cache_bytes: int = 0

    @classmethod
    def of(cls, stepper: Any, max_cache_bytes: int) -> ContextWindow:
        """The window of a stepper: a transformer's `KvStepper` states one, others none."""
        positions = getattr(stepper, "max_positions", None)
        per_position = int(getattr(stepper, "bytes_per_position", 0))
        return cls(positions, per_position, max_cache_bytes if per_position else 0)

    def new_tokens_room(self, prompt_tokens: int, field: str = "prompt") -> int | None:
        """How many tokens a sample may generate after `<s>` + the prompt (None: no limit);
        a prompt that does not fit is refused."""
        if self.max_positions is None:
            return None
        read = 1 + prompt_tokens
        if read > self.max_positions:
            raise InvalidArgument(
                field,
                f"has {prompt_tokens} tokens; with <s> that is {read} positions, the model has "
                f"{self.max_positions} (max_positions): shorten it",
            )
        # The last token drawn is never read back, so it needs no position of its own.
        return self.max_positions - read + 1

    def fit(self, params: Any, prompt_tokens: int) -> Any:
        """GenerateParams with `max_new_tokens` lowered to the room the positions leave."""
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

    def fit_beam(self, params: Any, prompt_tokens: int) -> Any:
        """BeamParams with `max_length` lowered to the room the positions leave."""
        room = self.new_tokens_room(prompt_tokens)
        if room is None or params.max_length <= room:
            return params
        return dataclasses.replace(params, max_length=room, min_length=min(params.min_length, room))

    def request_bytes(self, request: Any, samples: int) -> int:
        """The cache `samples` samples of a Generate request may reach, each
        (1 + prompt + max_new_tokens) positions (0 without a budget)."""
        if not self.max_cache_bytes:
            return 0
        positions = 1 + len(request.prompt_ids) + request.params.stopping.max_new_tokens
        return samples * positions * self.bytes_per_position

    def stream_bytes(self, stream: Any) -> int:
        """The cache a queued Generate stream reserves, all its samples (0 without a budget)."""
        return self.request_bytes(stream.request, stream.samples) if self.max_cache_bytes else 0

    def check_stream(self, stream: Any) -> None:
        """Refuses a stream whose reservation alone exceeds the budget."""
        needed = self.stream_bytes(stream)
        if needed > self.max_cache_bytes > 0:
            raise RequestTooLarge(
                "n x (prompt + max_new_tokens)",
                needed,
                self.max_cache_bytes,
                "bytes of key/value cache (the model's max_cache_bytes)",
            )
