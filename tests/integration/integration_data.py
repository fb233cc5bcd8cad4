"""Names and limits the integration fixtures and tests share."""

from __future__ import annotations

KJV_PATTERN = r"[a-z]+(?:'[a-z]+)*"
READY_MODELS = ["kjv3", "test", "test-arpa", "test-nounk"]
BROKEN_MODELS = ["bad-checksum", "invalid-manifest", "malformed-arpa", "missing-file", "neural"]
MAX_TEXTS = 500
MAX_TOKENS = 1000
SERVICE = "lmserve.v1.LanguageModelService"
# The token of the session's server that asks for one (conftest's `auth_server`).
AUTH_TOKEN = "shared-s3cret-7d41"
