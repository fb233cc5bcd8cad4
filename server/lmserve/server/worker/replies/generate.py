"""Generate's stream messages, built where the tokens are computed (in the engine worker).

    chunk = serialized_chunk(events, words, logprobs=True, top_logprobs=2)
    chunk.messages          # GenerateResponse wire bytes, the front writes them as they are

One hand-over of a stream's events becomes its messages: the tokens together, each sample's
end closing a message. Serialized protobuf messages merge when their bytes are concatenated
(repeated `tokens` append; `finished` is set by the later one), so a message left open (no
sample ended in it) may take the next hand-over's first message into it: a front that falls
behind a stream sends fewer, larger messages without parsing anything.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from lmserve.server.decoding.params import GenerateParams
from lmserve.server.decoding.stopping import FinishReason
from lmserve.server.errors import DeadlineExceeded
from lmserve.server.worker.generation.sequence import Event, FinishEvent, MessageRenderer
from lmserve.v1 import lm_service_pb2 as pb


def generate_responses(
    events: Sequence[Event], words: Sequence[str], logprobs: bool, top_logprobs: int
) -> list[pb.GenerateResponse]:
    """The stream messages for one hand-over of events: the tokens together, each sample end
    closing a message (after the tokens before it). `words` names the alternatives' ids."""
    messages: list[pb.GenerateResponse] = []
    message = pb.GenerateResponse()
    add = message.tokens.add
    for event in events:
        if isinstance(event, FinishEvent):
            message.finished.CopyFrom(_finished(event))
            messages.append(message)
            message = pb.GenerateResponse()
            add = message.tokens.add
            continue
        token = add(
            sample_index=event.sample_index,
            index=event.index,
            token_id=event.token_id,
            text=event.text,
            log_prob=event.log_prob if logprobs else 0.0,
        )
        if top_logprobs:
            TokenLogProb = pb.TokenLogProb
            token.top_logprobs.extend(
                TokenLogProb(token_id=i, text=words[i], log_prob=lp)
                for i, lp in event.top[:top_logprobs]
            )
    if len(message.tokens):
        messages.append(message)
    return messages


def _finished(event: FinishEvent) -> pb.GenerationFinished:
    u = event.usage
    return pb.GenerationFinished(
        sample_index=event.sample_index,
        reason=pb.FinishReason.Name(event.reason.value),  # values are the proto numbers
        text=event.text,
        log_prob=event.log_prob,
        usage=pb.Usage(
            prompt_tokens=u.prompt_tokens,
            generated_tokens=u.generated_tokens,
            time_to_first_token_seconds=u.time_to_first_token_seconds,
            total_seconds=u.total_seconds,
        ),
    )


@dataclass(frozen=True, slots=True)
class SerializedChunk:
    """One hand-over as wire bytes: the messages, the events and ended samples they hold, and
    whether the last message is still open (no sample ended in it)."""

    messages: list[bytes]
    events: int
    finished: int
    open_tail: bool


def serialized_chunk(
    events: Sequence[Event], words: Sequence[str], logprobs: bool, top_logprobs: int
) -> SerializedChunk:
    """`generate_responses` serialized, with what the front needs to know of them."""
    messages = generate_responses(events, words, logprobs, top_logprobs)
    finished = sum(type(e) is FinishEvent for e in events)
    open_tail = bool(messages) and not messages[-1].HasField("finished")
    return SerializedChunk(
        [m.SerializeToString() for m in messages], len(events), finished, open_tail
    )


def ended_by_deadline(events: Sequence[Event], deadline: float | None) -> bool:
    """Whether a sample in `events` was cancelled because the call's deadline passed (the
    scheduler frees the slot at the deadline; the call itself fails DEADLINE_EXCEEDED)."""
    if deadline is None or time.monotonic() < deadline:
        return False
    return any(type(e) is FinishEvent and e.reason is FinishReason.CANCELLED for e in events)


def rendered(
    events: Sequence[Event], words: Sequence[str], params: GenerateParams, deadline: float | None
) -> SerializedChunk:
    """One hand-over of a stream's events as its messages, the one way every Generate reply is
    built (an engine worker's, and an in-process engine's); DeadlineExceeded when the call's
    deadline ended a sample (the scheduler freed its slot; the call itself fails)."""
    if ended_by_deadline(events, deadline):
        raise DeadlineExceeded("Generate did not finish before the deadline")
    return serialized_chunk(events, words, params.logprobs, params.top_logprobs)


def message_renderer(
    words: Sequence[str], params: GenerateParams, deadline: float | None
) -> MessageRenderer:
    """`rendered`'s messages for one in-process stream (`EngineCore.generate`)."""

    def render(events: list[Event]) -> list[bytes]:
        return rendered(events, words, params, deadline).messages

    return render
