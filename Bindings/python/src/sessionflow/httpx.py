"""`sessionflow.httpx.Auth`: the session authorizes httpx requests (`pip install sessionflow[httpx]`).

    import httpx, sessionflow, sessionflow.httpx
    with sessionflow.Runtime(token_endpoint=..., client_id=...) as runtime:
        runtime.sign_in(...)
        with httpx.Client(auth=sessionflow.httpx.Auth(runtime)) as client:
            client.get("https://api.example.com/me")
        # or: async with httpx.AsyncClient(auth=sessionflow.httpx.Auth(runtime)) as client: ...

Each request gets the headers Runtime.authorize gives (the token refreshed first when due:
one refresh shared by every request). A 401 goes to Runtime.unauthorized, which refreshes
only if the refused token is still the session's (compare-and-refresh), and the request is
sent once more with its answer; whatever the retry gets is the response. A 403 that carries a
WWW-Authenticate challenge goes to the session too, which raises UnauthorizedError (a new
token would not help: insufficient_scope); a 403 without one is returned as it is.
Errors are the session's: AuthError when the session is dead (the refresh token was refused:
the state is SESSION_EXPIRED; nothing is retried), NotLoggedInError, NetworkError...

The async flow never blocks the event loop (Runtime.authorize_async / unauthorized_async).
The headers' values are secrets copied into the request (Python strings cannot be wiped).
"""
from __future__ import annotations

from typing import AsyncGenerator, Generator, Optional

import httpx

from ._runtime import Runtime
from ._types import Authorization

__all__ = ["Auth"]


def _apply(request: httpx.Request, authorization: Authorization) -> None:
    for name, value in authorization.headers:
        request.headers[name] = value


def _refusal(response: httpx.Response) -> Optional[str]:
    """The response's WWW-Authenticate when it refuses the authorization and the session must
    decide ("" for a 401 without one); None when it is an answer to return as it is."""
    challenge: Optional[str] = response.headers.get("WWW-Authenticate")
    if response.status_code == 401:
        return challenge or ""
    if response.status_code == 403 and challenge:
        return challenge
    return None


class Auth(httpx.Auth):
    """An httpx authentication flow over a sessionflow Runtime: sync (httpx.Client) and async
    (httpx.AsyncClient). Each request is sent at most twice."""

    requires_request_body = False
    requires_response_body = False

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def sync_auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        authorization = self.runtime.authorize(request.method, str(request.url))
        _apply(request, authorization)
        response = yield request
        challenge = _refusal(response)
        if challenge is None:
            return
        retry = self.runtime.unauthorized(authorization, response.status_code, challenge or None,
                                          dpop_nonce=response.headers.get("DPoP-Nonce"))
        _apply(request, retry)
        yield request

    async def async_auth_flow(self, request: httpx.Request) -> AsyncGenerator[httpx.Request, httpx.Response]:
        authorization = await self.runtime.authorize_async(request.method, str(request.url))
        _apply(request, authorization)
        response = yield request
        challenge = _refusal(response)
        if challenge is None:
            return
        retry = await self.runtime.unauthorized_async(authorization, response.status_code, challenge or None,
                                                      dpop_nonce=response.headers.get("DPoP-Nonce"))
        _apply(request, retry)
        yield request
