"""Authorizing requests from Python: Runtime.authorize / unauthorized / refresh_now, and the
adapters over them (sessionflow.httpx.Auth, sync and async; sessionflow.requests.Auth) with
the real libraries against the real test server's protected resource (Tests/Fixtures/
oauth_server.py: /api/resource, Authlib's ResourceProtector)."""
import asyncio
import concurrent.futures
import io
import time

import pytest

import sessionflow as sf
from helpers import CLIENT, call, loopback, wait_for

httpx = pytest.importorskip("httpx")
requests = pytest.importorskip("requests")
import sessionflow.httpx  # noqa: E402  (after the importorskip: it imports httpx)
import sessionflow.requests  # noqa: E402


def password_sign_in(server, user):
    """Tokens for `user` from the server (the password grant, as the Swift tests sign in)."""
    answer = call(f"{server}/oauth/token", {"grant_type": "password", "username": user,
                                            "password": "correct horse", "client_id": CLIENT})
    return answer["access_token"], answer["refresh_token"]


def signed_in(server, user="alice", expires_in=3600, **options):
    runtime = sf.Runtime(token_endpoint=f"{server}/oauth/token", client_id=CLIENT, **options)
    access, refresh = password_sign_in(server, user)
    runtime.sign_in(access, refresh, expires_in=expires_in, member=user)
    return runtime, access


def stats(server):
    return call(f"{server}/__stats")


def resource_stats(server):
    return call(f"{server}/__resource/stats")


def revoke_access(server, token):
    assert call(f"{server}/__resource/revoke_access", {"token": token})["ok"]


def resource(server):
    return f"{server}/api/resource"


# ---- The primitive ------------------------------------------------------------------------

def test_authorize_gives_the_header_the_resource_accepts(server):
    runtime, access = signed_in(server)
    with runtime:
        authorization = runtime.authorize("GET", resource(server))
        assert authorization.scheme == "Bearer"
        assert authorization.headers == [("Authorization", f"Bearer {access}")]
        assert authorization.value == f"Bearer {access}"
        assert authorization.method == "GET" and authorization.url == resource(server)
        assert access not in repr(authorization) and "redacted" in repr(authorization)
        assert httpx.get(resource(server), headers=dict(authorization.headers)).status_code == 200

        # A refusal of a token that is not the session's any more: the current one, no refresh.
        refreshes = stats(server)["refresh_grants"]
        stale = sf.Authorization("GET", resource(server), "Bearer", [("Authorization", "Bearer gone")])
        assert runtime.unauthorized(stale, 401, 'Bearer error="invalid_token"').value == f"Bearer {access}"
        assert stats(server)["refresh_grants"] == refreshes

        # refresh_now: a refresh whatever the margin says.
        token = runtime.refresh_now()
        assert token != access and stats(server)["refresh_grants"] == refreshes + 1
        assert runtime.authorize("GET", resource(server)).value == f"Bearer {token}"


def test_authorize_bad_input_raises_at_once(server):
    runtime, access = signed_in(server)
    with runtime:
        for method, url in [("GE T", resource(server)), ("GET", "http://example.com/x"), ("GET", "ftp://x/y"),
                            ("A" * 33, resource(server)), ("GET", "https://example.com/" + "a" * 9000),
                            ("GET\0", resource(server))]:
            with pytest.raises(sf.InvalidArgumentError):
                runtime.authorize(method, url)
        authorization = runtime.authorize("GET", resource(server))
        with pytest.raises(sf.InvalidArgumentError):
            runtime.unauthorized(authorization, 500)
        refreshes = stats(server)["refresh_grants"]
        with pytest.raises(sf.UnauthorizedError) as error:
            runtime.unauthorized(authorization, 403, 'Bearer error="insufficient_scope", scope="admin"')
        assert "insufficient_scope" in error.value.detail
        assert stats(server)["refresh_grants"] == refreshes


def test_a_failed_answer_carries_the_sessions_reason():
    """An answer that fails in the callback (on the loop thread) carries the session's reason,
    read there from sf_last_error_message — not only its code (a 401 for the current token of a
    session without a refresh token: nothing can be refreshed)."""
    with sf.Runtime() as runtime:
        runtime.sign_in("access-1", None, 3600)
        authorization = runtime.authorize("GET", "https://api.example.com/x")
        with pytest.raises(sf.UnauthorizedError) as error:
            runtime.unauthorized(authorization, 401)
        assert error.value.call == "sf_session_unauthorized (answer)"
        assert "no refresh token" in (error.value.detail or ""), str(error.value)

        async def main():
            with pytest.raises(sf.UnauthorizedError) as failure:
                await runtime.unauthorized_async(authorization, 401)
            assert "no refresh token" in (failure.value.detail or ""), str(failure.value)

        asyncio.run(main())


def test_authorize_when_logged_out_raises_not_logged_in():
    with sf.Runtime() as runtime:
        with pytest.raises(sf.NotLoggedInError) as error:
            runtime.authorize("GET", "https://api.example.com/x")
        assert error.value.call == "sf_session_authorize (answer)"

        async def main():
            with pytest.raises(sf.NotLoggedInError):
                await runtime.authorize_async("GET", "https://api.example.com/x")

        asyncio.run(main())


# ---- Concurrency through the adapters -----------------------------------------------------

def run_httpx_sync(runtime, url, count):
    auth = sessionflow.httpx.Auth(runtime)
    with httpx.Client(auth=auth, timeout=30, limits=httpx.Limits(max_connections=count)) as client:
        with concurrent.futures.ThreadPoolExecutor(count) as pool:
            futures = [pool.submit(client.get, url) for _ in range(count)]
            return [outcome(future) for future in futures]


def run_httpx_async(runtime, url, count):
    async def main():
        auth = sessionflow.httpx.Auth(runtime)
        async with httpx.AsyncClient(auth=auth, timeout=30, limits=httpx.Limits(max_connections=50)) as client:
            return await asyncio.gather(*(client.get(url) for _ in range(count)), return_exceptions=True)

    return list(asyncio.run(main()))


def run_requests(runtime, url, count):
    auth = sessionflow.requests.Auth(runtime)

    def get():
        with requests.Session() as session:
            session.auth = auth
            return session.get(url, timeout=30)

    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        futures = [pool.submit(get) for _ in range(count)]
        return [outcome(future) for future in futures]


def outcome(future):
    try:
        return future.result()
    except Exception as error:  # noqa: BLE001 - the test looks at what each request ended with
        return error


ADAPTERS = {"httpx-sync": run_httpx_sync, "httpx-async": run_httpx_async, "requests": run_requests}


def sends(response):
    """How often the request behind `response` was sent (the refusals are in its history)."""
    return 1 + len(response.history)


def test_httpx_async_200_concurrent_requests_on_a_just_expired_token_refresh_once(server):
    # The token has just expired: the session knows it (expires_in 0: it starts refreshing at
    # once, and the requests join that refresh or follow it) and the resource refuses it.
    refreshes = stats(server)["refresh_grants"]
    before = resource_stats(server)
    runtime, access = signed_in(server, expires_in=0)
    with runtime:
        revoke_access(server, access)
        responses = run_httpx_async(runtime, resource(server), 200)
        after = resource_stats(server)
        assert [getattr(response, "status_code", response) for response in responses] == [200] * 200
        assert stats(server)["refresh_grants"] - refreshes == 1
        assert all(sends(response) <= 2 for response in responses)
        # None was sent with the expired token more than once.
        expired_sends = after["presented"].get(access, 0) - before["presented"].get(access, 0)
        assert expired_sends == sum(sends(response) - 1 for response in responses) <= 200
        assert after["ok"] - before["ok"] == 200
        print(f"httpx async, 200 requests on an expired token: 1 refresh, {after['requests'] - before['requests']} "
              f"resource requests, {expired_sends} with the expired token")


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_a_revoked_access_token_under_50_concurrent_requests_refreshes_once(server, adapter):
    runtime, access = signed_in(server)
    with runtime:
        revoke_access(server, access)
        refreshes = stats(server)["refresh_grants"]
        before = resource_stats(server)
        responses = ADAPTERS[adapter](runtime, resource(server), 50)
        after = resource_stats(server)
        assert [getattr(response, "status_code", response) for response in responses] == [200] * 50
        assert stats(server)["refresh_grants"] - refreshes == 1
        assert all(sends(response) <= 2 for response in responses)  # retried at most once
        retried = sum(sends(response) - 1 for response in responses)
        assert after["requests"] - before["requests"] == 50 + retried
        assert after["ok"] - before["ok"] == 50
        assert runtime.state == sf.State.LOGGED_IN
        print(f"{adapter}: 50 requests, {retried} retried, 1 refresh")


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_a_dead_session_raises_auth_error_once_per_request(server, adapter):
    runtime, access = signed_in(server, user="bob")
    with runtime:
        assert call(f"{server}/__revoke_user", {"user": "bob"})["ok"]
        token_requests = stats(server)["token_requests"]
        before = resource_stats(server)
        outcomes = ADAPTERS[adapter](runtime, resource(server), 10)
        assert all(isinstance(outcome, sf.AuthError) for outcome in outcomes), outcomes
        assert runtime.state == sf.State.SESSION_EXPIRED
        # No loop of retries: each request was sent at most once, and one refresh was tried.
        assert resource_stats(server)["requests"] - before["requests"] <= 10
        assert stats(server)["token_requests"] - token_requests == 1
        # And later requests fail before they are sent.
        time.sleep(0.05)
        assert isinstance(ADAPTERS[adapter](runtime, resource(server), 1)[0], sf.AuthError)
        assert resource_stats(server)["requests"] - before["requests"] <= 10


def test_httpx_a_403_goes_to_the_session_only_with_a_challenge(server):
    """The resource never answers 403: a transport that does, in front of the session."""
    runtime, access = signed_in(server)
    with runtime:
        answers = []

        def forbidden(request):
            answers.append(request.headers["Authorization"])
            challenge = {"WWW-Authenticate": 'Bearer error="insufficient_scope"'} if len(answers) == 1 else {}
            return httpx.Response(403, headers=challenge)

        auth = sessionflow.httpx.Auth(runtime)
        with httpx.Client(auth=auth, transport=httpx.MockTransport(forbidden)) as client:
            with pytest.raises(sf.UnauthorizedError):
                client.get(resource(server))  # insufficient_scope: a new token would not help
            assert client.get(resource(server)).status_code == 403  # no challenge: the answer
        assert answers == [f"Bearer {access}"] * 2  # never retried


# ---- Answers the session did not ask for, bodies that cannot be sent twice ----------------
# Plain loopback servers (helpers.loopback) in front of the session: they see the header names.

INVALID_TOKEN = {"WWW-Authenticate": 'Bearer error="invalid_token"'}


def refuse(request):
    return 401, INVALID_TOKEN


def paths(seen):
    return [request["path"] for request in seen]


@pytest.mark.parametrize("status", [302, 307])
def test_requests_a_redirect_targets_401_is_returned_with_no_token_and_no_refresh(server, status):
    """The session authorized origin A; A redirects to origin B, which refuses: B's 401 is the
    answer. Nothing is refreshed and B never gets a token (requests copies the request and our
    hook with it for the redirect)."""
    runtime, access = signed_in(server)
    with runtime, loopback(refuse) as (other, other_seen):
        with loopback(lambda request: (status, {"Location": f"{other}/landing"})) as (origin, origin_seen):
            refreshes = stats(server)["refresh_grants"]
            response = requests.get(f"{origin}/start", auth=sessionflow.requests.Auth(runtime), timeout=30)
            assert response.status_code == 401 and response.url == f"{other}/landing"
            assert [answer.status_code for answer in response.history] == [status]
            assert paths(origin_seen) == ["/start"] and "authorization" in origin_seen[0]["headers"]
            assert paths(other_seen) == ["/landing"]  # once: not retried
            assert not {"authorization", "dpop"} & other_seen[0]["headers"]
            assert stats(server)["refresh_grants"] == refreshes


@pytest.mark.parametrize("kind", ["generator", "iterator"])
def test_requests_a_body_sent_once_is_not_retried_nor_refreshed_for(server, kind):
    """A generator's (an iterator's) body is consumed by the first send: the 401 is the answer,
    the server got one request, nothing was refreshed. A body that rewinds is retried whole."""
    runtime, access = signed_in(server)
    with runtime, loopback(refuse) as (url, seen):
        auth = sessionflow.requests.Auth(runtime)
        refreshes = stats(server)["refresh_grants"]

        def generator():
            yield b"part one, "
            yield b"part two"

        body = generator() if kind == "generator" else iter([b"part one, ", b"part two"])
        response = requests.post(f"{url}/upload", data=body, auth=auth, timeout=30)
        assert response.status_code == 401 and response.history == []
        assert [request["body"] for request in seen] == [b"part one, part two"]
        assert stats(server)["refresh_grants"] == refreshes

        # The same refusal for a body that rewinds: one refresh, one retry with the whole body.
        del seen[:]
        response = requests.post(f"{url}/upload", data=io.BytesIO(b"seekable"), auth=auth, timeout=30)
        assert response.status_code == 401 and len(response.history) == 1
        assert [request["body"] for request in seen] == [b"seekable"] * 2
        assert stats(server)["refresh_grants"] == refreshes + 1


def httpx_send(runtime, flow, method, url, **options):
    """One request through sessionflow.httpx.Auth, with httpx.Client or httpx.AsyncClient."""
    auth = sessionflow.httpx.Auth(runtime)
    if flow == "sync":
        with httpx.Client(auth=auth, timeout=30, follow_redirects=True) as client:
            return client.request(method, url, **options)

    async def main():
        async with httpx.AsyncClient(auth=auth, timeout=30, follow_redirects=True) as client:
            return await client.request(method, url, **options)

    return asyncio.run(main())


@pytest.mark.parametrize("flow", ["sync", "async"])
def test_httpx_a_streamed_body_refused_is_returned_with_no_refresh(server, flow):
    """A generator's body (content=) cannot be sent again: the 401 is the answer (no
    StreamConsumed), the server got one request, nothing was refreshed. Bytes are retried."""
    runtime, access = signed_in(server)
    with runtime, loopback(refuse) as (url, seen):
        refreshes = stats(server)["refresh_grants"]
        if flow == "sync":
            def body():
                yield b"part one, "
                yield b"part two"
        else:
            async def body():
                yield b"part one, "
                yield b"part two"
        response = httpx_send(runtime, flow, "POST", f"{url}/upload", content=body())
        assert response.status_code == 401
        assert [request["body"] for request in seen] == [b"part one, part two"]
        assert stats(server)["refresh_grants"] == refreshes

        # The same refusal for bytes: one refresh, one retry with the whole body.
        del seen[:]
        response = httpx_send(runtime, flow, "POST", f"{url}/upload", content=b"in memory")
        assert response.status_code == 401
        assert [request["body"] for request in seen] == [b"in memory"] * 2
        assert stats(server)["refresh_grants"] == refreshes + 1


@pytest.mark.parametrize("flow", ["sync", "async"])
def test_httpx_a_redirect_targets_401_is_returned_with_no_refresh(server, flow):
    """follow_redirects=True: httpx follows A's redirect within one step of the auth flow; B's
    401 answers a URL the session did not authorize: returned as it is, nothing refreshed, A
    not asked again (httpx strips Authorization for another origin)."""
    runtime, access = signed_in(server)
    with runtime, loopback(refuse) as (other, other_seen):
        with loopback(lambda request: (302, {"Location": f"{other}/landing"})) as (origin, origin_seen):
            refreshes = stats(server)["refresh_grants"]
            response = httpx_send(runtime, flow, "GET", f"{origin}/start")
            assert response.status_code == 401 and str(response.url) == f"{other}/landing"
            assert [answer.status_code for answer in response.history] == [302]
            assert paths(origin_seen) == ["/start"] and "authorization" in origin_seen[0]["headers"]
            assert paths(other_seen) == ["/landing"]
            assert "authorization" not in other_seen[0]["headers"]
            assert stats(server)["refresh_grants"] == refreshes


def test_requests_a_huge_refusal_is_not_read_before_the_retry(server):
    """A 401 whose body is huge (or endless): the adapter reads at most 64 KiB of it, closes its
    connection and retries with the refreshed token. Before, it read the whole body first
    (requests runs the hook before the body is read, stream or not)."""
    import http.server
    import socketserver
    import threading

    huge = 512 << 20
    sent = []
    answered = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            if not answered:
                answered.append(401)
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Bearer error="invalid_token"')
                self.send_header("Content-Length", str(huge))
                self.end_headers()
                chunk, count = b"x" * 65536, 0
                try:
                    while count < huge:
                        self.wfile.write(chunk)
                        count += len(chunk)
                except OSError:  # the client closed the connection: good
                    pass
                sent.append(count)
                self.close_connection = True
                return
            answered.append(200)
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True

    httpd = Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    runtime, access = signed_in(server)
    try:
        with runtime:
            refreshes = stats(server)["refresh_grants"]
            url = f"http://127.0.0.1:{httpd.server_address[1]}/big"
            response = requests.get(url, auth=sessionflow.requests.Auth(runtime), timeout=60)
            assert response.status_code == 200 and response.text == "ok"
            assert [answer.status_code for answer in response.history] == [401]
            assert answered == [401, 200]
            assert stats(server)["refresh_grants"] == refreshes + 1
            assert wait_for(lambda: sent)
            assert sent[0] < 64 << 20, f"{sent[0]} bytes of the refusal were sent: it was read whole"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_an_adapter_waits_as_long_as_the_refresh_may_take(server):
    """A refresh that takes 12 s (the server is slow; the refresh timeout is 30 s): the request
    waits for it and succeeds. Before, unauthorized() gave up after a fixed 10 s and the adapter
    raised a plain TimeoutError, which is not the session's error."""
    runtime, access = signed_in(server)
    with runtime:
        revoke_access(server, access)  # the resource refuses it: the adapter asks for a refresh
        assert call(f"{server}/__fault", {"mode": "delay:12", "count": "1"})["ok"]
        started = time.monotonic()
        response = httpx.get(resource(server), auth=sessionflow.httpx.Auth(runtime), timeout=60)
        assert response.status_code == 200
        assert time.monotonic() - started >= 11  # it did wait for the slow refresh


def test_requests_the_refusal_stays_readable_in_the_history(server):
    """The retried 401 is in the answer's history with its body, as requests keeps any answer's
    (its connection went back to the pool for the retry)."""
    runtime, access = signed_in(server)
    with runtime:
        revoke_access(server, access)
        response = requests.get(resource(server), auth=sessionflow.requests.Auth(runtime), timeout=30)
        assert response.status_code == 200
        refusal = response.history[0]
        assert refusal.status_code == 401
        assert refusal.content and refusal.json().get("error") == "invalid_token", refusal.content
