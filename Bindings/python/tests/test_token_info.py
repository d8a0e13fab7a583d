"""Runtime.token_info() (sf_session_token_info, sf_session_token_scope) against the real test
server: a device sign-in asking "read write" while the server grants only "read"
(POST /__resource/config grant_scope=read) reports "read"; a refresh keeps it; the expiry on
both clocks."""
import datetime

import pytest

import sessionflow as sf
from helpers import CLIENT, call, wait_for



@pytest.fixture
def narrow(server):
    """The server grants "read" whatever is asked, for one test."""
    call(f"{server}/__resource/config", {"grant_scope": "read"})
    yield server
    call(f"{server}/__resource/config", {"grant_scope": ""})


def device_sign_in(runtime, server, scope):
    call(f"{server}/__device/config", {"reset": "1", "interval": "1", "expires_in": "60"})
    sign_in = runtime.sign_in_device(server, scope=scope)
    assert wait_for(lambda: sign_in.prompt is not None)
    assert call(f"{server}/__device/approve", {"user_code": sign_in.prompt.user_code})["ok"]
    sign_in.wait(20)


def runtime_for(server):
    return sf.Runtime(token_endpoint=f"{server}/oauth/token", client_id=CLIENT)


def test_a_narrower_scope_is_reported_as_granted(narrow):
    server = narrow
    with runtime_for(server) as runtime:
        assert runtime.token_info() is None  # signed out: no access token
        device_sign_in(runtime, server, "read write")
        info = runtime.token_info()
        assert isinstance(info, sf.TokenInfo)
        assert info.token_type == "Bearer"
        assert info.scope == "read" and info.scopes == ["read"]
        assert 3500 * 1000 < info.expires_in_ms <= 3600 * 1000
        expected = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(milliseconds=info.expires_in_ms)
        assert abs((info.expires_at - expected).total_seconds()) < 5
        with pytest.raises(AttributeError):
            info.scope = "write"  # frozen
        # A refresh (its answer says "read" again) keeps it.
        before = call(f"{server}/__stats")["refresh_grants"]
        runtime.refresh_now()
        assert call(f"{server}/__stats")["refresh_grants"] == before + 1
        assert runtime.token_info().scope == "read"
        runtime.logout()
        assert runtime.token_info() is None


def test_the_scope_asked_for_when_granted_whole(server):
    with runtime_for(server) as runtime:
        device_sign_in(runtime, server, "read write")
        assert runtime.token_info().scope == "read write"


def test_signed_in_with_tokens_the_scope_is_not_known():
    with sf.Runtime() as runtime:
        runtime.sign_in("access-token-info", "refresh-token-info", expires_in=600, member="m")
        info = runtime.token_info()
        assert info.scope is None and info.scopes == []
        assert info.token_type == "Bearer"
        assert 590 * 1000 < info.expires_in_ms <= 600 * 1000
        assert info.expires_at > datetime.datetime.now(datetime.timezone.utc)
        assert "access-token-info" not in repr(info)
    with pytest.raises(sf.ClosedError):
        runtime.token_info()
