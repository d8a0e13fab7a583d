"""Runtime.profile() (sf_session_account_profile) against the real test server: a device
sign-in through the issuer keeps issuer, client and scopes; a refresh whose answer names a
narrower scope replaces the granted one; another runtime on the same store reads the profile
back from the sealed record; sessions without a profile, and unknown accounts."""
import dataclasses

import pytest

import sessionflow as sf
from helpers import CLIENT, call, wait_for


def device_sign_in(runtime, server, scope):
    call(f"{server}/__device/config", {"reset": "1", "interval": "1", "expires_in": "60"})
    sign_in = runtime.sign_in_device(server, scope=scope)
    assert wait_for(lambda: sign_in.prompt is not None)
    assert call(f"{server}/__device/approve", {"user_code": sign_in.prompt.user_code})["ok"]
    sign_in.wait(20)


def store_runtime(server, store):
    return sf.Runtime(token_endpoint=f"{server}/oauth/token", client_id=CLIENT, store_directory=store)


@pytest.fixture
def as_asked(server):
    call(f"{server}/__resource/config", {"grant_scope": ""})
    yield server
    call(f"{server}/__resource/config", {"grant_scope": ""})


def test_the_profile_of_a_sign_in_through_the_issuer_follows_a_refresh_and_is_stored(as_asked, tmp_path):
    server = as_asked
    store = str(tmp_path / "store")
    with store_runtime(server, store) as runtime:
        assert runtime.profile() is None  # no one signed in
        device_sign_in(runtime, server, "read write")
        profile = runtime.profile()
        assert profile == sf.Profile(issuer=server, client_id=CLIENT, requested_scope="read write",
                                     granted_scope="read write")
        assert profile.scopes == ["read", "write"]
        assert runtime.profile("alice") == profile
        with pytest.raises(dataclasses.FrozenInstanceError):
            profile.issuer = "https://elsewhere.example"  # type: ignore[misc]
        with pytest.raises(sf.InvalidArgumentError, match="nobody"):
            runtime.profile("nobody")
        # The active account named, then gone before its fields are read (another thread or
        # process logged it out): None, as for nobody signed in — not InvalidArgumentError.
        named = runtime.active_account
        runtime.active_account = lambda: "logged-out-meanwhile"  # type: ignore[method-assign]
        assert runtime.profile() is None
        runtime.active_account = named  # type: ignore[method-assign]

        # The server now grants only "read": the refresh's answer says so, the profile follows.
        call(f"{server}/__resource/config", {"grant_scope": "read"})
        before = call(f"{server}/__stats")["refresh_grants"]
        runtime.refresh_now()
        assert call(f"{server}/__stats")["refresh_grants"] == before + 1
        assert runtime.profile() == dataclasses.replace(profile, granted_scope="read")
        assert runtime.profile().scopes == ["read"]

    # Another runtime on the store: from the sealed record, the refresh's scope in it.
    with store_runtime(server, store) as again:
        assert wait_for(lambda: again.profile("alice") is not None)
        assert again.profile("alice") == sf.Profile(issuer=server, client_id=CLIENT, requested_scope="read write",
                                                    granted_scope="read")
        again.logout()
        with pytest.raises(sf.InvalidArgumentError):
            again.profile("alice")


def test_signed_in_with_tokens_there_is_no_profile():
    with sf.Runtime() as runtime:
        runtime.sign_in("access-profile", "refresh-profile", expires_in=600, member="m")
        assert runtime.profile() is None
        assert runtime.profile("m") is None
        with pytest.raises(sf.InvalidArgumentError):
            runtime.profile("someone-else")
    with pytest.raises(sf.ClosedError):
        runtime.profile()
