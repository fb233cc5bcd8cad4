"""The OpenAPI document of the HTTP front's JSON API (`/v1` and the tokenizer endpoints),
generated from the pydantic schema the server validates requests with, so it cannot drift.

    GET /openapi.json
"""

from __future__ import annotations

import functools

from lmserve.server.front.api.http.json_types import JsonObject
from lmserve.server.front.api.http.openai_schema import CompletionRequest

_ERROR: JsonObject = {
    "description": "An OpenAI-shaped error: {error: {message, type, param, code}}",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
}


def _json(schema: JsonObject, description: str) -> JsonObject:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _body(schema: JsonObject) -> JsonObject:
    """A required JSON request body of this schema."""
    return {"required": True, "content": {"application/json": {"schema": schema}}}


@functools.cache
def openapi_document() -> JsonObject:
    request = CompletionRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    definitions = request.pop("$defs", {})
    errors = {str(code): _ERROR for code in (400, 401, 403, 404, 413, 429, 500, 503)}
    obj: JsonObject = {"type": "object"}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "lmserve HTTP API",
            "version": "1",
            "description": "OpenAI-compatible completions over lmserve's models, and vLLM's "
            "tokenizer endpoints. Every RPC of the gRPC API is also served as JSON in the "
            "Connect protocol at /lmserve.v1.LanguageModelService/<Method>.",
        },
        "paths": {
            "/v1/completions": {
                "post": {
                    "summary": "Completions (text or token-id prompts; echo and logprobs score "
                    "the prompt; stream: server-sent events)",
                    "requestBody": _body({"$ref": "#/components/schemas/CompletionRequest"}),
                    "responses": {"200": _json(obj, "A completion (or an event stream)"), **errors},
                }
            },
            "/v1/models": {
                "get": {
                    "summary": "The models served",
                    "responses": {"200": _json(obj, "{object: list, data: [model]}"), **errors},
                }
            },
            "/v1/models/{model}": {
                "get": {
                    "summary": "One model",
                    "parameters": [
                        {
                            "name": "model",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string"},
                        }
                    ],
                    "responses": {"200": _json(obj, "A model object"), **errors},
                }
            },
            "/tokenize": {
                "post": {
                    "summary": "A prompt's token ids (special tokens written as themselves)",
                    "requestBody": _body(
                        {
                            "type": "object",
                            "required": ["prompt"],
                            "properties": {
                                "model": {"type": "string"},
                                "prompt": {"type": "string"},
                                "add_special_tokens": {"type": "boolean"},
                            },
                        }
                    ),
                    "responses": {"200": _json(obj, "{tokens, count, max_model_len}"), **errors},
                }
            },
            "/detokenize": {
                "post": {
                    "summary": "Token ids back to text",
                    "requestBody": _body(
                        {
                            "type": "object",
                            "required": ["tokens"],
                            "properties": {
                                "model": {"type": "string"},
                                "tokens": {"type": "array", "items": {"type": "integer"}},
                            },
                        }
                    ),
                    "responses": {"200": _json(obj, "{prompt}"), **errors},
                }
            },
            "/tokenizer_info": {
                "get": {
                    "summary": "The model's special tokens and vocabulary size",
                    "parameters": [
                        {
                            "name": "model",
                            "in": "query",
                            "required": False,
                            "schema": {"type": "string"},
                        }
                    ],
                    "responses": {"200": _json(obj, "{bos_token, eos_token, ...}"), **errors},
                }
            },
        },
        "components": {
            "schemas": {
                "CompletionRequest": request,
                **definitions,
                "Error": {
                    "type": "object",
                    "properties": {
                        "error": {
                            "type": "object",
                            "properties": {
                                "message": {"type": "string"},
                                "type": {"type": "string"},
                                "param": {"type": ["string", "null"]},
                                "code": {"type": ["string", "null"]},
                            },
                        }
                    },
                },
            }
        },
    }
