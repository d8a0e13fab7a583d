"""DPoP (RFC 9449) from Python: Runtime(dpop=...) makes the built-in client's sign-ins
sender-constrained; authorize() then gives `Authorization: DPoP` and a `DPoP` proof, and the
adapters (sessionflow.httpx.Auth, sessionflow.requests.Auth) send them unchanged. The test
server checks every proof (joserfc) and counts them (/__dpop/stats)."""
import pytest

import sessionflow as sf
from helpers import CLIENT, call, loopback, wait_for

httpx = pytest.importorskip("httpx")
requests = pytest.importorskip("requests")
import sessionflow.httpx  # noqa: E402  (after the importorskip: it imports httpx)
import sessionflow.requests  # noqa: E402


def dpop_stats(server, endpoint):
    return call(f"{server}/__dpop/stats")["endpoints"].get(endpoint, {"valid": 0, "invalid": 0, "absent": 0})


def test_the_dpop_option_is_checked():
    with pytest.raises(sf.InvalidArgumentError):
        sf.Runtime(token_endpoint="http://127.0.0.1:9/oauth/token", client_id=CLIENT, dpop=7)
    with sf.Runtime(token_endpoint="http://127.0.0.1:9/oauth/token", client_id=CLIENT, dpop=sf.DPoP.REQUIRED):
        pass


def test_a_dpop_device_sign_in_and_the_adapters_carry_valid_proofs(server):
    call(f"{server}/__device/config", {"reset": "1", "interval": "1", "expires_in": "60"})
    call(f"{server}/__dpop/config", {"reset": "1"})
    resource = f"{server}/api/resource"
    with sf.Runtime(issuer=server, client_id=CLIENT, dpop=sf.DPoP.IF_SUPPORTED) as runtime:
        prompts = []
        sign_in = runtime.sign_in_device(on_prompt=prompts.append)
        assert wait_for(lambda: prompts)
        assert call(f"{server}/__device/approve", {"user_code": prompts[0].user_code})["ok"]
        sign_in.wait(20)
        assert sign_in.result == 0, sign_in.message
        authorization = runtime.authorize("GET", resource)
        assert authorization.scheme == "DPoP"
        assert [name for name, _ in authorization.headers] == ["Authorization", "DPoP"]
        assert authorization.value.startswith("DPoP ")
        assert runtime.token_info().token_type == "DPoP"  # as the token is presented
        # The adapters add what authorize() gives: both headers, a new proof each request.
        assert httpx.get(resource, auth=sessionflow.httpx.Auth(runtime)).json()["scheme"] == "DPoP"
        assert requests.get(resource, auth=sessionflow.requests.Auth(runtime)).json()["scheme"] == "DPoP"
        # A refresh carries a proof too, and the session goes on with DPoP tokens.
        runtime.refresh_now()
        assert httpx.get(resource, auth=sessionflow.httpx.Auth(runtime)).status_code == 200
    token, resources = dpop_stats(server, "token"), dpop_stats(server, "resource")
    # Every token-endpoint request (the polls, the refresh) and every resource request carried
    # a valid proof.
    assert token["invalid"] == 0 and token["absent"] == 0 and token["valid"] >= 2, token
    assert resources == {"valid": 3, "invalid": 0, "absent": 0, "nonce_demanded": 0}, resources


def test_a_host_that_signed_in_with_dpop_hands_its_key_over(server):
    """sign_in(dpop_key=...): the refresh proves the key (the server binds the new tokens to
    it), authorize() answers DPoP; a bad key is refused before anything is signed in."""
    import base64
    import os
    answer = call(f"{server}/oauth/token", {"grant_type": "password", "username": "alice",
                                            "password": "correct horse", "client_id": CLIENT})
    key = base64.urlsafe_b64encode(os.urandom(32)).rstrip(b"=").decode()
    with sf.Runtime(token_endpoint=f"{server}/oauth/token", client_id=CLIENT) as runtime:
        with pytest.raises(sf.InvalidArgumentError):
            runtime.sign_in(answer["access_token"], answer["refresh_token"], 0, dpop_key="A" * 43)
        assert runtime.state == sf.State.LOGGED_OUT
        runtime.sign_in(answer["access_token"], answer["refresh_token"], 0, member="alice", dpop_key=key)
        authorization = runtime.authorize("GET", f"{server}/api/resource")  # refreshes first (expires_in 0)
        assert authorization.scheme == "DPoP"
        assert requests.get(f"{server}/api/resource", auth=sessionflow.requests.Auth(runtime)).status_code == 200


def test_a_resource_nonce_costs_each_adapter_one_retry_and_no_refresh(server):
    """The resource demands a nonce (use_dpop_nonce, DPoP-Nonce): each adapter retries once with
    a proof carrying it (sf_session_unauthorized_dpop), nothing is refreshed; a server that
    demands a new one every time ends in one refusal, never a loop."""
    call(f"{server}/__dpop/config", {"reset": "1"})
    resource = f"{server}/api/resource"
    answer = call(f"{server}/oauth/token", {"grant_type": "password", "username": "alice",
                                            "password": "correct horse", "client_id": CLIENT})
    import base64
    import os
    key = base64.urlsafe_b64encode(os.urandom(32)).rstrip(b"=").decode()
    with sf.Runtime(token_endpoint=f"{server}/oauth/token", client_id=CLIENT) as runtime:
        runtime.sign_in(answer["access_token"], answer["refresh_token"], 3600, member="alice", dpop_key=key)
        runtime.refresh_now()  # binds the tokens to the key (the refresh carries a proof)
        refreshes = call(f"{server}/__stats")["refresh_grants"]
        for get in (lambda: httpx.get(resource, auth=sessionflow.httpx.Auth(runtime)),
                    lambda: requests.get(resource, auth=sessionflow.requests.Auth(runtime))):
            call(f"{server}/__dpop/config", {"nonce_resource": "on", "new_nonce": "1"})
            before = call(f"{server}/__resource/stats")["requests"]
            assert get().status_code == 200
            assert call(f"{server}/__resource/stats")["requests"] - before == 2  # refused once, then accepted
        assert call(f"{server}/__stats")["refresh_grants"] == refreshes
        call(f"{server}/__dpop/config", {"nonce_resource": "always"})
        before = call(f"{server}/__resource/stats")["requests"]
        # One retry (as for any refusal), then the adapter hands back the server's refusal.
        assert httpx.get(resource, auth=sessionflow.httpx.Auth(runtime)).status_code == 401
        assert call(f"{server}/__resource/stats")["requests"] - before == 2
        assert call(f"{server}/__stats")["refresh_grants"] == refreshes


def _dpop_session(server, runtime):
    import base64
    import os
    answer = call(f"{server}/oauth/token", {"grant_type": "password", "username": "alice",
                                            "password": "correct horse", "client_id": CLIENT})
    key = base64.urlsafe_b64encode(os.urandom(32)).rstrip(b"=").decode()
    runtime.sign_in(answer["access_token"], answer["refresh_token"], 3600, member="alice", dpop_key=key)
    runtime.refresh_now()  # binds the tokens to the key


def _proof_nonce(authorization):
    import base64
    import json
    proof = dict(authorization.headers)["DPoP"]
    payload = proof.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))).get("nonce")


def test_requests_refused_together_for_one_nonce_are_each_retried_with_it(server):
    """Two requests sent before the server asked for a nonce are both refused with the same
    use_dpop_nonce N: the first refusal handed to the session remembers N, and the second is
    retried with N too (through the C API, which cannot see the refused proof: it once took the
    nonce remembered meanwhile for the proof's own and answered UnauthorizedError)."""
    resource = f"{server}/api/resource"
    challenge = 'DPoP error="use_dpop_nonce", error_description="Resource server requires nonce in DPoP proof"'
    nonce = "shared-nonce-" + str(id(server))
    with sf.Runtime(token_endpoint=f"{server}/oauth/token", client_id=CLIENT) as runtime:
        _dpop_session(server, runtime)
        first = runtime.authorize("GET", resource)
        second = runtime.authorize("GET", resource)
        assert _proof_nonce(first) != nonce and _proof_nonce(second) != nonce
        refreshes = call(f"{server}/__stats")["refresh_grants"]
        retries = [runtime.unauthorized(refused, 401, challenge, dpop_nonce=nonce) for refused in (first, second)]
        assert [_proof_nonce(retry) for retry in retries] == [nonce, nonce]
        assert call(f"{server}/__stats")["refresh_grants"] == refreshes


def test_a_nonce_no_proof_can_carry_is_refused_and_never_remembered(server):
    """A DPoP-Nonce that is not NQCHARs (RFC 9449 §4.2: a quote, a space) cannot go into a
    proof: that refusal is the answer (UnauthorizedError), and the server's later requests
    still get proofs (it was never remembered for the origin: before, every authorize() to it
    failed for the rest of the process)."""
    resource = f"{server}/api/resource"
    challenge = 'DPoP error="use_dpop_nonce"'
    with sf.Runtime(token_endpoint=f"{server}/oauth/token", client_id=CLIENT) as runtime:
        _dpop_session(server, runtime)
        refused = runtime.authorize("GET", resource)
        with pytest.raises(sf.UnauthorizedError) as refusal:
            runtime.unauthorized(refused, 401, challenge, dpop_nonce='bad "nonce')
        assert "NQCHAR" in str(refusal.value), str(refusal.value)  # the library's reason, not only the code
        again = runtime.authorize("GET", resource)
        assert again.scheme == "DPoP" and _proof_nonce(again) != 'bad "nonce'
        assert runtime.unauthorized(again, 401, challenge, dpop_nonce="good-nonce").scheme == "DPoP"


@pytest.mark.parametrize("case", ["another origin", "the same origin", "another origin, after a retry"])
def test_requests_a_redirect_carries_no_proof_and_its_targets_401_is_returned(server, case):
    """A proof names its method and URL: the requests adapter keeps it off a redirect's request
    (requests builds it as a copy of the first), whether the redirect answers the request or its
    retry. The target's 401 is returned as it is, nothing refreshed for it; another origin gets
    no Authorization either."""
    import base64
    import os
    answer = call(f"{server}/oauth/token", {"grant_type": "password", "username": "alice",
                                            "password": "correct horse", "client_id": CLIENT})
    key = base64.urlsafe_b64encode(os.urandom(32)).rstrip(b"=").decode()
    refusal = {"WWW-Authenticate": 'DPoP error="invalid_token"'}
    with sf.Runtime(token_endpoint=f"{server}/oauth/token", client_id=CLIENT) as runtime, \
            loopback(lambda request: (401, refusal)) as (other, other_seen):
        runtime.sign_in(answer["access_token"], answer["refresh_token"], 3600, member="alice", dpop_key=key)
        runtime.refresh_now()  # binds the tokens to the key
        starts = []

        def origin_answer(request):
            if request["path"] != "/start":
                return 401, refusal  # the same origin's redirect target
            starts.append(request)
            if case.endswith("after a retry") and len(starts) == 1:
                return 401, refusal  # refused once (a refresh, a retry), then redirected
            return 307, {"Location": target}

        with loopback(origin_answer) as (origin, origin_seen):
            target = f"{origin}/landing" if case == "the same origin" else f"{other}/landing"
            assert runtime.authorize("GET", f"{origin}/start").scheme == "DPoP"
            refreshes = call(f"{server}/__stats")["refresh_grants"]
            response = requests.get(f"{origin}/start", auth=sessionflow.requests.Auth(runtime), timeout=30)
            landed = [request for request in origin_seen + other_seen if request["path"] == "/landing"]
            assert response.status_code == 401 and response.url == target
            assert all({"authorization", "dpop"} <= request["headers"] for request in starts)
            assert len(starts) == (2 if case.endswith("after a retry") else 1)
            assert len(landed) == 1  # not retried
            assert "dpop" not in landed[0]["headers"]
            if case != "the same origin":
                assert "authorization" not in landed[0]["headers"]
            # A refresh only for the refusal of the request the session authorized.
            assert call(f"{server}/__stats")["refresh_grants"] == refreshes + (case.endswith("after a retry"))


@pytest.mark.parametrize("adapter", ["httpx", "httpx async", "requests"])
def test_a_server_rotating_its_nonce_on_good_answers_costs_no_refusal(server, adapter):
    """nonce_resource=rotate: every good answer carries a new nonce, and only it is accepted next
    (RFC 9449 §8.2). Each adapter hands the good answer's nonce to the session
    (remember_dpop_nonce), so 5 requests cost 6 resource requests (the first is refused once for
    want of a nonce), not 10; nothing is refreshed."""
    import asyncio
    resource = f"{server}/api/resource"
    call(f"{server}/__dpop/config", {"reset": "1"})
    with sf.Runtime(token_endpoint=f"{server}/oauth/token", client_id=CLIENT) as runtime:
        _dpop_session(server, runtime)
        call(f"{server}/__dpop/config", {"nonce_resource": "rotate"})
        refreshes = call(f"{server}/__stats")["refresh_grants"]
        before = call(f"{server}/__resource/stats")["requests"]
        if adapter == "httpx":
            with httpx.Client(auth=sessionflow.httpx.Auth(runtime)) as client:
                statuses = [client.get(resource).status_code for _ in range(5)]
        elif adapter == "httpx async":
            async def five():
                async with httpx.AsyncClient(auth=sessionflow.httpx.Auth(runtime)) as client:
                    return [(await client.get(resource)).status_code for _ in range(5)]
            statuses = asyncio.run(five())
        else:
            with requests.Session() as session:
                session.auth = sessionflow.requests.Auth(runtime)
                statuses = [session.get(resource).status_code for _ in range(5)]
        assert statuses == [200] * 5
        assert call(f"{server}/__resource/stats")["requests"] - before == 6
        assert call(f"{server}/__stats")["refresh_grants"] == refreshes
    call(f"{server}/__dpop/config", {"reset": "1"})


def test_remember_dpop_nonce_refuses_what_no_proof_can_carry(server):
    """Runtime.remember_dpop_nonce: True once remembered (the next proof to that origin carries
    it); False, nothing remembered, for a nonce that is not NQCHARs, empty or too long, or a URL
    authorize() refuses: a server's bad header on a good answer fails no request."""
    resource = f"{server}/api/resource"
    with sf.Runtime(token_endpoint=f"{server}/oauth/token", client_id=CLIENT) as runtime:
        _dpop_session(server, runtime)
        assert runtime.remember_dpop_nonce(resource, "fresh-nonce-1") is True
        assert _proof_nonce(runtime.authorize("GET", f"{server}/api/me")) == "fresh-nonce-1"  # per origin
        for url, nonce in ((resource, 'bad "nonce'), (resource, "with space"), (resource, ""),
                           (resource, "n" * 1025), (resource, "nul\0"), ("ftp://127.0.0.1/x", "n"),
                           ("http://example.com/x", "n")):
            assert runtime.remember_dpop_nonce(url, nonce) is False, (url, nonce)
        assert _proof_nonce(runtime.authorize("GET", resource)) == "fresh-nonce-1"


def test_remember_dpop_nonce_raises_nothing_a_callback_left_pending(server, caplog):
    """It runs after the server answered (the adapters' hooks): a callback's exception kept for
    the host's next call must not make a request that got its answer fail. It stays pending
    for the next call, and a destroyed runtime answers False."""
    import logging
    caplog.set_level(logging.ERROR, logger="sessionflow")
    resource = f"{server}/api/resource"
    runtime = sf.Runtime(token_endpoint=f"{server}/oauth/token", client_id=CLIENT)
    _dpop_session(server, runtime)

    def on_state(state):
        raise ValueError("boom in on_state")

    runtime.subscribe_state(on_state)
    assert wait_for(lambda: "boom in on_state" in caplog.text)
    assert runtime.remember_dpop_nonce(resource, "after-a-callback-failed") is True
    with pytest.raises(sf.CallbackError):
        runtime.authorize("GET", resource)  # still pending for the host's next call
    assert _proof_nonce(runtime.authorize("GET", resource)) == "after-a-callback-failed"
    runtime.destroy()
    assert runtime.remember_dpop_nonce(resource, "n") is False
