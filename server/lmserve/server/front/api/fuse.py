"""Fuse: shallow fusion for an external beam search, one bidirectional stream per decoder.

    async for response in fuse_stream(models, limits, request_iterator):
        yield response

The first message names the model (and `options.bos`, which holds for the stream); the engine
keeps a table of the stream's hypotheses, id -> model state, with the root (id 0) after `<s>`.
Each message extends hypotheses by one token, drops pruned ones and queries live ones, and is
answered once, in order (`shared.fusion` states the order). Here every field that needs only
the vocabulary is checked and tokens given as strings become ids; the engine checks the rest
against the table. Any refusal ends the stream with its status, one line naming the field
("extend[3].parent: 17 is not a live hypothesis"); however the stream ends (the client's
close, a cancel, an error) the engine releases its states.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator

from lmserve.server.errors import InvalidArgument, RequestTooLarge, clip_repr
from lmserve.server.front.api.model_use import same_model, use_model
from lmserve.server.front.models.served_model import ServedModel
from lmserve.server.front.models.served_models import ServedModels
from lmserve.server.settings import FusionSettings
from lmserve.server.shared.fusion import FuseAnswer, FuseStep
from lmserve.v1 import lm_service_pb2 as pb

# The front's ids of its Fuse streams (the engine keys a stream by it).
_SESSIONS = itertools.count(1)


async def fuse_stream(
    models: ServedModels, limits: FusionSettings, requests: AsyncIterator[pb.FuseRequest]
) -> AsyncIterator[pb.FuseResponse]:
    """Answers a Fuse stream (see the module doc)."""
    first = await anext(requests, None)
    if first is None:
        return
    if not first.model:
        raise InvalidArgument("model", "is empty; the first message of a Fuse stream names it")
    with use_model(models, first.model) as served:  # held for the whole stream
        bos = first.options.bos if first.options.HasField("bos") else True
        session = next(_SESSIONS)
        try:
            message: pb.FuseRequest | None = first
            opens = True
            while message is not None:
                if not opens and not same_model(models, served, message.model):
                    raise InvalidArgument(
                        "model",
                        f"changed mid-stream from {served.name!r}; open a new stream for "
                        "another model",
                    )
                step = fuse_step(served, limits, message, opens=opens, bos=bos)
                answer = await served.fuse(session, step)
                yield fuse_response(served, message, answer)
                opens = False
                message = await anext(requests, None)
        finally:
            served.fuse_close(session)


def fuse_step(
    served: ServedModel,
    limits: FusionSettings,
    message: pb.FuseRequest,
    *,
    opens: bool,
    bos: bool,
) -> FuseStep:
    """The message as the engine's step: tokens as ids, every vocabulary bound checked."""
    size = len(served.vocab)
    if len(message.extend) > limits.fuse_max_hypotheses:
        raise RequestTooLarge(
            "extend", len(message.extend), limits.fuse_max_hypotheses, "extensions"
        )
    index = served.vocab.index
    ids, parents, tokens = [], [], []
    for i, ext in enumerate(message.extend):
        if ext.token:
            if ext.token_id:
                raise InvalidArgument(f"extend[{i}]", "set token_id or token, not both")
            token = index.get(ext.token)
            if token is None:
                raise InvalidArgument(
                    f"extend[{i}].token",
                    f"{clip_repr(ext.token)} is not in model {served.name!r}'s vocabulary",
                )
        else:
            token = _in_vocabulary(f"extend[{i}].token_id", ext.token_id, size)
        ids.append(ext.id)
        parents.append(ext.parent)
        tokens.append(token)
    if len(message.candidate_ids) > limits.fuse_max_candidates:
        raise RequestTooLarge(
            "candidate_ids", len(message.candidate_ids), limits.fuse_max_candidates, "ids"
        )
    candidates = [
        _in_vocabulary(f"candidate_ids[{i}]", c, size) for i, c in enumerate(message.candidate_ids)
    ]
    top = min(limits.fuse_max_top_k, size)
    if not 0 <= message.top_k <= top:
        raise InvalidArgument("top_k", f"is {message.top_k}; ask for 0 to {top}")
    return FuseStep(
        opens=opens,
        bos=bos,
        ids=ids,
        parents=parents,
        tokens=tokens,
        drop=list(message.drop),
        query=list(message.query),
        candidates=candidates,
        top_k=message.top_k,
        end=message.end_log_prob,
    )


def _in_vocabulary(field: str, token: int, size: int) -> int:
    if not 0 <= token < size:
        raise InvalidArgument(field, f"{token} is outside the vocabulary (ids 0 to {size - 1})")
    return token


def fuse_response(
    served: ServedModel, message: pb.FuseRequest, answer: FuseAnswer
) -> pb.FuseResponse:
    words = served.vocab.words
    token_lps = answer.token_log_probs.tolist()
    candidates = answer.candidate_log_probs.tolist()
    top_ids = answer.top_ids.tolist()
    top_lps = answer.top_log_probs.tolist()
    ends = answer.end_log_probs.tolist()
    return pb.FuseResponse(
        hypotheses=[
            pb.FusedHypothesis(
                id=hid,
                token_log_prob=token_lps[r],
                candidate_log_probs=candidates[r],
                top_ids=top_ids[r],
                top_log_probs=top_lps[r],
                top_tokens=[words[t] for t in top_ids[r]],
                end_log_prob=ends[r],
            )
            for r, hid in enumerate(answer.ids)
        ],
        sequence=message.sequence,
        live=answer.live,
        model=served.name,
    )
