"""When a sample ends, and the text it streams on the way.

`StopChecker.add(token_id)` takes each generated token (after `sample_next`) and returns the text
to send now and the finish reason, if any:

1. `</s>` (unless `ignore_eos`) ends with END_OF_SENTENCE; a stop token id with STOP. Neither
   adds text.
2. Otherwise the detokenizer's piece joins the text. Each stop string is searched where a new
   occurrence could be (ending in the last piece, so starting up to `len(stop) - 1`
   characters before it), so a stop string spanning token boundaries is found; the output
   ends just before it.
3. Text that could still be the start of a stop string (a suffix of the text that is a proper
   prefix of one) is held back, and sent once it cannot be, or with the token that ends the
   sample, whatever ends it (`</s>` and stop ids included), so the sent texts always add up
   to the final text.
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

    @property
    def text(self) -> str:
        """The output so far: what was sent plus anything held back."""
        return self._text

    @property
    def sent_text(self) -> str:
        """What `add` returned so far: `text` once the sample finished; without the held-back
        tail while it runs (what a sample cancelled now has streamed)."""
        return self._text[: self._sent]

    def _release(self, reason: FinishReason) -> StepText:
        """Ends the sample: everything not sent yet, held-back text included, goes out now."""
        self.finish_reason = reason
        rest = self._text[self._sent :]
        self._sent = len(self._text)
        return StepText(rest, reason)

    def _finish(self, reason: FinishReason) -> StepText:
        # The detokenizer's last text is searched too: it may complete a stop string.
        if self._append(self.detokenizer.flush()):
            reason = FinishReason.STOP
        return self._release(reason)

    def _append(self, piece: str) -> bool:
        """Adds text; True when it completes a stop string (the text then ends before it)."""
        old = len(self._text)
        self._text += piece
        if not (piece and self.params.stop and self.num_generated > self.params.min_new_tokens):
            return False
        # Only occurrences that end in the new piece: older ones were searched before, or came
        # before min_new_tokens (and may have been sent already).
        stops = self.params.stop
        hits = [i for s in stops if (i := self._text.find(s, max(0, old - len(s) + 1))) >= 0]
        if not hits:
            return False
        self._text = self._text[: min(hits)]
        return True

    def add(self, token_id: int) -> StepText:
        """Takes the next generated token; returns the text to send and the finish reason.

        A token that ends the sample returns whatever text was held back, even `</s>` and stop
        ids, which add no text of their own: the sent texts always add up to `text`."""
        if self.finish_reason is not None:
            raise RuntimeError("the sample already finished")
        self.num_generated += 1
        active = self.num_generated > self.params.min_new_tokens
        if token_id == self.eos_id and not self.params.ignore_eos:
            return self._finish(FinishReason.END_OF_SENTENCE)
        if active and token_id in self.params.stop_token_ids:
            return self._finish(FinishReason.STOP)
        if self._append(self.detokenizer.add(token_id)):
            return self._release(FinishReason.STOP)
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
