"""The one rule on how long a sequence may grow: a model with positions reads `<s>` and each of
its tokens at a position of its own, and never more than it has.

    positions = Positions(1024)
    positions.check(read=13, field="texts[3]")        # <s> + 12 tokens: 13 positions
    positions.room(prompt_tokens=1000)                # new tokens a sample may still draw
    positions.text_tokens(max_tokens_per_text=4096)   # tokens one text may have: 1023

Models without positions (n-gram, recurrent) have `limit` None: nothing is refused. A text that
does not fit is refused (INVALID_ARGUMENT, naming the field), never cut silently.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmserve.server.errors import InvalidArgument


@dataclass(frozen=True)
class Positions:
    """A model's positions (`limit`, None: unbounded) and the rule every caller applies."""

    limit: int | None = None

    def check(self, read: int, field: str) -> None:
        """Refuses a sequence that reads `read` positions (`<s>` and the tokens after it) when
        the model has fewer."""
        if self.limit is not None and read > self.limit:
            raise InvalidArgument(
                field,
                f"needs {read} positions, the model has {self.limit} (max_positions): <s> and "
                "each of its tokens take one; shorten it",
            )

    def room(self, prompt_tokens: int, field: str = "prompt") -> int | None:
        """How many tokens a sample may generate after `<s>` + the prompt (None: no limit);
        a prompt that does not fit is refused. The last token drawn is never read back, so it
        needs no position of its own."""
        self.check(1 + prompt_tokens, field)
        return None if self.limit is None else self.limit - prompt_tokens

    def text_tokens(self, max_tokens_per_text: int) -> int:
        """Tokens one text or context may have: the request limit, and the positions less
        `<s>`'s."""
        if self.limit is None:
            return max_tokens_per_text
        return min(max_tokens_per_text, self.limit - 1)
