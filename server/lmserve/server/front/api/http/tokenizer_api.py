"""The tokenizer endpoints of vLLM's API, which evaluation clients use to count and align tokens
(lm-evaluation-harness's `tokenizer_backend=remote`):

    POST /tokenize        {"model"?, "prompt", "add_special_tokens"?} -> {"tokens": [ids], ...}
    POST /detokenize      {"model"?, "tokens": [ids]}                 -> {"prompt": "..."}
    GET  /tokenizer_info  ?model=...                    -> {"eos_token", "bos_token", ...}

The ids are the model's own (what Score's details and Generate's tokens report), so a client
that sends them back as a `/v1/completions` prompt is scored on exactly those tokens. `model`
may be left out when the server serves one model. Errors are OpenAI-shaped, as on `/v1`.
"""

from __future__ import annotations

import functools
import json
import re

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from lmserve.server.decoding.detokenize import detokenize
from lmserve.server.decoding.scoring import check_token_count
from lmserve.server.errors import InvalidArgument
from lmserve.server.front.api.generation import prompt_ids
from lmserve.server.front.api.http.calls import REQUEST_ID_HEADER, CallFailed, HttpCalls
from lmserve.server.front.api.http.json_types import JsonObject, JsonValue
from lmserve.server.front.api.http.openai_api import error_response, read_body
from lmserve.server.front.api.http.openapi import openapi_document
from lmserve.server.front.api.model_use import use_model
from lmserve.server.front.api.servicer import LanguageModelServicer
from lmserve.server.front.models.served_model import ServedModel


def _model_name(servicer: LanguageModelServicer, given: object) -> str:
    if isinstance(given, str) and given:
        return given
    if given is not None and not isinstance(given, str):
        raise InvalidArgument("model", "must be a string")
    ready = [e.name for e in servicer.models.entries() if e.vocab is not None]
    if len(ready) != 1:
        raise InvalidArgument(
            "model", f"name the model: this server serves {len(ready)} ({', '.join(ready[:8])})"
        )
    return ready[0]


async def _json_body(request: Request, limit: int) -> JsonObject:
    raw = await read_body(request, limit)
    try:
        body: object = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidArgument("body", f"not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise InvalidArgument("body", "must be a JSON object")
    return body


def tokenizer_routes(
    servicer: LanguageModelServicer, calls: HttpCalls, *, max_message_bytes: int
) -> list[BaseRoute]:
    """The `/tokenize`, `/detokenize` and `/tokenizer_info` routes (bodies up to the gRPC
    port's message size)."""

    async def tokenize(request: Request) -> Response:
        try:
            async with calls.call("Tokenize", request.headers) as call:
                body = await _json_body(request, max_message_bytes)
                prompt = body.get("prompt")
                if not isinstance(prompt, str):
                    raise InvalidArgument("prompt", "must be a string")
                with use_model(servicer.models, _model_name(servicer, body.get("model"))) as served:
                    ids = _encode(served, prompt)
                    if body.get("add_special_tokens") is True:
                        ids = [served.vocab.bos_id, *ids]
                    limit = served.max_text_tokens
        except CallFailed as failed:
            return error_response(failed)
        answer = {"tokens": ids, "count": len(ids), "max_model_len": limit}
        return JSONResponse(answer, headers={REQUEST_ID_HEADER: call.info.request_id})

    async def detokenize_ids(request: Request) -> Response:
        try:
            async with calls.call("Detokenize", request.headers) as call:
                body = await _json_body(request, max_message_bytes)
                tokens = body.get("tokens")
                ids = _token_ids(tokens)
                if ids is None:
                    raise InvalidArgument("tokens", "must be a list of token ids")
                with use_model(servicer.models, _model_name(servicer, body.get("model"))) as served:
                    text = _text_of(served, ids)
        except CallFailed as failed:
            return error_response(failed)
        return JSONResponse({"prompt": text}, headers={REQUEST_ID_HEADER: call.info.request_id})

    async def tokenizer_info(request: Request) -> Response:
        try:
            async with calls.call("TokenizerInfo", request.headers) as call:
                name = _model_name(servicer, request.query_params.get("model"))
                with use_model(servicer.models, name) as served:
                    vocab = served.vocab
                    info = {
                        "model": served.name,
                        "bos_token": vocab.words[vocab.bos_id],
                        "eos_token": vocab.words[vocab.eos_id],
                        "unk_token": vocab.words[vocab.unk_id],
                        "pad_token": None,
                        "vocab_size": len(vocab),
                        "tokenizer_class": str(getattr(served.codec, "kind", "word")),
                        "model_max_length": served.max_text_tokens,
                    }
        except CallFailed as failed:
            return error_response(failed)
        return JSONResponse(info, headers={REQUEST_ID_HEADER: call.info.request_id})

    async def openapi(request: Request) -> Response:
        return JSONResponse(openapi_document())

    return [
        Route("/openapi.json", openapi, methods=["GET"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize_ids, methods=["POST"]),
        Route("/tokenizer_info", tokenizer_info, methods=["GET"]),
    ]


def _token_ids(tokens: JsonValue) -> list[int] | None:
    """`tokens` as token ids, or None unless it is a list of integers (JSON's true and false
    are not ids)."""
    if not isinstance(tokens, list):
        return None
    ids = [t for t in tokens if isinstance(t, int) and not isinstance(t, bool)]
    return ids if len(ids) == len(tokens) else None


def _text_of(served: ServedModel, tokens: list[int]) -> str:
    ids = prompt_ids(tokens, len(served.vocab), field="tokens")
    return detokenize(served.detokenizer()(), ids)


def _encode(served: ServedModel, prompt: str) -> list[int]:
    """The prompt's ids, its special tokens written as themselves (`<s>`, `</s>`, `<unk>`) taken
    as those tokens, the text between them by the model's tokenizer."""
    vocab = served.vocab
    specials = {vocab.words[i]: i for i in (vocab.bos_id, vocab.eos_id, vocab.unk_id)}
    pattern = _specials_pattern(*specials)
    ids: list[int] = []
    for part in pattern.split(prompt):
        if part in specials:
            ids.append(specials[part])
        elif part.strip():
            ids.extend(served.encode_prompt(part))
    check_token_count("prompt", len(ids), served.limits.requests.max_tokens_per_text)
    return ids


@functools.lru_cache(maxsize=64)
def _specials_pattern(*specials: str) -> re.Pattern[str]:
    """Splits a prompt at the special tokens written as themselves (kept as parts)."""
    return re.compile("(" + "|".join(re.escape(w) for w in specials) + ")")
