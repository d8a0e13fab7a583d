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

Only the answer from the URL the session authorized (Authorization.url) is handed to the
session: with follow_redirects=True httpx follows redirects within one step of the flow, and a
redirect target's 401 or 403 is returned as it is: nothing refreshed, nothing retried.
A request is retried only if its body can be sent again: none or bytes (an httpx.ByteStream:
content=bytes or str, data=, json=, or a body read into memory), or a multipart upload whose
files are bytes or seekable. Any other body is streamed (content= a generator, an iterator, a
file, any iterable of chunks): the first send may have consumed it, so its refusal (401, or 403
with a challenge) is returned as it is, and the session is not asked (nothing refreshed).

Redirects and DPoP: httpx strips Authorization when a redirect changes origin, but not the
`DPoP` proof, and an auth flow cannot reach the requests httpx builds for redirects. A proof is
bound to its method and URL (htm, htu), useless elsewhere: a DPoP session should not follow
redirects (httpx's default: follow_redirects=False).

A DPoP server's `DPoP-Nonce` on an answer from the authorized URL (a 200 included: RFC 9449
§8.2) is remembered for the next proof to that server (Runtime.remember_dpop_nonce, which never
raises), so that a server rotating its nonce costs no refusal; a refusal handed to the session
carries its nonce to unauthorized() instead.

The async flow never blocks the event loop (Runtime.authorize_async / unauthorized_async).
The headers' values are secrets copied into the request (Python strings cannot be wiped).
"""
from __future__ import annotations

from typing import AsyncGenerator, Generator, Optional

import httpx

try:
    from httpx._multipart import FileField, MultipartStream
except ImportError:  # pragma: no cover - another httpx: multipart bodies are not retried
    FileField = MultipartStream = None  # type: ignore[assignment,misc]

from ._runtime import Runtime
from ._types import Authorization

__all__ = ["Auth"]


def _apply(request: httpx.Request, authorization: Authorization) -> None:
    for name, value in authorization.headers:
        request.headers[name] = value


def _refusal(authorization: Authorization, response: httpx.Response) -> Optional[str]:
    """The response's WWW-Authenticate when it refuses the authorization and the session must
    decide ("" for a 401 without one); None when it is an answer to return as it is (among
    them a redirect target's: the session authorized another URL)."""
    if str(response.request.url) != authorization.url:
        return None
    challenge: Optional[str] = response.headers.get("WWW-Authenticate")
    if response.status_code == 401:
        return challenge or ""
    if response.status_code == 403 and challenge:
        return challenge
    return None


def _replayable(request: httpx.Request) -> bool:
    """Whether the request's body can be sent again: bytes in memory (httpx.ByteStream), or a
    multipart upload whose files are bytes or seekable (httpx seeks them back to 0). A streamed
    body (IteratorByteStream, AsyncIteratorByteStream) is consumed by the first send."""
    stream = request.stream
    if isinstance(stream, httpx.ByteStream):
        return True
    if MultipartStream is not None and isinstance(stream, MultipartStream):
        return all(not isinstance(field, FileField) or isinstance(field.file, (bytes, str)) or _seekable(field.file)
                   for field in stream.fields)
    return False


def _seekable(file: object) -> bool:
    seekable = getattr(file, "seekable", None)
    try:
        return bool(seekable()) if callable(seekable) else False
    except (OSError, ValueError):
        return False


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
        challenge = _refusal(authorization, response)
        if challenge is None or not _replayable(request):  # no refresh for a request not retried
            self._nonce(authorization, response)
            return
        retry = self.runtime.unauthorized(authorization, response.status_code, challenge or None,
                                          dpop_nonce=response.headers.get("DPoP-Nonce"))
        _apply(request, retry)
        response = yield request
        self._nonce(authorization, response)

    async def async_auth_flow(self, request: httpx.Request) -> AsyncGenerator[httpx.Request, httpx.Response]:
        authorization = await self.runtime.authorize_async(request.method, str(request.url))
        _apply(request, authorization)
        response = yield request
        challenge = _refusal(authorization, response)
        if challenge is None or not _replayable(request):  # no refresh for a request not retried
            self._nonce(authorization, response)
            return
        retry = await self.runtime.unauthorized_async(authorization, response.status_code, challenge or None,
                                                      dpop_nonce=response.headers.get("DPoP-Nonce"))
        _apply(request, retry)
        response = yield request
        self._nonce(authorization, response)

    def _nonce(self, authorization: Authorization, response: httpx.Response) -> None:
        """A DPoP server's new nonce on an answer from the authorized URL (RFC 9449 §8.2):
        remembered for the next proof to it. Not for a refusal handed to unauthorized(), which
        takes its nonce. Never raises (Runtime.remember_dpop_nonce)."""
        nonce = response.headers.get("DPoP-Nonce")
        if nonce is not None and authorization.scheme == "DPoP" and str(response.request.url) == authorization.url:
            self.runtime.remember_dpop_nonce(authorization.url, nonce)
