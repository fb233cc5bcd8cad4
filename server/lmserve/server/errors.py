"""The exceptions lmserve raises, each mapped to one gRPC status code by the API layer.

    LmServeError
    ├── InvalidArgument      -> INVALID_ARGUMENT  (a request field is wrong; names the field)
    ├── ModelNotFound        -> NOT_FOUND         (no model of that name in the repository)
    ├── ModelUnavailable     -> UNAVAILABLE       (the model exists but failed to load)
    ├── Overloaded           -> RESOURCE_EXHAUSTED (a queue or limit is full; retry later)
    │   └── RequestTooLarge                        (the request is over a size limit)
    ├── DeadlineExceeded     -> DEADLINE_EXCEEDED
    ├── Cancelled            -> CANCELLED         (the caller went away; work stopped early)
    ├── ModelOutputError     -> INTERNAL          (the model produced NaN/inf for a sequence)
    ├── Unimplemented        -> UNIMPLEMENTED     (the RPC or option is not offered for this model)
    ├── Cancelled            -> CANCELLED         (the caller stopped waiting; the work stopped)
    ├── ModelOutputError     -> INTERNAL          (the model produced NaN/inf for a sequence)
    └── ModelLoadError                            (a model folder is broken; names file and reason)
        ├── ManifestError
        ├── ChecksumMismatch
        └── ArpaFormatError

Backends and decoding raise these; nothing below the API layer knows about gRPC.
"""

from __future__ import annotations


class LmServeError(Exception):
    """Base class of every error lmserve raises on purpose."""


class InvalidArgument(LmServeError):
    """A request field has a bad value. The message names the field and the value."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class ModelNotFound(LmServeError):
    """The repository has no model of the requested name."""

    def __init__(self, name: str, available: list[str] | None = None) -> None:
        hint = f"; available: {', '.join(sorted(available))}" if available else ""
        super().__init__(f"model {name!r} not found{hint}")
        self.name = name


class ModelUnavailable(LmServeError):
    """The model is in the repository but is not serving (it failed to load)."""


class Overloaded(LmServeError):
    """The server is at capacity for this kind of work; the caller may retry later."""


class RequestTooLarge(Overloaded):
    """A request holds more than a limit allows (too many hypotheses, tokens...); it was
    refused before any work started. The message names the field, the size and the limit."""

    def __init__(self, field: str, size: int, limit: int, what: str) -> None:
        super().__init__(f"{field}: has {size} {what}, more than the limit of {limit}")
        self.field = field


class DeadlineExceeded(LmServeError):
    """The work did not finish before the caller's deadline."""


class Cancelled(LmServeError):
    """The caller stopped waiting (cancelled the call): the work was stopped, not finished."""


class ModelOutputError(LmServeError):
    """The model's output for one sequence cannot be decoded (NaN or +inf log-probabilities,
    or no token with any probability): that sequence fails, the others go on."""


class Unimplemented(LmServeError):
    """The RPC or option is not available for this model."""


class ModelLoadError(LmServeError):
    """A model folder could not be loaded. The message says which file and why."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class ManifestError(ModelLoadError):
    """The manifest is missing, unreadable or fails validation."""


class ChecksumMismatch(ModelLoadError):
    """A model file's sha256 differs from the one in the manifest."""


class ArpaFormatError(ModelLoadError):
    """An ARPA file is malformed. The reason names the line."""
