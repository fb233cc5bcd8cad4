"""When a sample ends, and the text it streams on the way.

`StopChecker.add(token_id)` takes each generated token (after `sample_next`) and returns the text
to send now and the finish reason, if any:

1. `</s>` (unless `ignore_eos`) ends with END_OF_SENTENCE; a stop token id with STOP. Neither
   adds text.
2. Otherwise the detokenizer's piece joins the text. A stop string is searched in the tail that
   could contain a new occurrence (the last piece plus `longest stop - 1` characters before
   it), so a stop string spanning token boundaries is found; the output ends just before it.
3. Text that could still be the start of a stop string (a suffix of the text that is a proper
   prefix of one) is held back, and sent once it cannot be, or at the end.
4. After `max_new_tokens` tokens: LENGTH. A cancelled stream ends with CANCELLED.

Stop strings and stop ids count only from `min_new_tokens` on (the sampler suppresses `</s>` and
the stop ids before then).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from lmserve.server.decoding.detokenize import Detokenizer
from lmserve.server.decoding.params import StoppingParams


class FinishReason(enum.Enum):
    """Why a sample ended; the values are the proto's `FinishReason` numbers."""

    LENGTH = 1
    STOP = 2
    END_OF_SENTENCE = 3
    CANCELLED = 4


@dataclass(frozen=True)
class StepText:
    """What one token contributes: the text to stream now and the finish reason (or None)."""

    text: str
    finish_reason: FinishReason | None = None


class StopChecker:
    """Tracks one sample's text and decides when it ends (see the module doc)."""

    def __init__(self, params: StoppingParams, detokenizer: Detokenizer, *, eos_id: int) -> None:
        self.params = params
        self.detokenizer = detokenizer
        self.eos_id = eos_id
        self.num_generated = 0
        self.finish_reason: FinishReason | None = None
        self._text = ""  # everything decoded so far (trimmed at a stop string when one is found)
        self._sent = 0  # characters of _text already returned
        self._longest = max((len(s) for s in params.stop), default=0)

    @property
    def text(self) -> str:
        """The output so far: what was sent plus anything held back."""
        return self._text

    def _finish(self, reason: FinishReason) -> StepText:
        self.finish_reason = reason
        self._text += self.detokenizer.flush()
        rest = self._text[self._sent :]
        self._sent = len(self._text)
        return StepText(rest, reason)

    def add(self, token_id: int) -> StepText:
        """Takes the next generated token; returns the text to send and the finish reason."""
        if self.finish_reason is not None:
            raise RuntimeError("the sample already finished")
        self.num_generated += 1
        active = self.num_generated > self.params.min_new_tokens
        if token_id == self.eos_id and not self.params.ignore_eos:
            return self._finish(FinishReason.END_OF_SENTENCE)
        if active and token_id in self.params.stop_token_ids:
            return self._finish(FinishReason.STOP)
        piece = self.detokenizer.add(token_id)
        start = max(0, len(self._text) - (self._longest - 1)) if self._longest else 0
        self._text += piece
        if self.params.stop and active:
            hits = [i for s in self.params.stop if (i := self._text.find(s, start)) >= 0]
            if hits:
                self._text = self._text[: min(hits)]
                self.finish_reason = FinishReason.STOP
                rest = self._text[self._sent :]
                self._sent = len(self._text)
                return StepText(rest, FinishReason.STOP)
        if self.num_generated >= self.params.max_new_tokens:
            return self._finish(FinishReason.LENGTH)
        end = len(self._text) - self._held_back()
        out = self._text[self._sent : end] if end > self._sent else ""
        self._sent = max(self._sent, end)
        return StepText(out)

    def _held_back(self) -> int:
        """Length of the longest suffix of the text that is a proper prefix of a stop string."""
        best = 0
        for s in self.params.stop:
            for k in range(min(len(s) - 1, len(self._text)), best, -1):
                if self._text.endswith(s[:k]):
                    best = k
                    break
        return best

    def cancel(self) -> StepText:
        """Ends the sample as cancelled; nothing more is sent."""
        self.finish_reason = FinishReason.CANCELLED
        return StepText("", FinishReason.CANCELLED)
