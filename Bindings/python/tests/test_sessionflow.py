"""The C API from Python through ctypes: a second, non-Swift host."""
import threading
import time

import pytest

import sessionflow as sf
from helpers import wait_for



@pytest.fixture
def runtime():
    rt = sf.Runtime()
    yield rt
    try:
        rt.destroy()
    except sf.SessionFlowError:
        pass


def test_version_is_reported():
    assert sf.version().count(".") == 2


def test_a_subscriber_gets_the_current_state_first_then_changes_on_another_thread(runtime):
    states, threads, released = [], set(), threading.Event()
    subscription = runtime.subscribe_state(
        lambda s: (states.append(s), threads.add(threading.get_ident())), on_release=released.set)
    assert wait_for(lambda: states == [sf.State.LOGGED_OUT])
    runtime.sign_in("access-1", "refresh-1", 3600, "member-9")
    assert wait_for(lambda: states[-1] == sf.State.LOGGED_IN)
    assert runtime.state == sf.State.LOGGED_IN
    assert threading.get_ident() not in threads and len(threads) == 1
    assert subscription.close() is True
    assert subscription.close() is False
    assert released.wait(5)
    runtime.logout()
    time.sleep(0.05)
    assert states == [sf.State.LOGGED_OUT, sf.State.LOGGED_IN]  # nothing after close


def test_events_carry_the_member_and_the_reason(runtime):
    events = []
    with runtime.subscribe_events(events.append):
        runtime.sign_in("access-1", "refresh-1", 3600, "member-3")
        runtime.logout()
        assert wait_for(lambda: any(e.kind == sf.EventKind.SIGNED_OUT for e in events))
    kinds = [e.kind for e in events if e.kind != sf.EventKind.INITIAL_SESSION]
    assert kinds == [sf.EventKind.SIGNED_IN, sf.EventKind.SIGNED_OUT]
    signed_in = next(e for e in events if e.kind == sf.EventKind.SIGNED_IN)
    assert signed_in.member_id == "member-3"


def test_with_start_manually_a_late_subscriber_still_gets_the_initial_session():
    rt = sf.Runtime(start_manually=True)
    try:
        time.sleep(0.05)  # the loop has long had its first turn
        events = []
        with rt.subscribe_events(events.append):
            time.sleep(0.02)
            assert events == []  # nothing before start()
            rt.start()
            assert wait_for(lambda: len(events) == 1)
            assert events[0].kind == sf.EventKind.INITIAL_SESSION
            rt.start()  # a second start does nothing
            time.sleep(0.02)
            assert len(events) == 1
    finally:
        rt.destroy()


def test_local_checks_and_member_id(runtime):
    assert runtime.is_logged_in() is False
    runtime.sign_in("access-1", "refresh-1", 3600, "member-1")
    assert runtime.is_logged_in() is True
    assert runtime.member_id() == "member-1"
    runtime.logout()
    assert runtime.member_id() == ""


def test_illegal_transitions_raise_estate(runtime):
    with pytest.raises(sf.SessionFlowError) as error:
        runtime.logout()
    assert error.value.name == "SF_ESTATE"
    runtime.sign_in("access-1", "refresh-1", 3600)
    with pytest.raises(sf.SessionFlowError) as error:
        runtime.sign_in("access-2", "refresh-2", 3600)
    assert error.value.name == "SF_ESTATE"


def test_a_python_refresher_serves_one_refresh_for_many_callers():
    requests = []

    def refresher(request, refresh_token):
        requests.append(refresh_token)
        # answered from another thread, later
        threading.Timer(0.05, lambda: request.succeed("access-2", "refresh-2", 3600)).start()

    rt = sf.Runtime(refresher=refresher)
    try:
        rt.sign_in("access-1", "refresh-1", 0)  # due at once
        tokens = []
        threads = [threading.Thread(target=lambda: tokens.append(rt.fresh_token())) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert tokens == ["access-2"] * 8
        assert requests == ["refresh-1"]
    finally:
        rt.destroy()


def test_a_terminal_refusal_expires_the_session():
    seen = []

    def refresher(request, refresh_token):
        request.fail("SF_EAUTH")
        with pytest.raises(sf.SessionFlowError) as twice:  # completed twice: raised, not returned
            request.fail("SF_EAUTH")
        assert twice.value.code == sf.ERRORS["SF_ECLOSED"] and twice.value.name == "SF_ECLOSED"
        seen.append(request)

    rt = sf.Runtime(refresher=refresher)
    try:
        rt.sign_in("access-1", "refresh-1", 0, "m")
        with pytest.raises(sf.SessionFlowError) as error:
            rt.fresh_token()
        assert error.value.name == "SF_EAUTH"
        assert wait_for(lambda: rt.state == sf.State.SESSION_EXPIRED)
        assert rt.member_id() == "m"
        assert len(seen) == 1 and seen[0].completed
    finally:
        rt.destroy()


def test_the_refresher_is_released_once_after_its_last_call():
    calls, releases, open_requests = [], [], []

    def refresher(request, refresh_token):
        assert not releases  # never called after its release
        calls.append(threading.get_ident())
        open_requests.append(request)  # never answered: still open at destroy

    rt = sf.Runtime(refresher=refresher, on_refresher_released=lambda: releases.append(threading.get_ident()))
    rt.sign_in("access-1", "refresh-1", 0)
    assert wait_for(lambda: calls)
    rt.destroy()
    assert len(releases) == 1 and releases[0] == calls[0]  # on the loop thread, before destroy returned
    with pytest.raises(sf.ClosedError) as late:  # closed by destroy: raised, not returned
        open_requests[0].succeed("late", None, 60)
    assert late.value.name == "SF_ECLOSED"
    time.sleep(0.1)
    assert len(calls) == 1 and len(releases) == 1


def test_a_failed_create_never_releases_the_refresher():
    releases = []
    with pytest.raises(sf.SessionFlowError):
        sf.Runtime(refresher=lambda request, token: None, token_endpoint=None, min_refresh_interval_ms=-1,
                   on_refresher_released=lambda: releases.append(1))
    time.sleep(0.05)
    assert releases == []


def test_destroy_completes_and_reports_subscriptions_never_closed():
    rt = sf.Runtime()
    completed, released = threading.Event(), threading.Event()
    rt.subscribe_state(lambda s: None, on_complete=completed.set, on_release=released.set)
    assert rt.destroy() == 1
    assert completed.is_set() and released.is_set()
    with pytest.raises(sf.SessionFlowError) as error:
        rt.destroy()
    assert error.value.name == "SF_ECLOSED"


# ---- The built-in OAuth 2.0 authority and the file store, configured through sf_options

import json
import os
import stat
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "Tests", "Fixtures", "oauth_server.py")


@pytest.fixture
def oauth_server():
    pytest.importorskip("authlib")
    process = subprocess.Popen([sys.executable, FIXTURE, "--expires-in", "1"],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    port = int(process.stdout.readline().split()[1])
    yield f"http://127.0.0.1:{port}"
    process.kill()
    process.wait()


def post(url, **form):
    data = urllib.parse.urlencode(form).encode()
    try:
        with urllib.request.urlopen(url, data) as response:
            return json.load(response)
    except urllib.error.HTTPError as error:
        return json.load(error)


def test_oauth_and_the_file_store_through_sf_options(oauth_server):
    tokens = post(f"{oauth_server}/oauth/token", grant_type="password", username="alice",
                  password="correct horse", client_id="sessionflow-public")
    with tempfile.TemporaryDirectory() as home:
        store = os.path.join(home, "store")
        rt = sf.Runtime(token_endpoint=f"{oauth_server}/oauth/token", client_id="sessionflow-public",
                        revocation_endpoint=f"{oauth_server}/oauth/revoke", store_directory=store,
                        min_refresh_interval_ms=100)
        try:
            rt.sign_in(tokens["access_token"], tokens["refresh_token"], tokens["expires_in"], "alice")
            time.sleep(1.2)  # the 1-second token expired: the library refreshes through the server
            fresh = rt.fresh_token()
            assert fresh != tokens["access_token"]
            # the old refresh token was rotated away
            assert post(f"{oauth_server}/oauth/token", grant_type="refresh_token",
                        refresh_token=tokens["refresh_token"], client_id="sessionflow-public")["error"] == "invalid_grant"
            # stored encrypted, owner-only
            assert stat.S_IMODE(os.stat(store).st_mode) == 0o700
            path = os.path.join(store, "session.sfstore")
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
            content = open(path, "rb").read()
            assert fresh.encode() not in content and b"alice" not in content
            rt.logout()
        finally:
            rt.destroy()
        # a new runtime on the same store starts logged out after that logout
        again = sf.Runtime(store_directory=store)
        try:
            assert again.state == sf.State.LOGGED_OUT
        finally:
            again.destroy()


def test_unusable_oauth_options_are_einval():
    with pytest.raises(sf.SessionFlowError) as error:
        sf.Runtime(token_endpoint="not a url", client_id="x")
    assert error.value.name == "SF_EINVAL"
    with pytest.raises(sf.SessionFlowError) as error:
        sf.Runtime(token_endpoint="http://127.0.0.1:9/token")  # no client id
    assert error.value.name == "SF_EINVAL"


def test_several_accounts_listed_switched_and_signed_out(tmp_path):
    store = str(tmp_path / "store")
    with sf.Runtime(store_directory=store) as runtime:
        assert runtime.accounts() == []
        runtime.sign_in("alice-access", "alice-refresh", 3600, "alice")
        runtime.add_account("bob-access", "bob-refresh", 3600, "bob")
        assert runtime.accounts() == ["alice", "bob"]
        assert runtime.active_account() == "bob"
        assert runtime.fresh_token() == "bob-access"
        runtime.switch_account("alice")
        assert runtime.member_id() == "alice"
        assert runtime.fresh_token() == "alice-access"
        assert runtime.account_state("bob") == sf.State.LOGGED_IN
        with pytest.raises(sf.SessionFlowError) as unknown:
            runtime.switch_account("carol")
        assert unknown.value.name == "SF_EINVAL"
        runtime.logout_account("bob")
        assert runtime.accounts() == ["alice"]
        assert runtime.is_logged_in()
    with sf.Runtime(store_directory=store) as again:
        assert again.accounts() == ["alice"]
        assert again.active_account() == "alice"
        again.logout_all()
        assert again.accounts() == []
def test_an_unreadable_store_is_visible_and_not_replaced_by_a_plain_sign_in():
    """Issue 14.5: LOGGED_OUT with the store UNAVAILABLE is not "signed out"; a sign-in is
    refused (SF_ESTORE) and changes nothing, unless the host replaces the store."""
    with tempfile.TemporaryDirectory() as home:
        store = os.path.join(home, "store")
        rt = sf.Runtime(store_directory=store)
        try:
            assert rt.store_status == (sf.StoreStatus.AVAILABLE, "")
            rt.sign_in("alice-access", "alice-refresh", 3600, "alice")
        finally:
            rt.destroy()
        key = os.path.join(store, "session.sfstore.key")
        path = os.path.join(store, "session.sfstore")
        before = open(path, "rb").read()
        os.chmod(key, 0o640)  # the store refuses a key open to its group, even for root
        rt = sf.Runtime(store_directory=store)
        try:
            assert rt.state == sf.State.LOGGED_OUT
            status, reason = rt.store_status
            assert status == sf.StoreStatus.UNAVAILABLE and key in reason
            seen = []
            with rt.subscribe_store_status(lambda s, r: seen.append((s, r))):
                deadline = time.time() + 5
                while not seen and time.time() < deadline:
                    time.sleep(0.01)
            assert seen and seen[0][0] == sf.StoreStatus.UNAVAILABLE
            with pytest.raises(sf.SessionFlowError) as error:
                rt.sign_in("bob-access", "bob-refresh", 3600, "bob")
            assert error.value.name == "SF_ESTORE"
            assert not rt.is_logged_in()
            rt.sign_in("bob-access", "bob-refresh", 3600, "bob", replacing_store=True)
            assert rt.is_logged_in() and rt.member_id() == "bob"
        finally:
            rt.destroy()
        assert open(path, "rb").read() == before  # the file store never wrote over it
def test_a_store_key_from_the_host_opens_the_store_and_another_key_does_not(tmp_path):
    store = str(tmp_path / "store")
    key = bytes(range(32))
    rt = sf.Runtime(store_directory=store, store_key=key)
    try:
        rt.sign_in("access-py", "refresh-py", 3600, "member-py")
    finally:
        rt.destroy()
    again = sf.Runtime(store_directory=store, store_key=key)
    try:
        assert wait_for(lambda: again.is_logged_in())
        assert again.member_id() == "member-py"
    finally:
        again.destroy()
    other = sf.Runtime(store_directory=store, store_key=bytes(32))
    try:
        time.sleep(0.3)
        assert not other.is_logged_in()
    finally:
        other.destroy()
    with pytest.raises(sf.SessionFlowError):
        sf.Runtime(store_directory=store, store_key=b"short")
