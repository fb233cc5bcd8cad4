"""Python client of the lmserve gRPC service: sync and asyncio clients, typed results, errors.

    from lmserve.client import LmServeClient
    with LmServeClient("localhost:50051") as client:
        print(client.score("kjv-5gram", ["and god said"])[0].log_prob)  # nats

Names load on first use, so importing `lmserve.client.commands` (the CLI) does not pull in gRPC.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmserve.client.async_client import AsyncLmServeClient
    from lmserve.client.client import DEFAULT_TARGET, LmServeClient
    from lmserve.client.complete import AsyncCompletionSession, CompletionSession
    from lmserve.client.completion_types import Completion
    from lmserve.client.errors import (
        DeadlineExceededError,
        InvalidArgumentError,
        LmServeClientError,
        ModelNotFoundError,
        ResourceExhaustedError,
        UnavailableError,
    )
    from lmserve.client.rerank_types import (
        NBestHypothesis,
        NBestInputError,
        NBestList,
        RerankedHypothesis,
        RerankedList,
        RerankedLists,
    )
    from lmserve.client.types import (
        BeamHypothesis,
        GeneratedToken,
        GenerationFinished,
        GraphOptimization,
        HealthStatus,
        ModelInfo,
        NgramStorage,
        PerplexityStats,
        Provenance,
        Quantization,
        SpecialTokens,
        TextScore,
        TokenizerInfo,
        TokenScore,
        TransformerInfo,
    )

_WHERE: dict[str, str] = {
    "DEFAULT_TARGET": "client",
    "AsyncLmServeClient": "async_client",
    "LmServeClient": "client",
    "AsyncCompletionSession": "complete",
    "CompletionSession": "complete",
    "DeadlineExceededError": "errors",
    "InvalidArgumentError": "errors",
    "LmServeClientError": "errors",
    "ModelNotFoundError": "errors",
    "ResourceExhaustedError": "errors",
    "UnavailableError": "errors",
    "BeamHypothesis": "types",
    "Completion": "completion_types",
    "GeneratedToken": "types",
    "GenerationFinished": "types",
    "GraphOptimization": "types",
    "HealthStatus": "types",
    "ModelInfo": "types",
    "NBestHypothesis": "rerank_types",
    "NBestInputError": "rerank_types",
    "NBestList": "rerank_types",
    "RerankedHypothesis": "rerank_types",
    "RerankedList": "rerank_types",
    "RerankedLists": "rerank_types",
    "PerplexityStats": "types",
    "NgramStorage": "types",
    "Provenance": "types",
    "Quantization": "types",
    "SpecialTokens": "types",
    "TextScore": "types",
    "TokenizerInfo": "types",
    "TransformerInfo": "types",
    "TokenScore": "types",
}

__all__ = [
    "AsyncCompletionSession",
    "AsyncLmServeClient",
    "BeamHypothesis",
    "Completion",
    "CompletionSession",
    "DEFAULT_TARGET",
    "DeadlineExceededError",
    "GeneratedToken",
    "GenerationFinished",
    "GraphOptimization",
    "HealthStatus",
    "InvalidArgumentError",
    "LmServeClient",
    "LmServeClientError",
    "ModelInfo",
    "ModelNotFoundError",
    "NBestHypothesis",
    "NBestInputError",
    "NBestList",
    "PerplexityStats",
    "NgramStorage",
    "TransformerInfo",
    "Provenance",
    "Quantization",
    "RerankedHypothesis",
    "RerankedList",
    "RerankedLists",
    "ResourceExhaustedError",
    "SpecialTokens",
    "TextScore",
    "TokenScore",
    "TokenizerInfo",
    "UnavailableError",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'lmserve.client' has no attribute {name!r}")
    return getattr(importlib.import_module(f"lmserve.client.{module}"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
