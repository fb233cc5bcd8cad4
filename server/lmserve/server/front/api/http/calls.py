"""What every HTTP call goes through, whichever route carries it: its request id, the bearer
token check, metrics and the access log (`observed_call`, shared with the gRPC front), and the
mapping of what it raised to one `Failure`.

    async with calls.call("Score", headers) as call:     # raises CallFailed(failure)
        ...
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping

from lmserve.server.errors import Unauthenticated
from lmserve.server.front.api.auth import bearer_problem
from lmserve.server.front.api.http.failures import Failure, failure_of
from lmserve.server.front.api.observed_call import CallObserver, ObservedCall

REQUEST_ID_HEADER = "x-request-id"


class CallFailed(Exception):
    """A call failed; `failure` says how to answer it (each route writes it its own way)."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


class HttpCalls:
    """Starts, authorizes and finishes the HTTP front's calls."""

    def __init__(self, observer: CallObserver, token: str | None) -> None:
        self._observer = observer
        self._expected = None if token is None else token.encode("utf-8")

    @property
    def needs_token(self) -> bool:
        return self._expected is not None

    def authorize(self, authorization: str | None) -> None:
        """Raises Unauthenticated unless `authorization` carries the token (when one is set)."""
        if self._expected is None:
            return
        problem = bearer_problem(authorization, self._expected)
        if problem is not None:
            raise Unauthenticated(problem)

    @contextlib.asynccontextmanager
    async def call(
        self, method: str, headers: Mapping[str, str], *, authorization: str | None = None
    ) -> AsyncIterator[ObservedCall]:
        """One call: begun (request id from `x-request-id`), authorized (`authorization`, else
        the header), counted on exit with its status. What it raises leaves as CallFailed."""
        call = self._observer.start(method, headers.get(REQUEST_ID_HEADER))
        try:
            self.authorize(authorization or headers.get("authorization"))
            yield call
        except BaseException as exc:
            failure = failure_of(exc, method)
            call.finish(failure.code.name)
            if isinstance(exc, Exception):
                raise CallFailed(failure) from exc
            raise
        finally:
            call.finish("OK")  # no-op after a failure
