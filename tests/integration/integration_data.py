"""Names and limits the integration fixtures and tests share."""

from __future__ import annotations

KJV_PATTERN = r"[a-z]+(?:'[a-z]+)*"
READY_MODELS = ["kjv3", "test", "test-arpa", "test-nounk"]
BROKEN_MODELS = ["bad-checksum", "invalid-manifest", "malformed-arpa", "missing-file", "neural"]
MAX_TEXTS = 500
MAX_TOKENS = 1000
SERVICE = "lmserve.v1.LanguageModelService"
