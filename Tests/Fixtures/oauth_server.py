"""A real OAuth 2.0 authorization server for the tests, on loopback: Authlib + Flask.

Grants: password (how a test signs a user in) and refresh_token (RFC 6749 §6, with
rotation: each refresh issues a new refresh token and revokes the old one).
Endpoints: RFC 7009 revocation, RFC 7662 introspection, a protected resource that answers
401 for an expired or revoked token, and test hooks (/__stats, /__revoke_user, /__fault).

/__fault (POST mode=..., count=N, retry_after=S) makes the next N token requests misbehave:
  delay:<s>      answer normally after <s> seconds      hang        never answer (until exit)
  status:<code>  that status, a plain-text body          invalid_grant / invalid_client
  html           200 with an HTML page                   truncated   200 with cut-off JSON
  missing        200 JSON without access_token           huge        200 with a 4 MiB body
  expires:<n>    a real refresh whose expires_in is <n> (any JSON number or string)
retry_after adds a Retry-After header (seconds) to a status answer.

    python3 oauth_server.py --expires-in 2      prints "PORT <n>" once listening
"""
import argparse
import json
import os
import signal
import sys
import threading
import time
import uuid

from authlib.integrations.flask_oauth2 import AuthorizationServer, ResourceProtector
from authlib.oauth2.rfc6749 import ClientMixin, TokenMixin, grants
from authlib.oauth2.rfc6750 import BearerTokenValidator
from authlib.oauth2.rfc7009 import RevocationEndpoint
from authlib.oauth2.rfc7662 import IntrospectionEndpoint
from flask import Flask, Response, jsonify, request
from werkzeug.serving import make_server

lock = threading.Lock()
stats = {"refresh_grants": 0, "password_grants": 0, "revocations": 0, "introspections": 0, "token_requests": 0}
faults = []  # [mode, remaining, retry_after]: the next token requests misbehave
hang_forever = threading.Event()


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
        return None

    def get_allowed_scope(self, scope):
        return scope or ""

    def check_redirect_uri(self, redirect_uri):
        return False

    def check_client_secret(self, client_secret):
        return self.client_secret is not None and client_secret == self.client_secret

    def check_endpoint_auth_method(self, method, endpoint):
        return method in self.auth_methods

    def check_response_type(self, response_type):
        return False

    def check_grant_type(self, grant_type):
        return grant_type in ("password", "refresh_token")


CLIENTS = {
    "sessionflow-public": Client("sessionflow-public", None, ["none"]),
    "sessionflow-confidential": Client("sessionflow-confidential", "s3cret", ["client_secret_post", "client_secret_basic"]),
}


class Token(TokenMixin):
    def __init__(self, client_id, user_id, data):
        self.client_id = client_id
        self.user_id = user_id
        self.access_token = data["access_token"]
        self.refresh_token = data.get("refresh_token")
        self.scope = data.get("scope", "")
        self.expires_in = data["expires_in"]
        self.issued_at = time.time()
        self.revoked = False

    def check_client(self, client):
        return client.get_client_id() == self.client_id

    def get_scope(self):
        return self.scope

    def get_expires_in(self):
        return self.expires_in

    def is_expired(self):
        return time.time() >= self.issued_at + self.expires_in

    def is_revoked(self):
        return self.revoked

    def get_user(self):
        return USERS[self.user_id]

    def get_client(self):
        return CLIENTS[self.client_id]


TOKENS = []


def find_token(value, hint=None):
    with lock:
        for token in TOKENS:
            if hint != "refresh_token" and token.access_token == value:
                return token
            if hint != "access_token" and token.refresh_token == value:
                return token
    return None


def query_client(client_id):
    return CLIENTS.get(client_id)


def save_token(data, req):
    token = Token(req.client.get_client_id(), req.user.get_user_id(), data)
    with lock:
        TOKENS.append(token)


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
    INCLUDE_NEW_REFRESH_TOKEN = True  # rotation

    def authenticate_refresh_token(self, refresh_token):
        with lock:
            stats["refresh_grants"] += 1
        token = find_token(refresh_token, "refresh_token")
        if token and not token.revoked:
            return token
        return None

    def authenticate_user(self, refresh_token):
        return refresh_token.get_user()

    def revoke_old_credential(self, refresh_token):
        refresh_token.revoked = True


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


class Validator(BearerTokenValidator):
    def authenticate_token(self, token_string):
        return find_token(token_string, "access_token")


def create_app(expires_in):
    app = Flask(__name__)
    app.config["OAUTH2_TOKEN_EXPIRES_IN"] = {"password": expires_in, "refresh_token": expires_in}
    app.config["OAUTH2_REFRESH_TOKEN_GENERATOR"] = True
    server = AuthorizationServer(app, query_client=query_client, save_token=save_token)
    server.register_grant(PasswordGrant)
    server.register_grant(RefreshGrant)
    server.register_endpoint(Revocation)
    server.register_endpoint(Introspection)
    protect = ResourceProtector()
    protect.register_token_validator(Validator())

    @app.route("/oauth/token", methods=["POST"])
    def token():
        with lock:
            stats["token_requests"] += 1
            fault = None
            if faults:
                fault = faults[0]
                fault[1] -= 1
                if fault[1] <= 0:
                    faults.pop(0)
        if fault is None:
            return server.create_token_response()
        return misbehave(fault[0], fault[2], lambda: server.create_token_response())

    @app.route("/__fault", methods=["POST"])
    def set_fault():
        retry_after = request.form.get("retry_after")
        with lock:
            faults.append([request.form["mode"], int(request.form.get("count", "1")), retry_after])
        return jsonify(ok=True)

    @app.route("/oauth/revoke", methods=["POST"])
    def revoke():
        return server.create_endpoint_response(Revocation.ENDPOINT_NAME)

    @app.route("/oauth/introspect", methods=["POST"])
    def introspect():
        return server.create_endpoint_response(Introspection.ENDPOINT_NAME)

    @app.route("/api/me")
    @protect()
    def me():
        from authlib.integrations.flask_oauth2 import current_token
        return jsonify(user=current_token.user_id)

    @app.route("/__stats")
    def stats_view():
        with lock:
            return jsonify(stats)

    @app.route("/__revoke_user", methods=["POST"])
    def revoke_user():
        user = request.form["user"]
        with lock:
            for token in TOKENS:
                if token.user_id == user:
                    token.revoked = True
        return jsonify(ok=True)

    return app


def misbehave(mode, retry_after, real_answer):
    """The answer of a token request under fault `mode` (see the module docstring)."""
    headers = {"Retry-After": retry_after} if retry_after else {}
    if mode.startswith("delay:"):
        time.sleep(float(mode.split(":", 1)[1]))
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
    return Response(f"unknown fault {mode}", status=599)


def exit_with_parent():
    """Ends the server when its parent closes our stdin (or dies): no orphans."""
    sys.stdin.read()
    os._exit(0)


def main():
    # A parent's thread may have blocked these; a test stopping us must be heard.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGTERM, signal.SIGINT])
    threading.Thread(target=exit_with_parent, daemon=True).start()
    parser = argparse.ArgumentParser()
    parser.add_argument("--expires-in", type=int, default=3600)
    args = parser.parse_args()
    server = make_server("127.0.0.1", 0, create_app(args.expires_in), threaded=True)
    print(f"PORT {server.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
