"""The calls and options the first version of the binding did not have: resume, reconfigure,
client_secret, the refresh schedule, refresh_cancel, store_key_source."""
import threading

import pytest

import sessionflow as sf
from helpers import call, oauth_server as start_oauth_server, wait_for



def test_resume_validates_the_session():
    events = []
    with sf.Runtime(refresher=lambda request, token: None) as rt:
        rt.sign_in("access-1", "refresh-1", 3600)
        rt.subscribe_events(events.append)
        rt.resume()
        assert wait_for(lambda: any(e.kind == sf.EventKind.VALIDATED for e in events))
    with pytest.raises(sf.ClosedError):
        rt.resume()


def test_reconfigure_forgets_an_expired_session_and_is_refused_otherwise():
    def refresher(request, refresh_token):
        request.fail(sf.ErrorCode.EAUTH)

    with sf.Runtime(refresher=refresher) as rt:
        with pytest.raises(sf.InvalidStateError):
            rt.reconfigure()  # LOGGED_OUT
        rt.sign_in("access-1", "refresh-1", 0, "member-1")
        with pytest.raises(sf.AuthError):
            rt.fresh_token()
        assert wait_for(lambda: rt.state == sf.State.SESSION_EXPIRED)
        assert rt.member_id() == "member-1"
        rt.reconfigure()
        assert rt.state == sf.State.LOGGED_OUT and rt.member_id() == ""


def test_min_backoff_sets_the_first_retry_delay():
    events = []

    def refresher(request, refresh_token):
        request.fail("SF_ENETWORK")

    with sf.Runtime(refresher=refresher, min_backoff_ms=4321, max_backoff_ms=60000) as rt:
        rt.subscribe_events(events.append)
        rt.sign_in("access-1", "refresh-1", 0)
        assert wait_for(lambda: any(e.kind == sf.EventKind.REFRESH_FAILED for e in events))
        failed = next(e for e in events if e.kind == sf.EventKind.REFRESH_FAILED)
        assert (failed.code, failed.attempt, failed.retry_in_ms) == (sf.ErrorCode.ENETWORK, 1, 4321)


@pytest.mark.parametrize("options", [
    {"refresh_margin_ms": -1},
    {"refresh_timeout_ms": 0},
    {"min_backoff_ms": 0},
    {"max_backoff_ms": 10},  # below the default min_backoff_ms (1000)
    {"min_refresh_interval_ms": -1},
    {"store_key_source": 99},
], ids=lambda options: next(iter(options)))
def test_each_schedule_and_store_option_reaches_the_library(options, tmp_path):
    # the library checks them: an unusable value is SF_EINVAL, a usable one creates
    with pytest.raises(sf.InvalidArgumentError):
        sf.Runtime(store_directory=str(tmp_path / "store"), **options)
    usable = {"refresh_margin_ms": 0, "refresh_timeout_ms": 1, "min_backoff_ms": 1, "max_backoff_ms": 1000,
              "min_refresh_interval_ms": 0, "store_key_source": sf.StoreKeySource.FILE}
    key = next(iter(options))
    sf.Runtime(store_directory=str(tmp_path / "store"), **{key: usable[key]}).destroy()


def test_a_file_store_key_source_keeps_its_key_beside_the_store(tmp_path):
    store = tmp_path / "store"
    with sf.Runtime(store_directory=store, store_key_source=sf.StoreKeySource.FILE) as rt:
        rt.sign_in("access-1", "refresh-1", 3600, "alice")
    assert (store / "session.sfstore.key").is_file()
    with sf.Runtime(store_directory=store, store_key_source=sf.StoreKeySource.FILE) as again:
        assert wait_for(lambda: again.is_logged_in()) and again.member_id() == "alice"


def test_refresh_cancel_gets_the_open_request_after_the_timeout():
    requests, cancels = [], []

    def refresher(request, refresh_token):
        requests.append(request)  # never answered by itself

    def cancel(request):
        cancels.append((request, threading.get_ident()))
        request.fail(sf.ErrorCode.ENETWORK)  # stopped: completed as usual

    with sf.Runtime(refresher=refresher, refresh_cancel=cancel, refresh_timeout_ms=150,
                    min_backoff_ms=60000, max_backoff_ms=60000) as rt:
        rt.sign_in("access-1", "refresh-1", 0)
        assert wait_for(lambda: cancels, timeout=5)
        # The cancel function appends before it fails the request: wait for that too (read at
        # once, the check can land between the two).
        assert wait_for(lambda: requests[0].completed, timeout=5)
        assert cancels[0][0] is requests[0]  # the same object
        assert cancels[0][1] != threading.get_ident()
    assert len(cancels) == 1


def test_refresh_cancel_needs_a_refresher():
    with pytest.raises(ValueError, match="refresh_cancel needs a refresher"):
        sf.Runtime(refresh_cancel=lambda request: None)


@pytest.fixture
def oauth_server():
    pytest.importorskip("authlib")
    with start_oauth_server() as url:
        yield url


def test_a_confidential_client_refreshes_with_its_secret_and_scope(oauth_server):
    client = {"client_id": "sessionflow-confidential", "client_secret": "s3cret"}
    tokens = call(f"{oauth_server}/oauth/token", dict(client, grant_type="password", username="alice",
                                                         password="correct horse", scope="profile"))
    with sf.Runtime(token_endpoint=f"{oauth_server}/oauth/token", scope="profile", **client) as rt:
        rt.sign_in(tokens["access_token"], tokens["refresh_token"], tokens["expires_in"], "alice")
        rt.notify_unauthorized(tokens["access_token"])  # refreshed through the server
        assert wait_for(lambda: rt.fresh_token() != tokens["access_token"])
        form = call(f"{oauth_server}/__last_request")["form"]
        assert form["grant_type"] == "refresh_token"
        assert form["client_secret"] == "s3cret" and form["scope"] == "profile"
    with sf.Runtime(token_endpoint=f"{oauth_server}/oauth/token", client_id="sessionflow-confidential",
                    client_secret="wrong") as rt:
        rt.sign_in("access-x", "refresh-x", 0, "alice")
        with pytest.raises(sf.SessionFlowError) as refused:
            rt.fresh_token()
        assert type(refused.value) is sf.ConfigError  # invalid_client: the authority refused the client
