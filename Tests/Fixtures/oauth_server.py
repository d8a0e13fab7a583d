r"""A real OAuth 2.0 authorization server for the tests, on loopback: Authlib + Flask.

Grants: password (how a test signs a user in) and refresh_token (RFC 6749 §6, with
rotation: each refresh issues a new refresh token and revokes the old one; --no-rotation: none
issued, the old one stays valid, as Google's do).
Endpoints: RFC 7009 revocation, RFC 7662 introspection, a protected resource that answers
401 for an expired or revoked token, and test hooks (/__stats, /__revoke_user, /__fault,
/__last_request, /__requests, /__redirect_hits).

Reuse grace (POST /__reuse_grace seconds=S; 0, the default, is none): a refresh token rotated less
than S seconds ago is accepted once more, as Auth0's leeway, Okta's grace period and Cognito's
do — the tokens its rotation issued are revoked (superseded) and new ones issued; counted as
"reuse_within_grace". Past the grace, or the second time, reuse is what the token's rotation
says (drip/cut/rotate-late: the grant is revoked).

/__fault (POST mode=..., count=N, retry_after=S, endpoint=token|revoke|introspect|metadata|openid) makes the
next N requests to that endpoint (default: token) misbehave:
  delay:<s>      answer normally after <s> seconds      hang        never answer (until exit)
  hold           answer normally once POST /__release arrives (every held answer then, and any
                 later one at once; 120 s at most, a hang guard): a test that must act while
                 the answer is held does not race a clock
  status:<code>  that status, a plain-text body          invalid_grant / invalid_client
  html           200 with an HTML page                   truncated   200 with cut-off JSON
  missing        200 JSON without access_token           huge        200 with a 4 MiB body
  expires:<n>    a real refresh whose expires_in is <n> (any JSON number or string)
  redirect:<code>  (301, 302, 303, 307, 308) that status, no body, and a Location on a second
                 listener of this process (another loopback port, same path) that records every
                 hit (method, path, headers, body: GET /__redirect_hits; count in /__stats
                 "redirect_target_hits") and answers 200 with a valid-looking token answer
                 {"access_token": "tok-from-redirect-target", "refresh_token":
                 "rt-from-redirect-target", "token_type": "Bearer", "expires_in": 3600,
                 "active": true} to anything. A client that follows the redirect shows there.
  rotate-late:<s>  (token endpoint, refresh_token grant) a real refresh that rotates at once (the
                 old refresh token is consumed the moment the request arrives), then holds the
                 answer <s> seconds before writing it. Errors (an unknown token...) are answered
                 at once. A rotation is committed only if its answer was delivered: during the
                 hold (every 10 ms) and once more just before writing, the server looks at the
                 client's socket (poll, then recv MSG_PEEK); if the client has closed it (EOF or
                 reset: it cancelled), the rotation is rolled back (the new tokens are forgotten,
                 the old refresh token is valid again) and "cancelled_before_answer" is counted.
                 A request that presents the held token looks at the holder's socket first, so
                 a client that cancels and retries at once is not taken for reuse: a cancelled
                 request is over when its client closed the connection.
                 Strict reuse detection (RFC 9700 §4.14.2): a refresh token presented while a
                 rotate-late request with it is in flight (by any request, faulted or not), or
                 presented again after a rotate-late rotation was committed, revokes the whole
                 grant (every access and refresh token descended from the same sign-in, those
                 being issued included) and is answered invalid_grant; counted as
                 "reuse_detected" (and "families_revoked" once per grant). A request in flight
                 whose grant was revoked meanwhile still writes its (dead) tokens, as a real
                 server would, and its cancellation rolls nothing back. Answers written:
                 "rotations_committed". A client that half-closes its socket after sending
                 counts as gone. Ordinary refreshes keep Authlib's rotation: the old token is
                 revoked, and presenting it again is a plain invalid_grant (unless
                 --strict-reuse).
  drip:<s>[:<gap>]  (token endpoint, refresh_token grant) a real refresh, rotated and committed at
                 once (the old refresh token is consumed; presenting it again is reuse: the
                 grant is revoked, as with rotate-late, unless within the reuse grace below);
                 the 200, its headers and the first byte of the body go out at once, the rest
                 of the body one byte every <gap> seconds (default 0.25) spread over about <s>
                 seconds: an answer that is arriving, slowly. Counted as "drips_started",
                 "drips_completed" (every byte written) and "drips_aborted" (the client went away).
  cut:<n>        (token endpoint, refresh_token grant) the same rotation, then the 200 with the
                 full Content-Length and only the first <n> bytes of the body, and the connection
                 is closed: an answer lost mid-body. Counted as "answers_cut".
  stream-huge:<MiB>          200 with Content-Length <MiB> MiB (fractions allowed), the body a
                 token JSON padded with "x" and streamed in 64 KiB chunks, so the client can stop
                 reading mid-way.
  stream-huge-chunked:<MiB>  the same without Content-Length (Transfer-Encoding: chunked).
                 Both record "streams_started", "streams_completed", "streams_aborted" and
                 "stream_bytes_sent": how many bytes of the last stream's body were written to the
                 socket before the client went away (kernel buffers included, so more than the
                 client read).
  gzip-bomb      200, Content-Encoding: gzip, Content-Type: application/json: 995 KB of gzip
                 (under 1 MiB, so a limit that counts only bytes on the wire lets it in) that
                 inflates to ~1 GB (a token JSON whose "padding" is 960 MiB of spaces), built
                 once, when the fault is set, without ever holding the inflated text. Counted
                 as "gzip_bombs_served"; what the client sent as Accept-Encoding (or that it
                 sent none) is in /__last_request's headers.
  echo           400 {"error": <the refresh token (or `token`) as sent>, "error_description": that
                 token raw, form-encoded, every byte percent-encoded (upper and lower hex),
                 JSON-escaped ("\/" and every character as a \u escape, as text: the decoded
                 description holds the escapes), the client_secret if one was sent (form or Basic),
                 the DPoP proof (first) if one was sent,
                 then "\u001b]0;pwned\u0007\u001b[2J session OK"}, with the token also in
                 WWW-Authenticate (error and error_description) and X-Echo headers (there
                 percent-encoded unless it is printable ASCII).
  echo-200       200 {"access_token": "tok-echo", "token_type": <the token as sent>, "expires_in": 3600}.
  set:<name>=<text>      (any endpoint; meant for metadata) the real JSON answer with member <name>
                 set to the string <text> (e.g. set:issuer=https://other.example)
  set-json:<name>=<json> the same with a JSON value (set-json:token_endpoint=42)
  drop:<name>    the real JSON answer without member <name>
retry_after adds a Retry-After header (seconds) to a status answer.

Metadata (discovery): GET /.well-known/oauth-authorization-server[/<tenant>] (RFC 8414; the
issuer is http://127.0.0.1:<port>[/<tenant>]) and GET [/<tenant>]/.well-known/openid-configuration
(OpenID Connect Discovery; adds userinfo_endpoint = /api/me) name the real token, revocation and
introspection endpoints, and /oauth/device_authorization and /oauth/authorize (named, whether or
not implemented). Their fault endpoints are "metadata" (RFC 8414) and "openid"; e.g. status:404 on
"metadata" makes a client fall back to OpenID Connect. Counted as "metadata_requests" and
"openid_requests"; both are recorded like /oauth/* (see /__last_request).

Device authorization grant (RFC 8628, Authlib's rfc8628): POST /oauth/device_authorization
(client_id, scope) issues a device code and a user code; the token endpoint takes
grant_type=urn:ietf:params:oauth:grant-type:device_code. The user's side, as a browser would:
  POST /__device/approve   user_code=<code> [user=alice]   the user approves (tokens for <user>)
  POST /__device/deny      user_code=<code>                the user refuses (access_denied)
  POST /__device/config    interval=<s> expires_in=<s> (what the device endpoint announces;
                           defaults 5 and 1800), lifetime=<s> (how long codes really live,
                           default: expires_in), slow_down=<n> (the next n pending polls answer
                           slow_down), reset=1 (defaults again). Answers the settings as JSON.
  GET  /__device/stats     {"device_requests", "polls", "slow_downs", "pending", "denied",
                           "expired", "granted"}; each poll is also in /__requests (with "time").

Authorization code grant with PKCE (RFC 6749 §4.1, RFC 7636; Authlib's AuthorizationCodeGrant with
CodeChallenge(required=True), so the public client must send an S256 or plain code_challenge and
then the matching code_verifier). Redirect URIs: http to 127.0.0.1 or [::1], any port (RFC 8252
§7.3), path /callback. As a browser would:
  GET  /oauth/authorize?response_type=code&client_id=..&redirect_uri=..&state=..&code_challenge=..
                           &code_challenge_method=S256[&scope=..]
                           200: an HTML consent form (<form method="post" action="/oauth/authorize">
                           with every query parameter as <input type="hidden" name=.. value=..>, an
                           <input name="user" value="alice">, and buttons consent=allow / consent=deny).
                           A bad client or redirect_uri: a 400 error page, no redirect.
  POST /oauth/authorize    those fields plus consent=allow|deny [user=bob]: 302 to
                           redirect_uri?code=..&state=.. (allow) or ?error=access_denied&state=..
  GET  /__authorize/stats  {"authorize_pages", "consents", "denials", "codes_issued", "code_exchanges",
                           "codes_refused"}; a code is good for one exchange (5 minutes).
The token endpoint takes grant_type=authorization_code (code, redirect_uri, code_verifier, client_id).

Protected resource (RFC 6750, Authlib's ResourceProtector + BearerTokenValidator):
  ANY  /api/resource       200 {"ok", "user", "scope", "method", "request_id" (X-Request-Id)} for a
                           valid bearer token; 401 with WWW-Authenticate: Bearer error="invalid_token"
                           for an expired, revoked or unknown one; 401 with a bare Bearer challenge
                           without a token
  GET  /__resource/stats   {"requests", "ok", "unauthorized", "no_token", "presented": {token: n}}
  POST /__resource/revoke_access  token=<access token>: the resource refuses it (invalid_token) from
                           now on; its refresh token still refreshes
  POST /__resource/config  grant_scope=<scope> (tokens issued from now on get that scope, whatever
                           was asked; empty: as asked), reset=1 (counters to zero)

DPoP (RFC 9449), checked with joserfc: a request to the token endpoint with a `DPoP` header is
checked as §4.3 says (one header; a JWS; typ dpop+jwt; alg in an asymmetric allow-list; the
signature by the header's public `jwk`; jti, htm, htu (no query or fragment), iat within
iat_window; a jti never seen before; the nonce when one is demanded) and the tokens it gets are
bound to the key's RFC 7638 thumbprint (token_type "DPoP"); a bound refresh token refreshes only
with a proof by that key (else invalid_grant, counted as "dpop_bound_refused"). /api/resource and
/api/me take `Authorization: DPoP <token>` with a proof whose `ath` is the token's hash, by the
bound key (a bound token sent as Bearer is invalid_token). Refusals: 400 invalid_dpop_proof /
use_dpop_nonce at the token endpoint, 401 with `WWW-Authenticate: DPoP error=...` at resources;
a demanded nonce comes in `DPoP-Nonce` (also on good answers while nonces are on). Metadata lists
dpop_signing_alg_values_supported.
  POST /__dpop/config   nonce_token / nonce_resource = off | on | rotate | always, iat_window=<s>, ignore=1,
                        advertise=0, new_nonce=1, reset=1 (see dpop_config)
  GET  /__dpop/stats    {"endpoints": {token|resource|userinfo: {"valid", "invalid", "absent",
                        "nonce_demanded"}}, "nonce", "bound_refused", "log"}
  GET  /__tokens        every token issued, with its "jkt"

Other hooks:
  GET /__stats          counters (all integers): grants, requests, revocations, introspections,
                        and the counters of the faults above
  GET /__last_request   the last request to /oauth/* or /.well-known/*: method, path, headers (all of them), form
                        (secrets included: the tests are the only reader), the fault it got
                        and, once its answer was made, "status" (the HTTP status the server
                        answered, whether or not the client was still there to read it)
  GET /__requests       the last 200 such requests, oldest first
  GET /__redirect_hits  {"port": <the redirect target's port>, "hits": [{method, path, headers, body}]}
  POST /__revoke_user   user=<name>: revokes every token of that user

    python3 oauth_server.py --expires-in 2      prints "PORT <n>" once listening
    python3 oauth_server.py --strict-reuse      every rotated refresh token presented again
                                                revokes its grant (not only rotate-late ones)
"""
import argparse
import base64
import html
import collections
import json
import os
import select
import signal
import socket
import struct
import sys
import threading
import time
import urllib.parse
import uuid
import zlib

from authlib.integrations.flask_oauth2 import AuthorizationServer, ResourceProtector
from authlib.oauth2.rfc6749 import ClientMixin, TokenMixin, grants
from authlib.oauth2.rfc6750 import BearerTokenValidator
from authlib.oauth2.rfc7009 import RevocationEndpoint
from authlib.oauth2.rfc7636 import CodeChallenge
from authlib.oauth2.rfc7662 import IntrospectionEndpoint
from authlib.oauth2.rfc8628 import DEVICE_CODE_GRANT_TYPE, DeviceAuthorizationEndpoint, DeviceCodeGrant
from authlib.oauth2.rfc8628 import DeviceCredentialDict
from flask import Flask, Response, g, jsonify, request
from werkzeug.exceptions import HTTPException
from werkzeug.serving import make_server

lock = threading.Lock()
stats = {
    "refresh_grants": 0, "password_grants": 0, "revocations": 0, "introspections": 0, "token_requests": 0,
    "revoke_requests": 0, "introspect_requests": 0,
    "reuse_detected": 0, "families_revoked": 0,
    "rotate_late_requests": 0, "rotations_committed": 0, "cancelled_before_answer": 0,
    "drips_started": 0, "drips_completed": 0, "drips_aborted": 0, "answers_cut": 0, "reuse_within_grace": 0,
    "redirects_sent": 0, "redirect_target_hits": 0,
    "streams_started": 0, "streams_completed": 0, "streams_aborted": 0, "stream_bytes_sent": 0,
    "gzip_bombs_served": 0, "echoes_served": 0,
    "metadata_requests": 0, "openid_requests": 0, "dpop_bound_refused": 0,
}
# endpoint -> [[mode, remaining, retry_after]]: the next requests to that endpoint misbehave
faults = {"token": [], "revoke": [], "introspect": [], "metadata": [], "openid": []}
hang_forever = threading.Event()
released = threading.Event()  # POST /__release: the `hold` answers go
requests_seen = collections.deque(maxlen=200)  # what /oauth/* was sent (see /__last_request)
redirect_hits = []  # what the redirect target was sent
redirect_target = {"port": None}
# Strict reuse detection (see rotate-late): refresh token -> the Holder (request) holding it.
in_flight = {}
reuse_log = []  # why each reuse was detected (GET /__reuse), for a failing test to show
revoked_families = set()
# The protected resource (/api/resource): what it was sent and what it answered.
resource_stats = {"requests": 0, "ok": 0, "unauthorized": 0, "no_token": 0}
resource_presented = collections.Counter()  # access token -> how often it was presented
resource_settings = {"grant_scope": None}
reuse_grace = {"seconds": 0.0}  # POST /__reuse_grace
strict_reuse = False  # --strict-reuse: every rotated refresh token, not only rotate-late ones
rotation = True  # --no-rotation: a refresh keeps the refresh token (no new one, the old one valid)


class User:
    def __init__(self, name):
        self.id = name

    def get_user_id(self):
        return self.id


USERS = {"alice": User("alice"), "bob": User("bob")}
PASSWORD = "correct horse"


class Client(ClientMixin):
    def __init__(self, client_id, secret, auth_methods):
        self.client_id = client_id
        self.client_secret = secret
        self.auth_methods = auth_methods

    def get_client_id(self):
        return self.client_id

    def get_default_redirect_uri(self):
        return None  # a redirect_uri is required (the loopback one of the request)

    def get_allowed_scope(self, scope):
        # POST /__resource/config grant_scope=<scope>: every token is granted that scope,
        # whatever was asked (RFC 6749 §3.3: the server may grant less; §5.1 says it then
        # returns `scope`).
        with lock:
            override = resource_settings["grant_scope"]
        return override if override is not None else (scope or "")

    def check_redirect_uri(self, redirect_uri):
        # RFC 8252 §7.3: a native client's loopback redirect is registered without a port and
        # accepted on any port, http only, to 127.0.0.1 or [::1]; the path must be /callback.
        parts = urllib.parse.urlsplit(redirect_uri)
        return (parts.scheme == "http" and parts.hostname in ("127.0.0.1", "::1") and parts.port is not None
                and parts.path == "/callback" and not parts.query and not parts.fragment
                and parts.username is None)

    def check_client_secret(self, client_secret):
        return self.client_secret is not None and client_secret == self.client_secret

    def check_endpoint_auth_method(self, method, endpoint):
        return method in self.auth_methods

    def check_response_type(self, response_type):
        return response_type == "code"

    def check_grant_type(self, grant_type):
        return grant_type in ("password", "refresh_token", DEVICE_CODE_GRANT_TYPE, "authorization_code")


CLIENTS = {
    "sessionflow-public": Client("sessionflow-public", None, ["none"]),
    "sessionflow-confidential": Client("sessionflow-confidential", "s3cret", ["client_secret_post", "client_secret_basic"]),
}


class Token(TokenMixin):
    def __init__(self, client_id, user_id, data, family):
        self.client_id = client_id
        self.user_id = user_id
        self.access_token = data["access_token"]
        self.refresh_token = data.get("refresh_token")
        self.scope = data.get("scope", "")
        self.expires_in = data["expires_in"]
        self.issued_at = time.time()
        self.revoked = False
        # The grant this token descends from (one per password sign-in), for reuse detection.
        self.family = family
        self.rotated = False  # revoked because a refresh rotated it (not by revocation)
        self.strict = False  # rotated by rotate-late: presenting it again is reuse
        self.pending = False  # issued by a rotate-late request whose answer is not delivered yet
        self.rotated_at = None  # time.monotonic() of its rotation
        self.successor = None  # the token its rotation issued (drip/cut)
        self.grace_used = False  # accepted once more within the reuse grace
        self.access_revoked = False  # the access token alone refused (/__resource/revoke_access)
        self.jkt = None  # DPoP: the thumbprint of the key the tokens are bound to (cnf.jkt)

    def check_client(self, client):
        return client.get_client_id() == self.client_id

    def get_scope(self):
        return self.scope

    def get_expires_in(self):
        return self.expires_in

    def is_expired(self):
        return time.time() >= self.issued_at + self.expires_in

    def is_revoked(self):
        return self.revoked or self.pending

    def get_user(self):
        return USERS[self.user_id]

    def get_client(self):
        return CLIENTS[self.client_id]


TOKENS = []


def find_token(value, hint=None):
    with lock:
        return find_token_locked(value, hint)


def find_token_locked(value, hint=None):
    for token in TOKENS:
        if hint != "refresh_token" and token.access_token == value:
            return token
        if hint != "access_token" and token.refresh_token == value:
            return token
    return None


class Holder:
    """A rotate-late request holding a refresh token (see in_flight)."""

    def __init__(self, connection):
        self.thread = threading.get_ident()
        self.connection = connection
        self.started = time.monotonic()
        self.wake = threading.Event()  # look at the client's socket now
        self.done = threading.Event()  # committed or rolled back, and out of in_flight


def settle(refresh_token):
    """If a rotate-late request holds `refresh_token` but its client has already closed the
    connection (the holder has not noticed yet: it looks every 10 ms), let the holder roll back
    first: a cancelled request is over for the client, so presenting the token again is no
    reuse, however soon it comes."""
    while True:
        with lock:
            holder = in_flight.get(refresh_token)
            if holder is None or holder.thread == threading.get_ident() or not client_gone(holder.connection):
                return
            holder.wake.set()
        # However long the holder takes to be scheduled (a loaded machine): its client is gone,
        # so this request is not reuse. A holder ends by its hold's deadline in any case.
        holder.done.wait(60)


def revoke_family_locked(family):
    """Reuse detected: every token of the grant dies (RFC 9700 §4.14.2)."""
    stats["reuse_detected"] += 1
    if family not in revoked_families:
        revoked_families.add(family)
        stats["families_revoked"] += 1
    for token in TOKENS:
        if token.family == family:
            token.revoked = True


def query_client(client_id):
    return CLIENTS.get(client_id)


def save_token(data, req):
    parent = req.refresh_token if isinstance(req.refresh_token, Token) else None
    family = parent.family if parent else uuid.uuid4().hex
    token = Token(req.client.get_client_id(), req.user.get_user_id(), data, family)
    jkt = g.get("dpop_jkt")
    if jkt:  # a DPoP proof came with the request: the tokens are bound to its key (RFC 9449 §5)
        token.jkt = jkt
        data["token_type"] = "DPoP"
    with lock:
        if family in revoked_families:
            token.revoked = True  # issued while its grant was being revoked
        TOKENS.append(token)
    g.issued_token = token


class PasswordGrant(grants.ResourceOwnerPasswordCredentialsGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = ["none", "client_secret_post", "client_secret_basic"]

    def authenticate_user(self, username, password):
        with lock:
            stats["password_grants"] += 1
        if username in USERS and password == PASSWORD:
            return USERS[username]
        return None


class RefreshGrant(grants.RefreshTokenGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = ["none", "client_secret_post", "client_secret_basic"]

    @property
    def INCLUDE_NEW_REFRESH_TOKEN(self):  # noqa: N802 (Authlib's name)
        return rotation  # --no-rotation: the answer has no refresh token; the old one stays

    def authenticate_refresh_token(self, refresh_token):
        with lock:
            stats["refresh_grants"] += 1
        settle(refresh_token)
        with lock:
            token = find_token_locked(refresh_token, "refresh_token")
            if token is None:
                return None
            holder = in_flight.get(refresh_token)
            if holder is not None and holder.thread != threading.get_ident():
                reuse_log.append({"why": "in flight", "holder_age_ms": int((time.monotonic() - holder.started) * 1000),
                                  "holder_client_gone": client_gone(holder.connection),
                                  "holder_has_connection": holder.connection is not None})
                revoke_family_locked(token.family)  # presented while a request with it is in flight
                return None
            grace = reuse_grace["seconds"]
            if (token.revoked and token.rotated and grace > 0 and not token.grace_used
                    and token.family not in revoked_families and token.rotated_at is not None
                    and time.monotonic() - token.rotated_at <= grace):
                token.grace_used = True
                token.revoked = token.rotated = False  # rotated again by this request
                if token.successor is not None:
                    token.successor.revoked = True  # superseded: its answer never arrived
                stats["reuse_within_grace"] += 1
                return token
            if token.revoked and token.rotated and (token.strict or strict_reuse):
                reuse_log.append({"why": "after rotation", "strict": token.strict})
                revoke_family_locked(token.family)  # presented again after its rotation
                return None
            if token.revoked or token.pending:
                return None
            if token.jkt is not None and token.jkt != g.get("dpop_jkt"):
                # RFC 9449 §5: a bound refresh token refreshes only with a proof by its key.
                stats["dpop_bound_refused"] += 1
                return None
            return token

    def authenticate_user(self, refresh_token):
        return refresh_token.get_user()

    def revoke_old_credential(self, refresh_token):
        if not rotation:
            return  # the client keeps using it (Google's refresh tokens, say)
        with lock:
            refresh_token.revoked = True
            refresh_token.rotated = True
            refresh_token.rotated_at = time.monotonic()
        g.rotated_token = refresh_token


class Revocation(RevocationEndpoint):
    CLIENT_AUTH_METHODS = ["none", "client_secret_post", "client_secret_basic"]

    def query_token(self, token_string, token_type_hint):
        return find_token(token_string, token_type_hint)

    def revoke_token(self, token, request):
        with lock:
            stats["revocations"] += 1
        token.revoked = True


class Introspection(IntrospectionEndpoint):
    CLIENT_AUTH_METHODS = ["none", "client_secret_post", "client_secret_basic"]

    def query_token(self, token_string, token_type_hint):
        return find_token(token_string, token_type_hint)

    def introspect_token(self, token):
        with lock:
            stats["introspections"] += 1
        return {
            "active": True,
            "client_id": token.client_id,
            "token_type": "Bearer",
            "username": token.user_id,
            "scope": token.get_scope(),
            "sub": token.user_id,
            "exp": int(token.issued_at + token.expires_in),
            "iat": int(token.issued_at),
        }

    def check_permission(self, token, client, request):
        return True


AUTH_CODES = {}  # code -> AuthorizationCode
authorize_stats = {"authorize_pages": 0, "consents": 0, "denials": 0, "codes_issued": 0, "code_exchanges": 0,
                   "codes_refused": 0}


class AuthorizationCode:
    def __init__(self, code, client_id, redirect_uri, scope, user_id, challenge, method):
        self.code = code
        self.client_id = client_id
        self.redirect_uri = redirect_uri
        self.scope = scope
        self.user_id = user_id
        self.code_challenge = challenge
        self.code_challenge_method = method
        self.expires_at = time.time() + 300

    def get_redirect_uri(self):
        return self.redirect_uri

    def get_scope(self):
        return self.scope

    def get_auth_time(self):
        return None

    def get_nonce(self):
        return None


class CodeGrant(grants.AuthorizationCodeGrant):
    """RFC 6749 §4.1 with PKCE (RFC 7636, required for the public client: CodeChallenge(required=True))."""
    TOKEN_ENDPOINT_AUTH_METHODS = ["none", "client_secret_post", "client_secret_basic"]

    def save_authorization_code(self, code, req):
        data = req.payload.data
        with lock:
            authorize_stats["codes_issued"] += 1
            AUTH_CODES[code] = AuthorizationCode(
                code, req.client.get_client_id(), req.payload.redirect_uri, req.payload.scope or "",
                req.user.get_user_id(), data.get("code_challenge"), data.get("code_challenge_method"))

    def query_authorization_code(self, code, client):
        with lock:
            authorize_stats["code_exchanges"] += 1
            found = AUTH_CODES.get(code)
            if found is None or found.client_id != client.get_client_id() or time.time() > found.expires_at:
                authorize_stats["codes_refused"] += 1
                return None
            return found

    def delete_authorization_code(self, authorization_code):
        with lock:
            AUTH_CODES.pop(authorization_code.code, None)  # a code is good for one exchange

    def authenticate_user(self, authorization_code):
        return USERS.get(authorization_code.user_id)


DEVICE_DEFAULTS = {"interval": 5, "expires_in": 1800, "lifetime": None, "slow_down": 0}
device_settings = dict(DEVICE_DEFAULTS)
device_stats = {"device_requests": 0, "polls": 0, "slow_downs": 0, "pending": 0, "denied": 0, "expired": 0,
                "granted": 0}
DEVICE_CODES = {}  # device_code -> DeviceCredentialDict
USER_GRANTS = {}  # user_code -> (User, approved)


class DeviceAuthorization(DeviceAuthorizationEndpoint):
    CLIENT_AUTH_METHODS = ["none", "client_secret_post", "client_secret_basic"]

    @property
    def EXPIRES_IN(self):
        return device_settings["expires_in"]

    @property
    def INTERVAL(self):
        return device_settings["interval"]

    def create_endpoint_response(self, req):
        with lock:
            device_stats["device_requests"] += 1
        return super().create_endpoint_response(req)

    def get_verification_uri(self):
        return request.host_url.rstrip("/") + "/device"

    def save_device_credential(self, client_id, scope, data):
        lifetime = device_settings["lifetime"]
        if lifetime is None:
            lifetime = data["expires_in"]
        credential = DeviceCredentialDict(client_id=client_id, scope=scope, expires_at=time.time() + float(lifetime),
                                          **data)
        with lock:
            DEVICE_CODES[data["device_code"]] = credential


class DeviceGrant(DeviceCodeGrant):
    TOKEN_ENDPOINT_AUTH_METHODS = ["none", "client_secret_post", "client_secret_basic"]

    def validate_token_request(self):
        with lock:
            device_stats["polls"] += 1
        try:
            super().validate_token_request()
        except Exception as error:
            name = getattr(error, "error", "")
            key = {"slow_down": "slow_downs", "authorization_pending": "pending", "access_denied": "denied",
                   "expired_token": "expired"}.get(name)
            if key:
                with lock:
                    device_stats[key] += 1
            raise
        with lock:
            device_stats["granted"] += 1
            # A device code is good for one sign-in.
            DEVICE_CODES.pop(self.request.payload.data.get("device_code"), None)

    def query_device_credential(self, device_code):
        with lock:
            return DEVICE_CODES.get(device_code)

    def query_user_grant(self, user_code):
        with lock:
            return USER_GRANTS.get(user_code)

    def should_slow_down(self, credential):
        with lock:
            if device_settings["slow_down"] > 0:
                device_settings["slow_down"] -= 1
                return True
        return False


class Validator(BearerTokenValidator):
    def authenticate_token(self, token_string):
        token = find_token(token_string, "access_token")
        # /__resource/revoke_access: this access token is dead, its refresh token lives on.
        # A DPoP-bound token presented as a bearer token is refused (RFC 9449 §7.2).
        return None if token is not None and (token.access_revoked or token.jkt is not None) else token


# ---- DPoP (RFC 9449): proofs checked as §4.3 says, tokens bound to the key (cnf.jkt) ----------
# Off until a client sends a `DPoP` header: a proof makes the tokens issued with it DPoP-bound
# (token_type "DPoP", `jkt` the key's RFC 7638 thumbprint); a bound refresh token refreshes only
# with a proof by the same key, a bound access token is accepted only as `Authorization: DPoP`
# with a proof whose `ath` is its hash. See /__dpop/config and /__dpop/stats.
DPOP_ALGS = ["ES256", "ES384", "ES512", "RS256", "PS256", "EdDSA"]  # asymmetric only (§4.3 8)
DPOP_DEFAULTS = {"nonce_token": "off", "nonce_resource": "off", "iat_window": 60, "ignore": False,
                 "advertise": True}
dpop_settings = dict(DPOP_DEFAULTS)
dpop_state = {"nonce": None}  # the current server nonce (§8, §9)
dpop_jtis = {}  # jti -> iat: the replay cache (§11.1), pruned past the iat window
dpop_counters = {}  # endpoint -> {"valid", "invalid", "absent", "nonce_demanded"}
dpop_log = collections.deque(maxlen=200)  # [{endpoint, ok, reason, jkt, nonce, htm, htu}]


class DPoPError(Exception):
    """A proof refused: `error` is the OAuth error code, `reason` says why (for /__dpop/stats)."""

    def __init__(self, error, reason):
        super().__init__(reason)
        self.error = error
        self.reason = reason


def dpop_count_locked(endpoint, key):
    counters = dpop_counters.setdefault(endpoint, {"valid": 0, "invalid": 0, "absent": 0, "nonce_demanded": 0})
    counters[key] += 1


def dpop_new_nonce_locked():
    dpop_state["nonce"] = uuid.uuid4().hex
    return dpop_state["nonce"]


def b64url_sha256(text):
    import hashlib
    return base64.urlsafe_b64encode(hashlib.sha256(text.encode("ascii")).digest()).rstrip(b"=").decode("ascii")


def dpop_check(endpoint, nonce_mode, access_token=None):
    """The DPoP proof of this request, checked as RFC 9449 §4.3 says; its key's thumbprint, or
    None when the request carries none. Counted per endpoint. Raises DPoPError (also when the
    server demands a nonce: error use_dpop_nonce, a new one made when `nonce_mode` is "always")."""
    from joserfc import jws
    from joserfc.errors import JoseError
    from joserfc.jwk import JWKRegistry
    values = request.headers.getlist("DPoP")
    if not values:
        with lock:
            dpop_count_locked(endpoint, "absent")
        return None
    entry = {"endpoint": endpoint, "ok": False, "reason": None, "jkt": None, "nonce": None}
    try:
        if len(values) != 1:  # §4.3 1
            raise DPoPError("invalid_dpop_proof", "more than one DPoP header")
        proof = values[0]
        try:
            compact = jws.extract_compact(proof.encode("ascii"))  # §4.3 2: a well-formed JWS
            header = compact.headers()
            claims = json.loads(compact.payload)
        except (JoseError, ValueError, UnicodeError) as error:
            raise DPoPError("invalid_dpop_proof", f"not a JWS: {error}")
        if header.get("typ") != "dpop+jwt":  # §4.3 4
            raise DPoPError("invalid_dpop_proof", f"typ is {header.get('typ')!r}")
        if header.get("alg") not in DPOP_ALGS:  # §4.3 5
            raise DPoPError("invalid_dpop_proof", f"alg {header.get('alg')!r} is not allowed")
        jwk = header.get("jwk")
        if not isinstance(jwk, dict) or any(name in jwk for name in ("d", "p", "q", "dp", "dq", "qi", "k")):
            raise DPoPError("invalid_dpop_proof", "jwk is missing or holds a private key")  # §4.3 7
        try:
            key = JWKRegistry.import_key(jwk)
            jws.deserialize_compact(proof, key, algorithms=DPOP_ALGS)  # §4.3 6
        except (JoseError, ValueError, TypeError) as error:
            raise DPoPError("invalid_dpop_proof", f"signature: {error}")
        entry["jkt"] = key.thumbprint()
        for name in ("jti", "htm", "htu", "iat"):  # §4.3 3
            if name not in claims:
                raise DPoPError("invalid_dpop_proof", f"claim {name} missing")
        if claims["htm"] != request.method:  # §4.3 9
            raise DPoPError("invalid_dpop_proof", f"htm {claims['htm']!r} is not {request.method}")
        htu = request.host_url.rstrip("/") + request.path
        if claims["htu"] != htu:  # §4.3 10 (the request's URI without query and fragment)
            raise DPoPError("invalid_dpop_proof", f"htu {claims['htu']!r} is not {htu!r}")
        if not isinstance(claims["iat"], (int, float)) or abs(time.time() - claims["iat"]) > dpop_settings["iat_window"]:
            raise DPoPError("invalid_dpop_proof", f"iat {claims['iat']!r} is outside the window")  # §4.3 11
        if access_token is not None and claims.get("ath") != b64url_sha256(access_token):  # §4.3 12
            raise DPoPError("invalid_dpop_proof", "ath is not the hash of the access token")
        entry["nonce"] = claims.get("nonce")
        with lock:
            # §4.3 11 with §8: a nonce the server demands; "always": a new one every time.
            if nonce_mode == "always" or (nonce_mode in ("on", "rotate") and (
                    dpop_state["nonce"] is None or claims.get("nonce") != dpop_state["nonce"])):
                nonce = dpop_new_nonce_locked() if nonce_mode == "always" or dpop_state["nonce"] is None \
                    else dpop_state["nonce"]
                dpop_count_locked(endpoint, "nonce_demanded")
                g.dpop_nonce = nonce
                raise DPoPError("use_dpop_nonce", "a nonce is required" if claims.get("nonce") is None
                                else "the nonce is not the current one")
            now = time.time()
            for old in [j for j, at in dpop_jtis.items() if now - at > 2 * dpop_settings["iat_window"]]:
                del dpop_jtis[old]
            jti = claims["jti"]
            if not isinstance(jti, str) or not jti or jti in dpop_jtis:  # §11.1 replay
                raise DPoPError("invalid_dpop_proof", "jti replayed" if jti in dpop_jtis else "jti is empty")
            dpop_jtis[jti] = now
            dpop_count_locked(endpoint, "valid")
        entry["ok"] = True
        return entry["jkt"]
    except DPoPError as error:
        entry["reason"] = error.reason
        if error.error != "use_dpop_nonce":
            with lock:
                dpop_count_locked(endpoint, "invalid")
        raise
    finally:
        with lock:
            dpop_log.append(entry)


def dpop_error_answer(error, status=400, resource=False):
    """A refused proof: 400 JSON at the token endpoint; 401 with a DPoP challenge at a resource
    (§7.1, §9). A demanded nonce travels in DPoP-Nonce."""
    headers = {}
    nonce = g.get("dpop_nonce")
    if nonce:
        headers["DPoP-Nonce"] = nonce
    if resource:
        headers["WWW-Authenticate"] = f'DPoP error="{error.error}", algs="{" ".join(DPOP_ALGS)}"'
        return Response(json.dumps({"error": error.error, "error_description": error.reason}), status=401,
                        mimetype="application/json", headers=headers)
    return Response(json.dumps({"error": error.error, "error_description": error.reason}), status=status,
                    mimetype="application/json", headers=headers)


def dpop_nonce_header(answer, mode):
    """The current nonce on a good answer when nonces are demanded (§8.2: the client uses it next);
    "rotate": a new one, and the one the proof carried is no longer accepted."""
    with lock:
        nonce = dpop_new_nonce_locked() if mode == "rotate" else dpop_state["nonce"]
    if mode in ("on", "rotate") and nonce:
        answer.headers["DPoP-Nonce"] = nonce
    return answer


def dpop_resource(endpoint):
    """A request with `Authorization: DPoP <token>`: (the token, None) when its proof is good and
    the token is live and bound to the proof's key, else (None, the 401 answer)."""
    presented = request.headers.get("Authorization", "").partition(" ")[2].strip()
    try:
        jkt = dpop_check(endpoint, dpop_settings["nonce_resource"], access_token=presented)
        if jkt is None:
            raise DPoPError("invalid_dpop_proof", "a DPoP token without a DPoP proof")
    except DPoPError as error:
        return None, dpop_error_answer(error, resource=True)
    token = find_token(presented, "access_token")
    if token is None or token.is_expired() or token.is_revoked() or token.access_revoked or token.jkt != jkt:
        return None, Response(json.dumps({"error": "invalid_token"}), status=401, mimetype="application/json",
                              headers={"WWW-Authenticate": 'DPoP error="invalid_token"'})
    return token, None


def create_app(expires_in):
    app = Flask(__name__)
    app.config["OAUTH2_TOKEN_EXPIRES_IN"] = {"password": expires_in, "refresh_token": expires_in,
                                             DEVICE_CODE_GRANT_TYPE: expires_in, "authorization_code": expires_in}
    app.config["OAUTH2_REFRESH_TOKEN_GENERATOR"] = True
    server = AuthorizationServer(app, query_client=query_client, save_token=save_token)
    server.register_grant(PasswordGrant)
    server.register_grant(RefreshGrant)
    server.register_endpoint(Revocation)
    server.register_endpoint(Introspection)
    server.register_grant(DeviceGrant)
    server.register_endpoint(DeviceAuthorization)
    server.register_grant(CodeGrant, [CodeChallenge(required=True)])
    protect = ResourceProtector()
    protect.register_token_validator(Validator())

    @app.after_request
    def record_status(response):
        entry = g.get("record")
        if entry is not None:
            with lock:
                entry["status"] = response.status_code
        return response

    @app.before_request
    def record():
        if request.path.startswith("/oauth/") or "/.well-known/" in request.path:
            entry = {
                "time": time.time(), "method": request.method, "path": request.path,
                "headers": dict(request.headers.items()), "form": request.form.to_dict(), "args": request.args.to_dict(), "fault": None,
            }
            with lock:
                requests_seen.append(entry)
            g.record = entry

    def take_fault(endpoint):
        with lock:
            queue = faults[endpoint]
            if not queue:
                return None
            fault = queue[0]
            fault[1] -= 1
            if fault[1] <= 0:
                queue.pop(0)
            g.record["fault"] = fault[0]
            return fault

    def answer(endpoint, real_answer):
        fault = take_fault(endpoint)
        if fault is None:
            return real_answer()
        return misbehave(fault[0], fault[2], real_answer, endpoint)

    @app.route("/oauth/token", methods=["POST"])
    def token():
        with lock:
            stats["token_requests"] += 1
        mode = dpop_settings["nonce_token"]
        if not dpop_settings["ignore"]:
            try:
                g.dpop_jkt = dpop_check("token", mode)
            except DPoPError as error:
                return dpop_error_answer(error)
        return dpop_nonce_header(answer("token", lambda: server.create_token_response()), mode)

    @app.route("/__dpop/config", methods=["POST"])
    def dpop_config():
        """DPoP settings: nonce_token / nonce_resource = off | on (the current nonce is demanded:
        a proof without it, or with an old one, is answered use_dpop_nonce with DPoP-Nonce) | always
        (every proof is answered use_dpop_nonce with a new nonce: a server that never lets a client
        through) | rotate (as on, and every good answer carries a new nonce, which the next proof
        must carry: RFC 9449 §8.2); iat_window=<s> (default 60); ignore=1 (the token endpoint ignores proofs: Bearer
        tokens, as a server without DPoP); advertise=0 (metadata lists no
        dpop_signing_alg_values_supported); new_nonce=1 (the current nonce replaced); reset=1
        (defaults, counters and replay cache cleared). Answers the settings."""
        with lock:
            if request.form.get("reset"):
                dpop_settings.clear()
                dpop_settings.update(DPOP_DEFAULTS)
                dpop_counters.clear()
                dpop_jtis.clear()
                dpop_log.clear()
                dpop_state["nonce"] = None
            for key in ("nonce_token", "nonce_resource"):
                if key in request.form:
                    if request.form[key] not in ("off", "on", "rotate", "always"):
                        return jsonify(ok=False, error=f"{key}: off, on, rotate or always"), 400
                    dpop_settings[key] = request.form[key]
            if "iat_window" in request.form:
                dpop_settings["iat_window"] = float(request.form["iat_window"])
            for key in ("ignore", "advertise"):
                if key in request.form:
                    dpop_settings[key] = request.form[key] not in ("0", "", "false")
            if request.form.get("new_nonce"):
                dpop_new_nonce_locked()
            return jsonify(dpop_settings)

    @app.route("/__dpop/stats")
    def dpop_stats_view():
        """{"endpoints": {endpoint: {"valid", "invalid", "absent", "nonce_demanded"}}, "nonce",
        "bound_refused", "log": [{endpoint, ok, reason, jkt, nonce}] (the last 200 proofs)}.
        Endpoints: token, resource, userinfo."""
        with lock:
            return jsonify(endpoints=dpop_counters, nonce=dpop_state["nonce"],
                           bound_refused=stats["dpop_bound_refused"], log=list(dpop_log))

    @app.route("/__tokens")
    def tokens_view():
        """Every token issued: [{access_token, refresh_token, user, jkt, revoked}] (the tests
        are the only reader)."""
        with lock:
            return jsonify([{"access_token": t.access_token, "refresh_token": t.refresh_token, "user": t.user_id,
                             "jkt": t.jkt, "revoked": t.revoked} for t in TOKENS])

    @app.route("/__release", methods=["POST"])
    def release_held():
        """The answers held by the `hold` fault go (and later ones are not held)."""
        released.set()
        return jsonify(ok=True)

    @app.route("/__fault", methods=["POST"])
    def set_fault():
        retry_after = request.form.get("retry_after")
        mode = request.form["mode"]
        endpoint = request.form.get("endpoint", "token")
        if endpoint not in faults:
            return jsonify(ok=False, error=f"unknown endpoint {endpoint}"), 400
        if mode == "gzip-bomb":
            gzip_bomb()  # built now (about a second), not while a client waits
        with lock:
            faults[endpoint].append([mode, int(request.form.get("count", "1")), retry_after])
        return jsonify(ok=True)

    @app.route("/oauth/revoke", methods=["POST"])
    def revoke():
        with lock:
            stats["revoke_requests"] += 1
        return answer("revoke", lambda: server.create_endpoint_response(Revocation.ENDPOINT_NAME))

    @app.route("/oauth/introspect", methods=["POST"])
    def introspect():
        with lock:
            stats["introspect_requests"] += 1
        return answer("introspect", lambda: server.create_endpoint_response(Introspection.ENDPOINT_NAME))

    def metadata(issuer, openid):
        """RFC 8414 §2 (and, for `openid`, OpenID Connect Discovery 1.0 §3) metadata of this
        server for `issuer`: its real endpoints (device_authorization and authorization named
        even where this server does not implement them yet)."""
        base = request.host_url.rstrip("/")
        document = {
            "issuer": issuer,
            "token_endpoint": f"{base}/oauth/token",
            "revocation_endpoint": f"{base}/oauth/revoke",
            "introspection_endpoint": f"{base}/oauth/introspect",
            "device_authorization_endpoint": f"{base}/oauth/device_authorization",
            "authorization_endpoint": f"{base}/oauth/authorize",
            "grant_types_supported": ["password", "refresh_token", "authorization_code", DEVICE_CODE_GRANT_TYPE],
            "code_challenge_methods_supported": ["S256"],
            "response_types_supported": ["code"],
            "token_endpoint_auth_methods_supported": ["none", "client_secret_post", "client_secret_basic"],
            "revocation_endpoint_auth_methods_supported": ["none", "client_secret_post", "client_secret_basic"],
            "introspection_endpoint_auth_methods_supported": ["none", "client_secret_post", "client_secret_basic"],
        }
        if dpop_settings["advertise"]:
            document["dpop_signing_alg_values_supported"] = DPOP_ALGS  # RFC 9449 §5.1
        if openid:
            document["userinfo_endpoint"] = f"{base}/api/me"
            document["subject_types_supported"] = ["public"]
            document["id_token_signing_alg_values_supported"] = ["RS256"]
        return Response(json.dumps(document), status=200, mimetype="application/json")

    @app.route("/.well-known/oauth-authorization-server", defaults={"tenant": ""})
    @app.route("/.well-known/oauth-authorization-server/<path:tenant>")
    def authorization_server_metadata(tenant):
        with lock:
            stats["metadata_requests"] += 1
        issuer = request.host_url.rstrip("/") + (f"/{tenant}" if tenant else "")
        return answer("metadata", lambda: metadata(issuer, openid=False))

    @app.route("/.well-known/openid-configuration", defaults={"tenant": ""})
    @app.route("/<path:tenant>/.well-known/openid-configuration")
    def openid_configuration(tenant):
        with lock:
            stats["openid_requests"] += 1
        issuer = request.host_url.rstrip("/") + (f"/{tenant}" if tenant else "")
        return answer("openid", lambda: metadata(issuer, openid=True))

    @protect()
    def me_bearer():
        from authlib.integrations.flask_oauth2 import current_token
        return jsonify(user=current_token.user_id, sub=current_token.user_id)

    @app.route("/api/me")
    def me():
        # Also the OpenID Connect userinfo endpoint: `sub` is the user. Bearer or DPoP.
        if request.headers.get("Authorization", "").partition(" ")[0].lower() == "dpop":
            token, refusal = dpop_resource("userinfo")
            if token is None:
                return refusal
            return dpop_nonce_header(jsonify(user=token.user_id, sub=token.user_id), dpop_settings["nonce_resource"])
        return me_bearer()

    @protect()
    def protected_resource():
        from authlib.integrations.flask_oauth2 import current_token
        return jsonify(ok=True, user=current_token.user_id, scope=current_token.get_scope(), method=request.method,
                       request_id=request.headers.get("X-Request-Id"))

    @app.route("/api/resource", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    def resource():
        """A protected resource (RFC 6750) behind Authlib's ResourceProtector: 200 with the
        token's user and scope for a valid bearer token; 401 with `WWW-Authenticate: Bearer
        error="invalid_token"` for an expired, revoked or unknown one (Authlib's answer), and a
        bare `Bearer` challenge for a request without one. Counted in /__resource/stats, with
        how often each access token was presented."""
        authorization = request.headers.get("Authorization", "")
        presented = authorization[7:] if authorization.startswith("Bearer ") else None
        refusal = None
        if authorization.partition(" ")[0].lower() == "dpop":  # RFC 9449 §7: DPoP-bound, a proof beside it
            presented = authorization.partition(" ")[2].strip()
            token, answer = dpop_resource("resource")
            if token is not None:
                answer = dpop_nonce_header(jsonify(
                    ok=True, user=token.user_id, scope=token.get_scope(), method=request.method, scheme="DPoP",
                    request_id=request.headers.get("X-Request-Id")), dpop_settings["nonce_resource"])
            status = answer.status_code
        else:
            try:
                answer = protected_resource()
                status = answer.status_code
            except HTTPException as error:  # Authlib's 401 (its WWW-Authenticate included)
                refusal, status = error, error.code
        with lock:
            resource_stats["requests"] += 1
            if presented is None:
                resource_stats["no_token"] += 1
            else:
                resource_presented[presented] += 1
            if status == 200:
                resource_stats["ok"] += 1
            elif status == 401:
                resource_stats["unauthorized"] += 1
        if refusal is not None:
            raise refusal
        return answer

    @app.route("/__resource/stats")
    def resource_statistics():
        """{"requests", "ok", "unauthorized", "no_token", "presented": {token: count}} (tokens in
        the clear: the tests are the only reader)."""
        with lock:
            return jsonify(dict(resource_stats, presented=dict(resource_presented)))

    @app.route("/__resource/revoke_access", methods=["POST"])
    def resource_revoke_access():
        """token=<access token>: the resource refuses it from now on (invalid_token); its
        refresh token still refreshes (what an administrator's revocation of one access token,
        or a resource server's own clock, does)."""
        token = find_token(request.form.get("token", ""), "access_token")
        if token is None:
            return jsonify(ok=False, error="unknown access token"), 404
        with lock:
            token.access_revoked = True
        return jsonify(ok=True)

    @app.route("/__resource/config", methods=["POST"])
    def resource_config():
        """grant_scope=<scope> (every token issued from now on gets that scope; empty: as asked),
        reset=1 (the counters to zero)."""
        with lock:
            if "grant_scope" in request.form:
                resource_settings["grant_scope"] = request.form["grant_scope"] or None
            if request.form.get("reset"):
                for key in resource_stats:
                    resource_stats[key] = 0
                resource_presented.clear()
            return jsonify(grant_scope=resource_settings["grant_scope"])

    @app.route("/oauth/device_authorization", methods=["POST"])
    def device_authorization():
        return server.create_endpoint_response(DeviceAuthorization.ENDPOINT_NAME)

    def user_decides(approved):
        user_code = request.form.get("user_code", "")
        user = USERS.get(request.form.get("user", "alice"))
        with lock:
            known = any(c["user_code"] == user_code for c in DEVICE_CODES.values())
            if not known or user is None:
                return jsonify(ok=False, error="unknown user code or user"), 404
            USER_GRANTS[user_code] = (user, approved)
        return jsonify(ok=True)

    @app.route("/oauth/authorize", methods=["GET"])
    def authorize_page():
        """The consent page a browser shows: a form that posts the request back with the user's
        choice. A request the server refuses before it trusts the redirect URI (unknown client,
        a redirect_uri that is not loopback /callback) is an error page, never a redirect."""
        from authlib.oauth2 import OAuth2Error
        with lock:
            authorize_stats["authorize_pages"] += 1
        try:
            server.get_consent_grant(end_user=None)
        except OAuth2Error as error:
            return server.handle_error_response(None, error)
        hidden = "".join(f'<input type="hidden" name="{html.escape(k)}" value="{html.escape(v)}">'
                         for k, v in request.args.items(multi=True))
        page = ("<!doctype html><title>Sign in</title><form method=\"post\" action=\"/oauth/authorize\">"
                + hidden + '<input name="user" value="alice">'
                + '<button name="consent" value="allow">Allow</button>'
                + '<button name="consent" value="deny">Deny</button></form>')
        return Response(page, status=200, mimetype="text/html")

    @app.route("/oauth/authorize", methods=["POST"])
    def authorize_decide():
        """The consent form submitted: a redirect to the client's loopback redirect URI with a code
        (consent=allow) or error=access_denied (anything else), and the request's state."""
        from authlib.oauth2 import OAuth2Error
        try:
            grant = server.get_consent_grant(end_user=None)
        except OAuth2Error as error:
            return server.handle_error_response(None, error)
        allowed = request.form.get("consent") == "allow"
        user = USERS.get(request.form.get("user", "alice")) if allowed else None
        with lock:
            authorize_stats["consents" if allowed else "denials"] += 1
        return server.create_authorization_response(grant_user=user, grant=grant)

    @app.route("/__authorize/stats")
    def authorize_stats_view():
        with lock:
            return jsonify(authorize_stats)

    @app.route("/__device/approve", methods=["POST"])
    def device_approve():
        return user_decides(True)

    @app.route("/__device/deny", methods=["POST"])
    def device_deny():
        return user_decides(False)

    @app.route("/__device/config", methods=["POST"])
    def device_config():
        with lock:
            if request.form.get("reset"):
                device_settings.clear()
                device_settings.update(DEVICE_DEFAULTS)
            for key in ("interval", "expires_in", "slow_down"):
                if key in request.form:
                    device_settings[key] = int(request.form[key])
            if "lifetime" in request.form:
                device_settings["lifetime"] = float(request.form["lifetime"])
            return jsonify(device_settings)

    @app.route("/__device/stats")
    def device_stats_view():
        with lock:
            return jsonify(device_stats)

    @app.route("/__stats")
    def stats_view():
        with lock:
            # "rotate_late_holding": rotate-late requests holding their answer right now.
            return jsonify(dict(stats, rotate_late_holding=len(in_flight)))

    @app.route("/__reuse_grace", methods=["POST"])
    def set_reuse_grace():
        with lock:
            reuse_grace["seconds"] = float(request.form.get("seconds", "0"))
            return jsonify(reuse_grace)

    @app.route("/__reuse")
    def reuse_view():
        with lock:
            return jsonify(reuse_log)

    @app.route("/__last_request")
    def last_request():
        with lock:
            return jsonify(requests_seen[-1] if requests_seen else None)

    @app.route("/__requests")
    def all_requests():
        with lock:
            return jsonify(list(requests_seen))

    @app.route("/__redirect_hits")
    def redirect_hits_view():
        with lock:
            return jsonify(port=redirect_target["port"], hits=list(redirect_hits))

    @app.route("/__revoke_user", methods=["POST"])
    def revoke_user():
        user = request.form["user"]
        with lock:
            for token in TOKENS:
                if token.user_id == user:
                    token.revoked = True
        return jsonify(ok=True)

    return app


def create_redirect_target():
    """The second listener a `redirect:` fault points to: records, and answers like a token endpoint."""
    target = Flask("redirect_target")

    @target.route("/", defaults={"path": ""}, methods=["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"])
    @target.route("/<path:path>", methods=["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"])
    def anything(path):
        hit = {
            "time": time.time(), "method": request.method, "path": request.path,
            "query": request.query_string.decode("latin-1"), "headers": dict(request.headers.items()),
            "body": request.get_data(as_text=True),
        }
        with lock:
            redirect_hits.append(hit)
            stats["redirect_target_hits"] += 1
        return jsonify(access_token="tok-from-redirect-target", refresh_token="rt-from-redirect-target",
                       token_type="Bearer", expires_in=3600, active=True)

    return target


def misbehave(mode, retry_after, real_answer, endpoint):
    """The answer of a request under fault `mode` (see the module docstring)."""
    headers = {"Retry-After": retry_after} if retry_after else {}
    if mode.startswith("delay:"):
        time.sleep(float(mode.split(":", 1)[1]))
        return real_answer()
    if mode == "hold":
        released.wait(120)
        return real_answer()
    if mode == "hang":
        hang_forever.wait()
        return Response("", status=500)
    if mode.startswith("status:"):
        return Response("the server is having a bad day", status=int(mode.split(":", 1)[1]),
                        headers=headers, mimetype="text/plain")
    if mode == "invalid_grant":
        return Response(json.dumps({"error": "invalid_grant", "error_description": "the refresh token is no longer valid"}),
                        status=400, mimetype="application/json")
    if mode == "invalid_client":
        return Response(json.dumps({"error": "invalid_client", "error_description": "unknown client"}),
                        status=401, mimetype="application/json", headers={"WWW-Authenticate": "Basic"})
    if mode == "html":
        return Response("<html><body><h1>Gateway</h1><p>Try again later.</p></body></html>",
                        status=200, mimetype="text/html")
    if mode == "truncated":
        return Response('{"access_token": "tok-trunc", "token_type": "Bearer", "expi', status=200,
                        mimetype="application/json")
    if mode == "missing":
        return Response(json.dumps({"token_type": "Bearer", "expires_in": 3600}), status=200,
                        mimetype="application/json")
    if mode == "huge":
        body = '{"access_token": "tok-huge", "token_type": "Bearer", "expires_in": 3600, "padding": "' \
            + "x" * (4 * 1024 * 1024) + '"}'
        return Response(body, status=200, mimetype="application/json")
    if mode.startswith("expires:"):
        answer = real_answer()
        data = json.loads(answer.get_data(as_text=True))
        data["expires_in"] = json.loads(mode.split(":", 1)[1])
        answer.set_data(json.dumps(data))
        return answer
    if mode.startswith("redirect:"):
        code = int(mode.split(":", 1)[1])
        with lock:
            stats["redirects_sent"] += 1
        location = f"http://127.0.0.1:{redirect_target['port']}{request.path}"
        return Response("", status=code, headers={"Location": location, **headers})
    if mode.startswith("rotate-late:") and endpoint == "token":
        return rotate_late(float(mode.split(":", 1)[1]), real_answer)
    if mode.startswith(("drip:", "cut:")) and endpoint == "token":
        return drip_or_cut(mode, real_answer)
    if mode.startswith("stream-huge:") or mode.startswith("stream-huge-chunked:"):
        name, size = mode.split(":", 1)
        return stream_huge(int(float(size) * (1 << 20)), chunked=name == "stream-huge-chunked")
    if mode == "gzip-bomb":
        with lock:
            stats["gzip_bombs_served"] += 1
        body = gzip_bomb()
        return Response(body, status=200, headers={
            "Content-Encoding": "gzip", "Content-Type": "application/json", "Content-Length": str(len(body))})
    if mode.startswith(("set:", "set-json:", "drop:")):
        answer = real_answer()
        data = json.loads(answer.get_data(as_text=True))
        kind, change = mode.split(":", 1)
        if kind == "drop":
            data.pop(change, None)
        else:
            name, value = change.split("=", 1)
            data[name] = json.loads(value) if kind == "set-json" else value
        answer.set_data(json.dumps(data))
        return answer
    if mode in ("echo", "echo-200"):
        return echo(mode == "echo-200")
    return Response(f"unknown fault {mode}", status=599)


def client_gone(connection):
    """Whether the client closed its end (EOF or reset): poll, then peek without consuming."""
    if connection is None:
        return False
    try:
        readable, _, _ = select.select([connection], [], [], 0)
        if not readable:
            return False
        return connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:  # ECONNRESET and friends
        return True


def rotate_late(seconds, real_answer):
    """A real refresh, rotated at once, answered after `seconds` unless the client went away
    (then rolled back). See the module docstring."""
    presented = request.form.get("refresh_token")
    if request.form.get("grant_type") != "refresh_token" or not presented:
        return real_answer()
    connection = request.environ.get("werkzeug.socket")
    settle(presented)
    with lock:
        stats["rotate_late_requests"] += 1
        if presented in in_flight:
            holder = None  # another request holds it: authenticate_refresh_token sees reuse
        else:
            holder = in_flight[presented] = Holder(connection)
    if holder is None:
        return real_answer()
    try:
        answer = real_answer()  # Authlib: validates, issues, revokes the old token
        old, new = g.get("rotated_token"), g.get("issued_token")
        if answer.status_code != 200 or old is None or new is None:
            return answer
        with lock:
            new.pending = True
            old.strict = True
        deadline = time.monotonic() + seconds
        gone = False
        while not gone and time.monotonic() < deadline:
            holder.wake.wait(min(0.01, max(deadline - time.monotonic(), 0)))
            gone = client_gone(connection)
        gone = gone or client_gone(connection)
        with lock:
            if gone:
                stats["cancelled_before_answer"] += 1
                if new in TOKENS:
                    TOKENS.remove(new)
                if old.family not in revoked_families:
                    old.revoked = old.rotated = old.strict = False
            else:
                new.pending = False
                stats["rotations_committed"] += 1
        return answer
    finally:
        with lock:
            if in_flight.get(presented) is holder:
                del in_flight[presented]
        holder.done.set()


def drip_or_cut(mode, real_answer):
    """A real refresh, rotated and committed at once, whose answer then arrives slowly (drip) or
    is cut off mid-body (cut). See the module docstring."""
    if request.form.get("grant_type") != "refresh_token" or not request.form.get("refresh_token"):
        return real_answer()
    answer = real_answer()
    old, new = g.get("rotated_token"), g.get("issued_token")
    if answer.status_code != 200 or old is None or new is None:
        return answer
    with lock:
        old.strict = True  # presenting it again (outside the grace) is reuse
        old.successor = new
    data = answer.get_data()
    connection = request.environ.get("werkzeug.socket")
    kind, _, setting = mode.partition(":")

    def cut():
        yield data[:int(setting)]
        with lock:
            stats["answers_cut"] += 1
        if connection is not None:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    if kind == "drip":
        # About <s> seconds: pieces of several bytes, one per gap.
        total = float(setting.split(":")[0])
        gap = float(setting.split(":")[1]) if ":" in setting else 0.25
        pieces = max(int(total / gap), 1)
        size = -(-len(data) // pieces)
        chunks = [data[:1]] + [data[1 + i:1 + i + size] for i in range(0, len(data) - 1, size)]

        def body():
            written = 0
            with lock:
                stats["drips_started"] += 1
            try:
                for index, chunk in enumerate(chunks):
                    if index > 0:
                        time.sleep(gap)
                    yield chunk
                    written += len(chunk)
            finally:
                with lock:
                    stats["drips_completed" if written == len(data) else "drips_aborted"] += 1
        iterator = body()
    else:
        iterator = cut()
    headers = {"Content-Length": str(len(data)), "Cache-Control": "no-store"}
    return Response(iterator, status=200, mimetype="application/json", headers=headers, direct_passthrough=True)


def stream_huge(size, chunked):
    head = b'{"access_token": "tok-stream", "token_type": "Bearer", "expires_in": 3600, "padding": "'
    tail = b'"}'
    size = max(size, len(head) + len(tail))
    block = b"x" * 65536

    def body():
        sent = 0
        with lock:
            stats["streams_started"] += 1
            stats["stream_bytes_sent"] = 0
        try:
            yield head
            sent += len(head)
            remaining = size - len(head) - len(tail)
            while remaining > 0:
                piece = block[:min(remaining, len(block))]
                yield piece
                sent += len(piece)
                remaining -= len(piece)
                with lock:
                    stats["stream_bytes_sent"] = sent
            yield tail
            sent += len(tail)
        finally:
            with lock:
                stats["stream_bytes_sent"] = sent
                stats["streams_completed" if sent == size else "streams_aborted"] += 1

    headers = {} if chunked else {"Content-Length": str(size)}
    return Response(body(), status=200, mimetype="application/json", headers=headers, direct_passthrough=True)


bomb = {"body": None}
bomb_lock = threading.Lock()


def gzip_bomb():
    """~1 MB of gzip inflating to 1 GiB of JSON-ish padding, made once: the 1 MiB block of
    spaces is compressed once after a full flush (which resets the compressor's window), so its
    compressed form can simply be repeated; the trailer's CRC-32 and size are computed apart."""
    with bomb_lock:
        if bomb["body"] is None:
            head = b'{"access_token": "tok-bomb", "token_type": "Bearer", "expires_in": 3600, "padding": "'
            tail = b'"}'
            block = b" " * (1 << 20)
            blocks = 960  # ~1 GB inflated; compressed under 1 MiB, so a 1 MiB byte limit on the wire lets it through
            deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
            parts = [b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"]  # gzip header, no name, no mtime
            parts.append(deflate.compress(head) + deflate.flush(zlib.Z_FULL_FLUSH))
            first = deflate.compress(block) + deflate.flush(zlib.Z_FULL_FLUSH)
            again = deflate.compress(block) + deflate.flush(zlib.Z_FULL_FLUSH)
            parts += [first] + [again] * (blocks - 1)
            parts.append(deflate.compress(tail) + deflate.flush(zlib.Z_FINISH))
            crc = zlib.crc32(head)
            for _ in range(blocks):
                crc = zlib.crc32(block, crc)
            crc = zlib.crc32(tail, crc)
            size = len(head) + blocks * len(block) + len(tail)
            parts.append(struct.pack("<II", crc & 0xFFFFFFFF, size & 0xFFFFFFFF))
            bomb["body"] = b"".join(parts)
        return bomb["body"]


def echo(success):
    """The secret the client sent, in every form, back in the answer (see the docstring)."""
    sent = request.form.get("refresh_token") or request.form.get("token") or ""
    client_secret = request.form.get("client_secret")
    authorization = request.headers.get("Authorization", "")
    if not client_secret and authorization.startswith("Basic "):
        try:
            client_secret = base64.b64decode(authorization[6:]).decode("utf-8").split(":", 1)[1]
        except (ValueError, IndexError):
            client_secret = None
    with lock:
        stats["echoes_served"] += 1
    if success:
        return Response(json.dumps({"access_token": "tok-echo", "token_type": sent, "expires_in": 3600}),
                        status=200, mimetype="application/json")
    utf8 = sent.encode("utf-8")
    utf16 = sent.encode("utf-16-be")
    forms = [
        sent,
        urllib.parse.quote_plus(sent),
        "".join(f"%{b:02X}" for b in utf8),
        "".join(f"%{b:02x}" for b in utf8),
        json.dumps(sent)[1:-1].replace("/", "\\/"),
        "".join(f"\\u{utf16[i]:02x}{utf16[i + 1]:02x}" for i in range(0, len(utf16), 2)),
    ]
    if client_secret:
        forms.append(client_secret)
    proof = request.headers.get("DPoP")
    if proof:
        forms.insert(0, proof)  # first: within what a client keeps of a description
    forms.append("\u001b]0;pwned\u0007\u001b[2J session OK")
    header_value = sent if sent.isascii() and sent.isprintable() else urllib.parse.quote(sent)
    return Response(json.dumps({"error": sent, "error_description": " ".join(forms)}), status=400,
                    mimetype="application/json", headers={
                        "WWW-Authenticate": f'Bearer error="{header_value}", error_description="{header_value}"',
                        "X-Echo": header_value})


def exit_with_parent():
    """Ends the server when its parent closes our stdin (or dies): no orphans."""
    sys.stdin.read()
    os._exit(0)


def main():
    global strict_reuse, rotation
    # A parent's thread may have blocked these; a test stopping us must be heard.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM, signal.SIGINT])
    threading.Thread(target=exit_with_parent, daemon=True).start()
    parser = argparse.ArgumentParser()
    parser.add_argument("--expires-in", type=int, default=3600)
    parser.add_argument("--strict-reuse", action="store_true",
                        help="a rotated refresh token presented again revokes its whole grant")
    parser.add_argument("--no-rotation", action="store_true",
                        help="a refresh issues no new refresh token and keeps the old one valid")
    args = parser.parse_args()
    strict_reuse = args.strict_reuse
    rotation = not args.no_rotation
    target = make_server("127.0.0.1", 0, create_redirect_target(), threaded=True)
    redirect_target["port"] = target.port
    threading.Thread(target=target.serve_forever, daemon=True).start()
    server = make_server("127.0.0.1", 0, create_app(args.expires_in), threaded=True)
    print(f"PORT {server.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
