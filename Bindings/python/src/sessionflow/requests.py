"""`sessionflow.requests.Auth`: the session authorizes requests' requests
(`pip install sessionflow[requests]`).

    import requests, sessionflow, sessionflow.requests
    with sessionflow.Runtime(token_endpoint=..., client_id=...) as runtime:
        runtime.sign_in(...)
        session = requests.Session()
        session.auth = sessionflow.requests.Auth(runtime)
        session.get("https://api.example.com/me")

Each request gets the headers Runtime.authorize gives (the token refreshed first when due:
one refresh shared by every request). A response hook hands a 401 to Runtime.unauthorized
(compare-and-refresh: a refresh only if the refused token is still the session's) and sends a
copy of the request once more, through the same connection adapter, with its answer; the
copy carries no hook of ours, so it is never retried again. The 401 is in the answer's
`history`. A 403 that carries a WWW-Authenticate challenge goes to the session too, which
raises UnauthorizedError (insufficient_scope: a new token would not help); a 403 without one
is returned as it is. Errors are the session's: AuthError when the session is dead (the
state is SESSION_EXPIRED; nothing is retried), NotLoggedInError, NetworkError...

Only the answer to the request the session authorized is handed to the session: requests
copies that request, our hook with it, for each redirect, and a redirect target's 401 or 403
(another URL than Authorization.url) is returned as it is: nothing refreshed, nothing retried,
no token added (requests strips Authorization when the host changes; we never put it back). A
DPoP proof is bound to its method and URL (htm, htu): on a 3xx with a Location the hook removes
the `DPoP` header from the request the redirect is copied from, so that the proof never travels
to the new location (requests keeps Authorization on the same host; the target judges it).

A request is retried only if its body can be sent again: none, bytes or str, or a stream
requests recorded a position for (tell()) and which rewinds to it. Any other body (a generator,
an iterator, a file without tell()) was consumed by the first send: its refusal (401, or 403
with a challenge) is returned as it is, and the session is not asked (nothing refreshed).
A DPoP server's `DPoP-Nonce` on an answer from the authorized URL (a 200 included: RFC 9449
§8.2) is remembered for the next proof to that server (Runtime.remember_dpop_nonce, which never
raises), so that a server rotating its nonce costs no refusal; a refusal handed to the session
carries its nonce to unauthorized() instead.
The headers' values are secrets copied into the request (Python strings cannot be wiped).
"""
from __future__ import annotations

from typing import Any, Callable

import requests
import requests.auth
from requests.models import PreparedRequest, Response

from ._runtime import Runtime
from ._types import Authorization

__all__ = ["Auth"]


def _apply(request: PreparedRequest, authorization: Authorization) -> None:
    for name, value in authorization.headers:
        request.headers[name] = value


class Auth(requests.auth.AuthBase):
    """A requests authentication over a sessionflow Runtime; each request is sent at most twice."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def __call__(self, request: PreparedRequest) -> PreparedRequest:
        authorization = self.runtime.authorize(request.method or "GET", request.url or "")
        _apply(request, authorization)
        request.hooks["response"].append(self._hook(authorization))
        return request

    def _hook(self, authorization: Authorization) -> Callable[..., Response]:
        def on_response(response: Response, **kwargs: Any) -> Response:
            if _redirect(response):
                # The redirect's request is a copy of this one (Session.resolve_redirects).
                _drop_proof(response.request)
                self._nonce(authorization, response)
                return response
            if response.request.url != authorization.url:
                # A redirect target's answer (the copy of the request runs this hook too): the
                # session authorized another URL. Returned as it is, no token sent there.
                return response
            challenge = response.headers.get("WWW-Authenticate")
            refused = response.status_code == 401 or (response.status_code == 403 and bool(challenge))
            if not refused:
                self._nonce(authorization, response)
                return response
            retry = response.request.copy()
            # The mark: the copy runs no hook of ours, so it is never retried again. (copy()
            # shares the hook lists: a new one, so that the running dispatch is not disturbed.)
            others = [hook for hook in retry.hooks["response"] if hook is not on_response]
            retry.hooks = {**retry.hooks, "response": others}
            if not _rewound(retry):  # before unauthorized(): no refresh for a request not retried
                self._nonce(authorization, response)
                return response
            answer = self.runtime.unauthorized(authorization, response.status_code, challenge,
                                               dpop_nonce=response.headers.get("DPoP-Nonce"))
            _apply(retry, answer)
            _discard(response)
            sent: Response = response.connection.send(retry, **kwargs)
            self._nonce(authorization, sent)
            if _redirect(sent):
                # requests builds the redirect's request from the first one (not the retry).
                _drop_proof(response.request)
                _drop_proof(retry)
            sent.history.append(response)
            sent.request = retry
            return sent

        return on_response

    def _nonce(self, authorization: Authorization, response: Response) -> None:
        """A DPoP server's new nonce on an answer from the authorized URL (RFC 9449 §8.2):
        remembered for the next proof to it. Not for a refusal handed to unauthorized(), which
        takes its nonce. Never raises (Runtime.remember_dpop_nonce)."""
        nonce = response.headers.get("DPoP-Nonce")
        if nonce is not None and authorization.scheme == "DPoP" and response.request.url == authorization.url:
            self.runtime.remember_dpop_nonce(authorization.url, nonce)


# The most of a refusal's body read so that its connection can serve the retry.
_REFUSAL_READ = 64 * 1024


def _discard(response: Response) -> None:
    """Done with a refusal: its body, if it ends within _REFUSAL_READ bytes, is read — kept as
    the response's content (the refusal stays readable in the answer's `history`) and its
    connection goes back to the pool; a longer one (or an endless one) is not read on, its
    content is empty and its connection closed. Never raises: the retry goes on."""
    body, complete = b"", False
    try:
        if response.raw is not None:
            body = response.raw.read(_REFUSAL_READ + 1, decode_content=True)
            complete = len(body) <= _REFUSAL_READ  # a short read is the end of the body
    except Exception:  # a connection already gone: nothing to keep
        pass
    if not complete and response.raw is not None:
        try:
            response.raw.close()  # unread bytes: the connection must not go back to the pool
        except Exception:
            pass
    # What `.content` would have read (requests' own fields, which `.content` reads).
    setattr(response, "_content", body if complete else b"")
    setattr(response, "_content_consumed", True)
    response.close()


def _redirect(response: Response) -> bool:
    return 300 <= response.status_code < 400 and "Location" in response.headers


def _drop_proof(request: PreparedRequest) -> None:
    """A DPoP proof names its request's method and URL: useless after a redirect."""
    request.headers.pop("DPoP", None)


def _rewound(request: PreparedRequest) -> bool:
    """Whether the body can be sent again: none, bytes or str, or a stream requests recorded a
    position for (tell()), rewound to it. Any other body (a generator, an iterator, a file
    without tell()) was consumed by the first send."""
    body = request.body
    if body is None or isinstance(body, (bytes, bytearray, str)):
        return True
    if getattr(request, "_body_position", None) is None:
        return False
    try:
        requests.utils.rewind_body(request)
    except requests.exceptions.UnrewindableBodyError:
        return False
    return True
