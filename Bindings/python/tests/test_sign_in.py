"""Sign-in flows from Python (sf_session_sign_in_device / _browser) against the real test
server (Tests/Fixtures/oauth_server.py: Authlib's RFC 8628 and RFC 8414 metadata)."""
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

import sessionflow as sf
from helpers import CLIENT, call, wait_for


def device_config(server, interval=1, expires_in=60):
    call(f"{server}/__device/config", {"reset": "1", "interval": str(interval), "expires_in": str(expires_in)})


def runtime_for(server):
    return sf.Runtime(token_endpoint=f"{server}/oauth/token", introspection_endpoint=f"{server}/oauth/introspect",
                      client_id=CLIENT)



def test_device_sign_in_approved_through_discovery(server):
    device_config(server)
    prompts = []
    threads = []

    def on_prompt(prompt):
        threads.append(threading.current_thread())
        prompts.append(prompt)

    with runtime_for(server) as runtime:
        sign_in = runtime.sign_in_device(server, on_prompt=on_prompt)
        assert wait_for(lambda: prompts)
        prompt = prompts[0]
        assert prompt.user_code and prompt.verification_uri.startswith(server)
        assert prompt.authorization_url is None and prompt.redirect_uri is None
        assert prompt.interval_ms == 1000 and prompt.expires_in_ms == 60000
        assert threads[0] is not threading.main_thread()
        assert runtime.state == sf.State.LOGGED_OUT
        assert call(f"{server}/__device/approve", {"user_code": prompt.user_code})["ok"]
        sign_in.wait(10)
        assert sign_in.result == 0 and sign_in.message == ""
        assert runtime.state == sf.State.LOGGED_IN
        assert runtime.member_id() == "alice"
        assert not sign_in.cancel()  # finished: SF_ECLOSED
        assert len(prompts) == 1


def test_device_sign_in_denied_raises_edenied(server):
    device_config(server)
    with runtime_for(server) as runtime:
        sign_in = runtime.sign_in_device(server)
        assert wait_for(lambda: sign_in.prompt is not None)
        call(f"{server}/__device/deny", {"user_code": sign_in.prompt.user_code})
        with pytest.raises(sf.SessionFlowError) as error:
            sign_in.wait(10)
        assert error.value.name == "SF_EDENIED"
        assert error.value.detail  # the library's message, in plain words
        assert runtime.state == sf.State.LOGGED_OUT


def test_device_sign_in_expired_raises_eexpired(server):
    device_config(server, interval=1, expires_in=2)
    with runtime_for(server) as runtime:
        sign_in = runtime.sign_in_device(server)
        with pytest.raises(sf.SessionFlowError) as error:
            sign_in.wait(10)
        assert error.value.name == "SF_EEXPIRED"
        assert not runtime.is_logged_in()


def test_device_sign_in_cancelled_polls_no_more(server):
    device_config(server)
    with runtime_for(server) as runtime:
        before = call(f"{server}/__device/stats")["polls"]
        sign_in = runtime.sign_in_device(device_authorization_endpoint=f"{server}/oauth/device_authorization")
        assert wait_for(lambda: call(f"{server}/__device/stats")["polls"] > before)
        assert sign_in.cancel()
        assert not sign_in.cancel()  # twice: False
        with pytest.raises(sf.SessionFlowError) as error:
            sign_in.wait(10)
        assert error.value.name == "SF_ECANCELLED"
        after = call(f"{server}/__device/stats")["polls"]
        call(f"{server}/__device/approve", {"user_code": sign_in.prompt.user_code})
        time.sleep(2.5)
        assert call(f"{server}/__device/stats")["polls"] == after
        assert runtime.state == sf.State.LOGGED_OUT


def test_sign_in_that_cannot_start_raises_and_keeps_nothing(server):
    with sf.Runtime() as bare:
        with pytest.raises(sf.SessionFlowError) as error:
            bare.sign_in_device()  # no endpoints at all
        assert error.value.name == "SF_EINVAL"
        with pytest.raises(sf.SessionFlowError) as error:
            bare.sign_in_device(server)  # an issuer needs the runtime's client_id
        assert error.value.name == "SF_EINVAL"
    with runtime_for(server) as runtime:
        with pytest.raises(sf.SessionFlowError) as error:
            runtime.sign_in_device("ftp://127.0.0.1/")
        assert error.value.name == "SF_EINVAL"
        runtime.sign_in("access", "refresh", 3600, "bob")
        with pytest.raises(sf.SessionFlowError) as error:
            runtime.sign_in_device(server)
        assert error.value.name == "SF_ESTATE"


def test_destroy_ends_a_running_sign_in(server):
    device_config(server)
    runtime = runtime_for(server)
    sign_in = runtime.sign_in_device(server)
    assert wait_for(lambda: sign_in.prompt is not None)
    runtime.destroy()
    assert sign_in.done  # on_done and release ran before destroy returned
    with pytest.raises(sf.SessionFlowError) as error:
        sign_in.wait(0)
    assert error.value.name == "SF_ESHUTDOWN"
    assert not sign_in.cancel()


# ---- The browser flow (authorization code + PKCE on a loopback redirect) ------------------

import html.parser


class _ConsentForm(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.fields = {}

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "input" and attrs.get("type") == "hidden":
            self.fields[attrs["name"]] = attrs.get("value", "")


def play_browser(authorization_url, consent):
    """Follows the authorization URL, submits the consent form as alice and follows the redirect
    to the library's loopback listener (urllib follows the 302). Returns that page's status."""
    with urllib.request.urlopen(authorization_url) as response:
        form = _ConsentForm()
        form.feed(response.read().decode())
    fields = dict(form.fields, user="alice", consent=consent)
    base = authorization_url.split("/oauth/authorize")[0]
    try:
        with urllib.request.urlopen(f"{base}/oauth/authorize", urllib.parse.urlencode(fields).encode()) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def test_browser_sign_in_approved_through_discovery(server):
    prompts = []
    with runtime_for(server) as runtime:
        sign_in = runtime.sign_in_browser(server, on_prompt=prompts.append)
        assert wait_for(lambda: prompts)
        prompt = prompts[0]
        assert prompt.authorization_url.startswith(f"{server}/oauth/authorize?")
        assert prompt.redirect_uri.startswith("http://127.0.0.1:") and prompt.redirect_uri.endswith("/callback")
        assert prompt.user_code is None and prompt.interval_ms == -1 and prompt.expires_in_ms == 300000
        assert play_browser(prompt.authorization_url, "allow") == 200
        sign_in.wait(10)
        assert runtime.state == sf.State.LOGGED_IN
        assert runtime.member_id() == "alice"


def _get(url):
    """A GET that does not follow redirects: (status, Location, body)."""
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None
    try:
        with urllib.request.build_opener(NoRedirect).open(url) as response:
            return response.status, response.headers.get("Location"), response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers.get("Location"), error.read().decode()


def test_browser_start_url_answers_once_and_start_page_false_serves_none(server):
    with runtime_for(server) as runtime:
        # The default: the start URL redirects to the authorization URL, once.
        sign_in = runtime.sign_in_browser(server)
        assert wait_for(lambda: sign_in.prompt is not None)
        start = sign_in.prompt.start_url
        assert start == sign_in.prompt.redirect_uri.replace("/callback", "/start")
        assert _get(start)[:2] == (302, sign_in.prompt.authorization_url)
        assert _get(start)[0] == 400  # a second fetch ends the sign-in
        with pytest.raises(sf.SessionFlowError) as error:
            sign_in.wait(10)
        assert error.value.name == "SF_ECANCELLED"

        # start_page=False, for a host that shows the person the authorization URL: no start
        # URL, /start not found and harmless, the authorization URL signs in.
        shown = runtime.sign_in_browser(server, start_page=False)
        assert wait_for(lambda: shown.prompt is not None)
        assert shown.prompt.start_url is None
        for _ in range(2):
            status, location, body = _get(shown.prompt.redirect_uri.replace("/callback", "/start"))
            assert (status, location) == (404, None) and "state=" not in body
        assert play_browser(shown.prompt.authorization_url, "allow") == 200
        shown.wait(10)
        assert runtime.state == sf.State.LOGGED_IN


def test_browser_sign_in_denied_timeout_and_cancel(server):
    with runtime_for(server) as runtime:
        denied = runtime.sign_in_browser(server)
        assert wait_for(lambda: denied.prompt is not None)
        play_browser(denied.prompt.authorization_url, "deny")
        with pytest.raises(sf.SessionFlowError) as error:
            denied.wait(10)
        assert error.value.name == "SF_EDENIED"

        late = runtime.sign_in_browser(server, timeout_ms=800)
        with pytest.raises(sf.SessionFlowError) as error:
            late.wait(10)
        assert error.value.name == "SF_EEXPIRED"

        cancelled = runtime.sign_in_browser(server)
        assert wait_for(lambda: cancelled.prompt is not None)
        exchanges = call(f"{server}/__authorize/stats")["code_exchanges"]
        assert cancelled.cancel()
        with pytest.raises(sf.SessionFlowError) as error:
            cancelled.wait(10)
        assert error.value.name == "SF_ECANCELLED"
        with pytest.raises(Exception):  # the listener is closed: the redirect finds no one
            play_browser(cancelled.prompt.authorization_url, "allow")
        assert call(f"{server}/__authorize/stats")["code_exchanges"] == exchanges
        assert runtime.state == sf.State.LOGGED_OUT

        with pytest.raises(sf.SessionFlowError) as error:
            runtime.sign_in_browser(server, timeout_ms=-1)
        assert error.value.name == "SF_EINVAL"


def test_a_runtime_with_only_an_issuer_signs_in_and_refreshes(server):
    """sf_options.issuer: the sign-in uses it, and refreshes go through the endpoints
    discovered from it (the token changes after a 401)."""
    device_config(server)
    with sf.Runtime(issuer=server, client_id=CLIENT) as runtime:
        sign_in = runtime.sign_in_device()
        assert wait_for(lambda: sign_in.prompt is not None)
        assert sign_in.prompt.verification_uri.startswith(server)
        assert call(f"{server}/__device/approve", {"user_code": sign_in.prompt.user_code})["ok"]
        sign_in.wait(10)
        assert runtime.state == sf.State.LOGGED_IN
        before = runtime.fresh_token()
        grants = call(f"{server}/__stats")["refresh_grants"]
        runtime.notify_unauthorized(before)
        assert wait_for(lambda: call(f"{server}/__stats")["refresh_grants"] == grants + 1)
        assert runtime.fresh_token() != before
