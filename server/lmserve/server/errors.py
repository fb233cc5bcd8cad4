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
    ├── Unauthenticated      -> UNAUTHENTICATED   (no or a wrong bearer token)
    └── ModelLoadError                            (a model folder is broken; names file and reason)
        ├── ManifestError
        ├── ChecksumMismatch
        └── ArpaFormatError

Backends and decoding raise these; nothing below the API layer knows about gRPC.
"""

from __future__ import annotations

# Values from requests echoed in messages are cut to this many characters: a status message
# travels in a header, and one over gRPC's metadata limit turns any status into
# RESOURCE_EXHAUSTED (a 16 KB model name must still get NOT_FOUND).
ECHO_LIMIT = 100
# A message as a whole (a field name plus a problem that quotes a value or two).
MESSAGE_LIMIT = 1000
# Seconds an overloaded server asks callers to wait before retrying (RetryInfo) when it has no
# better estimate: the queues estimate it from their state (`worker.retry_estimate`) and use this
# only before anything was measured, and for refusals while shutting down.
DEFAULT_RETRY_AFTER = 1.0


def clip(value: object, limit: int = ECHO_LIMIT) -> str:
    """`str(value)` cut to `limit` characters, with "…" marking the cut."""
    text = str(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def clip_repr(value: object, limit: int = ECHO_LIMIT) -> str:
    """`repr(value)` cut the same way (for quoting strings from requests)."""
    return clip(repr(value), limit)


class LmServeError(Exception):
    """Base class of every error lmserve raises on purpose.

    Errors cross from an engine worker process to the front pickled: `__reduce__` keeps the
    message and attributes as they are, whatever the subclass's constructor takes."""

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_error, (type(self), self.args, dict(self.__dict__)))


def _rebuild_error(
    kind: type[LmServeError], args: tuple[object, ...], state: dict[str, object]
) -> LmServeError:
    error = kind.__new__(kind)
    error.args = args
    error.__dict__.update(state)
    return error


class InvalidArgument(LmServeError):
    """A request field has a bad value. The message names the field and the value."""

    def __init__(self, field: str, problem: str) -> None:
        field, problem = clip(field), clip(problem, MESSAGE_LIMIT)
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class ModelNotFound(LmServeError):
    """The repository has no model of the requested name."""

    def __init__(self, name: str, available: list[str] | None = None) -> None:
        hint = f"; available: {clip(', '.join(sorted(available)), 500)}" if available else ""
        super().__init__(f"model {clip_repr(name)} not found{hint}")
        self.name = name


class ModelUnavailable(LmServeError):
    """The model is in the repository but is not serving (it failed to load)."""


class Overloaded(LmServeError):
    """The server is at capacity for this kind of work; the caller may retry later.

    `limit` names the setting that was hit (`max_queued_requests`), `model` the model whose
    queue is full, and `retry_after` the seconds a caller should wait (sent as RetryInfo);
    None when retrying cannot help."""

    def __init__(
        self,
        message: str,
        *,
        limit: str = "",
        model: str = "",
        retry_after: float | None = DEFAULT_RETRY_AFTER,
    ) -> None:
        super().__init__(message)
        self.limit = limit
        self.model = model
        self.retry_after = retry_after


class RequestTooLarge(Overloaded):
    """A request holds more than a limit allows (too many hypotheses, tokens...); it was
    refused before any work started. The message names the field, the size and the limit.
    No retry delay: the same request would be refused again."""

    def __init__(self, field: str, size: int, limit: int, what: str) -> None:
        super().__init__(
            f"{field}: has {size} {what}, more than the limit of {limit}",
            limit=clip(field),
            retry_after=None,
        )
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


class Unauthenticated(LmServeError):
    """The call carries no bearer token, or a wrong one. The message never quotes what was
    sent."""


class ModelLoadError(LmServeError):
    """A model folder could not be loaded. The message says which file and why.

    `reason` may be shown to clients (ListModels/GetModel, UNAVAILABLE): no file content, no
    absolute paths. `detail` (a quoted line, a library's message) goes to the server log only.
    """

    def __init__(self, path: str, reason: str, detail: str = "") -> None:
        super().__init__(f"{path}: {reason}" + (f" ({detail})" if detail else ""))
        self.path = path
        self.reason = reason
        self.detail = detail


class ManifestError(ModelLoadError):
    """The manifest is missing, unreadable or fails validation."""


class ChecksumMismatch(ModelLoadError):
    """A model file's sha256 differs from the one in the manifest."""


class ArpaFormatError(ModelLoadError):
    """An ARPA file is malformed. The reason names the line."""


# What a caller's request caused, not the server: refusals of bad input, limits, deadlines.
# Logged without a traceback below ERROR (`is_client_error`); everything else is a fault.
_CLIENT_ERRORS = (
    InvalidArgument,
    ModelNotFound,
    Overloaded,
    DeadlineExceeded,
    Cancelled,
    Unimplemented,
    Unauthenticated,
)


def is_client_error(exc: BaseException) -> bool:
    """Whether `exc` answers a caller's mistake or limit (no server fault: no ERROR line)."""
    return isinstance(exc, _CLIENT_ERRORS)
