"""The test server's DPoP (RFC 9449) checks, with proofs made by joserfc (no client of ours):
a good proof binds the tokens (token_type DPoP, the key's thumbprint), each §4.3 check refuses
what it should, a bound refresh token is useless without its key, nonces on demand.

    python3 -m pytest -q Tests/Fixtures/test_dpop_server.py
"""
import base64
import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

import pytest
from joserfc import jws
from joserfc.jwk import ECKey

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture()
def server():
    process = subprocess.Popen([sys.executable, os.path.join(HERE, "oauth_server.py")], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = process.stdout.readline()
    assert line.startswith("PORT "), line
    yield f"http://127.0.0.1:{int(line.split()[1])}"
    process.stdin.close()
    process.terminate()
    process.wait(30)


def call(url, form=None, headers=None, method=None):
    data = urllib.parse.urlencode(form).encode() if form is not None else None
    req = urllib.request.Request(url, data=data, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as answer:
            return answer.status, dict(answer.headers), json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), json.loads(error.read() or b"null")


def proof(key, method, url, access_token=None, nonce=None, **changes):
    header = {"typ": "dpop+jwt", "alg": "ES256", "jwk": key.as_dict(private=False)}
    claims = {"jti": uuid.uuid4().hex, "htm": method, "htu": url, "iat": int(time.time())}
    if access_token is not None:
        claims["ath"] = base64.urlsafe_b64encode(hashlib.sha256(access_token.encode()).digest()).rstrip(b"=").decode()
    if nonce is not None:
        claims["nonce"] = nonce
    header.update(changes.pop("header", {}))
    claims.update(changes)
    return jws.serialize_compact(header, json.dumps(claims).encode(), key, algorithms=["ES256"])


def sign_in(base, key):
    url = base + "/oauth/token"
    form = {"grant_type": "password", "username": "alice", "password": "correct horse",
            "client_id": "sessionflow-public"}
    return call(url, form, {"DPoP": proof(key, "POST", url)})


def refresh(base, refresh_token, key=None, nonce=None):
    url = base + "/oauth/token"
    form = {"grant_type": "refresh_token", "refresh_token": refresh_token, "client_id": "sessionflow-public"}
    return call(url, form, {"DPoP": proof(key, "POST", url, nonce=nonce)} if key else {})


def stats(base):
    return call(base + "/__dpop/stats")[2]


def test_a_proof_binds_the_tokens_to_its_key(server):
    key = ECKey.generate_key("P-256")
    status, _, body = sign_in(server, key)
    assert status == 200 and body["token_type"] == "DPoP"
    tokens = call(server + "/__tokens")[2]
    assert tokens[-1]["jkt"] == key.thumbprint()
    assert stats(server)["endpoints"]["token"]["valid"] == 1


def test_a_stolen_refresh_token_is_refused_without_the_key(server):
    key = ECKey.generate_key("P-256")
    body = sign_in(server, key)[2]
    # Given the refresh token copied out: as a bearer, and with another key: both refused.
    assert refresh(server, body["refresh_token"])[0] == 400
    assert refresh(server, body["refresh_token"], ECKey.generate_key("P-256"))[0] == 400
    assert stats(server)["bound_refused"] == 2
    # The owner still refreshes.
    status, _, again = refresh(server, body["refresh_token"], key)
    assert status == 200 and again["token_type"] == "DPoP"


def test_resource_needs_a_proof_with_ath_by_the_bound_key(server):
    key = ECKey.generate_key("P-256")
    token = sign_in(server, key)[2]["access_token"]
    url = server + "/api/resource"
    good = call(url, headers={"Authorization": f"DPoP {token}", "DPoP": proof(key, "GET", url, token)})
    assert good[0] == 200 and good[2]["scheme"] == "DPoP"
    assert call(url, headers={"Authorization": f"Bearer {token}"})[0] == 401
    assert call(url, headers={"Authorization": f"DPoP {token}", "DPoP": proof(key, "GET", url)})[0] == 401  # no ath
    other = ECKey.generate_key("P-256")
    assert call(url, headers={"Authorization": f"DPoP {token}", "DPoP": proof(other, "GET", url, token)})[0] == 401
    wrong_url = call(url + "?q=1", headers={"Authorization": f"DPoP {token}",
                                            "DPoP": proof(key, "GET", url + "?q=1", token)})
    assert wrong_url[0] == 401  # htu carries no query
    assert call(url + "?q=1", headers={"Authorization": f"DPoP {token}",
                                       "DPoP": proof(key, "GET", url, token)})[0] == 200
    counts = stats(server)["endpoints"]["resource"]
    assert counts["valid"] == 3 and counts["invalid"] == 2  # the other key's proof is good, its binding not


@pytest.mark.parametrize("change, reason", [
    ({"header": {"typ": "JWT"}}, "typ"),
    ({"htm": "GET"}, "htm"),
    ({"htu": "http://127.0.0.1:1/oauth/token"}, "htu"),
    ({"iat": int(time.time()) - 3600}, "iat"),
])
def test_each_check_refuses_its_fault(server, change, reason):
    key = ECKey.generate_key("P-256")
    url = server + "/oauth/token"
    form = {"grant_type": "password", "username": "alice", "password": "correct horse",
            "client_id": "sessionflow-public"}
    status, _, body = call(url, form, {"DPoP": proof(key, "POST", url, **change)})
    assert status == 400 and body["error"] == "invalid_dpop_proof" and reason in body["error_description"]


def test_a_replayed_jti_and_a_forged_signature_are_refused(server):
    key = ECKey.generate_key("P-256")
    url = server + "/oauth/token"
    form = {"grant_type": "password", "username": "alice", "password": "correct horse",
            "client_id": "sessionflow-public"}
    once = proof(key, "POST", url)
    assert call(url, form, {"DPoP": once})[0] == 200
    status, _, body = call(url, form, {"DPoP": once})
    assert status == 400 and "replayed" in body["error_description"]
    head, payload, signature = proof(key, "POST", url).split(".")
    forged = ".".join([head, base64.urlsafe_b64encode(json.dumps(
        {"jti": "x", "htm": "POST", "htu": url, "iat": int(time.time())}).encode()).rstrip(b"=").decode(), signature])
    status, _, body = call(url, form, {"DPoP": forged})
    assert status == 400 and "signature" in body["error_description"]
    hs256 = base64.urlsafe_b64encode(json.dumps(
        {"typ": "dpop+jwt", "alg": "HS256", "jwk": key.as_dict(private=False)}).encode()).rstrip(b"=").decode()
    status, _, body = call(url, form, {"DPoP": ".".join([hs256, payload, signature])})
    assert status == 400 and "not allowed" in body["error_description"]


def test_a_demanded_nonce_is_given_then_accepted(server):
    key = ECKey.generate_key("P-256")
    call(server + "/__dpop/config", {"nonce_token": "on", "nonce_resource": "on"})
    status, headers, body = sign_in(server, key)
    assert status == 400 and body["error"] == "use_dpop_nonce"
    nonce = headers["DPoP-Nonce"]
    url = server + "/oauth/token"
    form = {"grant_type": "password", "username": "alice", "password": "correct horse",
            "client_id": "sessionflow-public"}
    status, headers, body = call(url, form, {"DPoP": proof(key, "POST", url, nonce=nonce)})
    assert status == 200 and headers["DPoP-Nonce"] == nonce
    resource = server + "/api/resource"
    token = body["access_token"]
    status, headers, _ = call(resource, headers={"Authorization": f"DPoP {token}", "DPoP": proof(key, "GET", resource, token)})
    assert status == 401 and headers["DPoP-Nonce"] == nonce and 'error="use_dpop_nonce"' in headers["WWW-Authenticate"]
    assert call(resource, headers={"Authorization": f"DPoP {token}",
                                   "DPoP": proof(key, "GET", resource, token, nonce=nonce)})[0] == 200
    assert stats(server)["endpoints"]["token"]["nonce_demanded"] == 1


def test_always_demands_a_new_nonce(server):
    key = ECKey.generate_key("P-256")
    call(server + "/__dpop/config", {"nonce_token": "always"})
    first = sign_in(server, key)[1]["DPoP-Nonce"]
    url = server + "/oauth/token"
    form = {"grant_type": "password", "username": "alice", "password": "correct horse",
            "client_id": "sessionflow-public"}
    status, headers, body = call(url, form, {"DPoP": proof(key, "POST", url, nonce=first)})
    assert status == 400 and body["error"] == "use_dpop_nonce" and headers["DPoP-Nonce"] != first


def test_ignore_issues_bearer_tokens_and_metadata_lists_the_algs(server):
    metadata = call(server + "/.well-known/oauth-authorization-server")[2]
    assert "ES256" in metadata["dpop_signing_alg_values_supported"]
    call(server + "/__dpop/config", {"ignore": "1", "advertise": "0"})
    assert "dpop_signing_alg_values_supported" not in call(server + "/.well-known/oauth-authorization-server")[2]
    assert sign_in(server, ECKey.generate_key("P-256"))[2]["token_type"] == "Bearer"
