"""SessionFlow for Python, through ctypes over libsessionflow.so.

Callbacks run on the library's loop thread (a thread Python did not start); ctypes takes
the GIL for them. Keep a reference to every callback object for as long as the library
may call it: this module does that for you until the subscription's `release` runs.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import enum
import os
import threading
from typing import Callable, Optional

# ---- Loading -------------------------------------------------------------------------

def _load() -> ctypes.CDLL:
    path = os.environ.get("SESSIONFLOW_LIB") or ctypes.util.find_library("sessionflow")
    if not path:
        raise OSError("libsessionflow not found: set SESSIONFLOW_LIB to its path")
    return ctypes.CDLL(path)

_lib = _load()

# ---- Types ---------------------------------------------------------------------------

class State(enum.IntEnum):
    LOGGED_OUT = 0
    LOGGED_IN = 1
    SESSION_EXPIRED = 2


class EventKind(enum.IntEnum):
    INITIAL_SESSION = 1
    SIGNED_IN = 2
    SIGNED_OUT = 3
    TOKEN_REFRESHED = 4
    REFRESH_FAILED = 5
    SESSION_EXPIRED = 6
    VALIDATED = 7
    STORE_ERROR = 8
    ACCOUNT_SWITCHED = 9


class StoreStatus(enum.IntEnum):
    READING = 0
    AVAILABLE = 1
    UNAVAILABLE = 2


SF_OK = 0

_STATE_FN = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p)
_ERROR_FN = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_VOID_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_TOKEN_FN = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_REFRESH_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
_CANCEL_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
_STORE_FN = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


class _Observer(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("on_state", _STATE_FN),
        ("on_error", _ERROR_FN),
        ("on_complete", _VOID_FN),
        ("release", _VOID_FN),
        ("userdata", ctypes.c_void_p),
    ]


class _Event(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("kind", ctypes.c_int),
        ("state", ctypes.c_int),
        ("member_id", ctypes.c_char_p),
        ("reason", ctypes.c_char_p),
        ("code", ctypes.c_int),
        ("attempt", ctypes.c_int),
        ("retry_in_ms", ctypes.c_int64),
        ("expires_in_ms", ctypes.c_int64),
    ]


_EVENT_FN = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Event), ctypes.c_void_p)


class _EventObserver(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("on_event", _EVENT_FN),
        ("on_error", _ERROR_FN),
        ("on_complete", _VOID_FN),
        ("release", _VOID_FN),
        ("userdata", ctypes.c_void_p),
    ]


class _Tokens(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("access_token", ctypes.c_char_p),
        ("refresh_token", ctypes.c_char_p),
        ("expires_in", ctypes.c_int64),
        ("member_id", ctypes.c_char_p),
    ]


class _Options(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("refresh_margin_ms", ctypes.c_int64),
        ("refresh_timeout_ms", ctypes.c_int64),
        ("min_backoff_ms", ctypes.c_int64),
        ("max_backoff_ms", ctypes.c_int64),
        ("refresh", _REFRESH_FN),
        ("refresh_userdata", ctypes.c_void_p),
        ("min_refresh_interval_ms", ctypes.c_int64),
        ("token_endpoint", ctypes.c_char_p),
        ("client_id", ctypes.c_char_p),
        ("client_secret", ctypes.c_char_p),
        ("scope", ctypes.c_char_p),
        ("revocation_endpoint", ctypes.c_char_p),
        ("introspection_endpoint", ctypes.c_char_p),
        ("store_directory", ctypes.c_char_p),
        ("refresh_release", _VOID_FN),
        ("start_manually", ctypes.c_int),
        ("refresh_cancel", _CANCEL_FN),  # not offered by this binding yet: NULL
        # The store's key (sf_options_init writes the whole struct: every field must be here).
        ("store_key", ctypes.c_void_p),
        ("store_key_size", ctypes.c_size_t),
        ("store_key_file", ctypes.c_char_p),
        ("store_key_source", ctypes.c_int),
        ("issuer", ctypes.c_char_p),
    ]


class _SignInOptions(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("issuer", ctypes.c_char_p),
        ("device_authorization_endpoint", ctypes.c_char_p),
        ("authorization_endpoint", ctypes.c_char_p),
        ("scope", ctypes.c_char_p),
        ("timeout_ms", ctypes.c_int64),
        ("replace_unreadable_store", ctypes.c_int),
    ]


class _SignInPrompt(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("user_code", ctypes.c_char_p),
        ("verification_uri", ctypes.c_char_p),
        ("verification_uri_complete", ctypes.c_char_p),
        ("expires_in_ms", ctypes.c_int64),
        ("interval_ms", ctypes.c_int64),
        ("authorization_url", ctypes.c_char_p),
        ("redirect_uri", ctypes.c_char_p),
    ]


_PROMPT_FN = ctypes.CFUNCTYPE(None, ctypes.POINTER(_SignInPrompt), ctypes.c_void_p)
_DONE_FN = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


class _SignInObserver(ctypes.Structure):
    _fields_ = [
        ("on_prompt", _PROMPT_FN),
        ("on_done", _DONE_FN),
        ("release", _VOID_FN),
        ("userdata", ctypes.c_void_p),
    ]


class _StoreObserver(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("on_status", _STORE_FN),
        ("on_error", _ERROR_FN),
        ("on_complete", _VOID_FN),
        ("release", _VOID_FN),
        ("userdata", ctypes.c_void_p),
    ]


def _declare(name, restype, *argtypes):
    function = getattr(_lib, name)
    function.restype = restype
    function.argtypes = list(argtypes)
    return function


_strerror = _declare("sf_strerror", ctypes.c_char_p, ctypes.c_int)
_err_name = _declare("sf_err_name", ctypes.c_char_p, ctypes.c_int)
_version_string = _declare("sf_version_string", ctypes.c_char_p)
_options_init = _declare("sf_options_init", None, ctypes.POINTER(_Options))
_create = _declare("sf_runtime_create", ctypes.c_int, ctypes.POINTER(_Options), ctypes.POINTER(ctypes.c_void_p))
_destroy_report = _declare("sf_runtime_destroy_report", ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t))
_start = _declare("sf_runtime_start", ctypes.c_int, ctypes.c_void_p)
_state_get = _declare("sf_session_state_get", ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int))
_subscribe_state = _declare(
    "sf_subscribe_session_state", ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(_Observer), ctypes.POINTER(ctypes.c_uint64))
_subscribe_events = _declare(
    "sf_subscribe_events", ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(_EventObserver), ctypes.POINTER(ctypes.c_uint64))
_close = _declare("sf_subscription_close", ctypes.c_int, ctypes.c_uint64)
_store_status = _declare(
    "sf_session_store_status", ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int), ctypes.c_char_p, ctypes.c_size_t)
_subscribe_store_status = _declare(
    "sf_subscribe_store_status", ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(_StoreObserver), ctypes.POINTER(ctypes.c_uint64))
_sign_in = _declare("sf_session_sign_in", ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(_Tokens))
_sign_in_replacing_store = _declare(
    "sf_session_sign_in_replacing_store", ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(_Tokens))
_logout = _declare("sf_session_logout", ctypes.c_int, ctypes.c_void_p)
_notify_unauthorized = _declare("sf_session_notify_unauthorized", ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)
_is_logged_in = _declare("sf_session_is_logged_in", ctypes.c_int, ctypes.c_void_p)
_member_id = _declare("sf_session_member_id", ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t)
_fresh_token = _declare("sf_session_fresh_token", ctypes.c_int, ctypes.c_void_p, _TOKEN_FN, ctypes.c_void_p)
_accounts = _declare(
    "sf_session_accounts", ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t))
_active_account = _declare("sf_session_active_account", ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t)
_account_state = _declare(
    "sf_session_account_state", ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int))
_switch_account = _declare("sf_session_switch_account", ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)
_add_account = _declare("sf_session_add_account", ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(_Tokens))
_logout_account = _declare("sf_session_logout_account", ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)
_logout_all = _declare("sf_session_logout_all", ctypes.c_int, ctypes.c_void_p)
_sign_in_options_init = _declare("sf_sign_in_options_init", None, ctypes.POINTER(_SignInOptions))
_sign_in_device = _declare(
    "sf_session_sign_in_device", ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(_SignInOptions),
    ctypes.POINTER(_SignInObserver), ctypes.POINTER(ctypes.c_uint64))
_sign_in_browser = _declare(
    "sf_session_sign_in_browser", ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(_SignInOptions),
    ctypes.POINTER(_SignInObserver), ctypes.POINTER(ctypes.c_uint64))
_sign_in_cancel = _declare("sf_sign_in_cancel", ctypes.c_int, ctypes.c_uint64)
_succeed = _declare("sf_refresh_request_succeed", ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(_Tokens))
_fail = _declare("sf_refresh_request_fail", ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64)

ERRORS = {
    _err_name(code).decode(): code for code in range(-1, -64, -1) if _err_name(code).decode() != "SF_EUNKNOWN"
}


class SessionFlowError(Exception):
    """A negative SF_E* code, with its name and text."""

    def __init__(self, code: int, call: str, detail: Optional[str] = None):
        self.code = code
        self.name = _err_name(code).decode()
        self.detail = detail
        text = f"{call}: {self.name}: {_strerror(code).decode()}"
        super().__init__(f"{text} ({detail})" if detail else text)


def _check(code: int, call: str) -> int:
    if code < 0:
        raise SessionFlowError(code, call)
    return code


def version() -> str:
    return _version_string().decode()


def _tokens(access: str, refresh: Optional[str], expires_in: int, member: Optional[str]) -> _Tokens:
    return _Tokens(
        ctypes.sizeof(_Tokens), access.encode(), refresh.encode() if refresh else None, expires_in,
        member.encode() if member else None)


# ---- Subscriptions -------------------------------------------------------------------

# Callback objects kept alive until their subscription's `release` runs.
_alive: dict[int, object] = {}
_alive_lock = threading.Lock()
_next_key = 1


def _keep(thing) -> int:
    global _next_key
    with _alive_lock:
        key = _next_key
        _next_key += 1
        _alive[key] = thing
        return key


def _drop(key: int) -> None:
    with _alive_lock:
        _alive.pop(key, None)


class Subscription:
    """A subscription handle; `close()` from any thread, any number of times."""

    def __init__(self, handle: int):
        self.handle = handle

    def close(self) -> bool:
        """True the first time; False when already closed or completed."""
        return _close(self.handle) == SF_OK

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Event:
    def __init__(self, raw: _Event):
        self.kind = EventKind(raw.kind)
        self.state = State(raw.state)
        self.member_id = raw.member_id.decode() if raw.member_id else None
        self.reason = raw.reason.decode() if raw.reason else None
        self.code = raw.code
        self.attempt = raw.attempt
        self.retry_in_ms = raw.retry_in_ms
        self.expires_in_ms = raw.expires_in_ms

    def __repr__(self):
        return f"Event({self.kind.name}, member={self.member_id}, reason={self.reason})"


# ---- Sign-in flows -------------------------------------------------------------------

class SignInPrompt:
    """What the user is shown (sf_sign_in_prompt). Device flow: go to `verification_uri` and
    enter `user_code` (or open `verification_uri_complete`). Browser flow: open
    `authorization_url`; it comes back to `redirect_uri`. Fields not of the flow are None."""

    def __init__(self, raw: _SignInPrompt):
        def text(value):
            return value.decode() if value else None
        self.user_code = text(raw.user_code)
        self.verification_uri = text(raw.verification_uri)
        self.verification_uri_complete = text(raw.verification_uri_complete)
        self.expires_in_ms = raw.expires_in_ms
        self.interval_ms = raw.interval_ms
        self.authorization_url = text(raw.authorization_url)
        self.redirect_uri = text(raw.redirect_uri)

    def __repr__(self):
        if self.user_code is not None:
            return f"SignInPrompt(user_code={self.user_code!r}, verification_uri={self.verification_uri!r})"
        return f"SignInPrompt(authorization_url={self.authorization_url!r}, redirect_uri={self.redirect_uri!r})"


class SignIn:
    """A sign-in in progress. `cancel()` from any thread (also inside on_prompt); `wait()` for
    its outcome: None when signed in, SessionFlowError (SF_EDENIED, SF_EEXPIRED,
    SF_ECANCELLED, SF_ECONFIG...) otherwise, with the library's message as `detail`."""

    def __init__(self, call: str):
        self._call = call
        self._done = threading.Event()
        self.handle = 0
        self.result: Optional[int] = None
        self.message: Optional[str] = None
        self.prompt: Optional[SignInPrompt] = None

    def cancel(self) -> bool:
        """True the first time while it runs; False when cancelled already or finished."""
        return _sign_in_cancel(self.handle) == SF_OK

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: Optional[float] = None) -> None:
        """Waits for the outcome; raises SessionFlowError for a failure, TimeoutError if none came."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"{self._call}: no outcome within {timeout} s")
        if self.result != SF_OK:
            raise SessionFlowError(self.result, self._call, self.message)


# ---- Runtime -------------------------------------------------------------------------

class RefreshRequest:
    """A refresh the host performs; complete it once, from any thread."""

    def __init__(self, pointer: int):
        self._pointer = pointer

    def succeed(self, access: str, refresh: Optional[str], expires_in: int, member: Optional[str] = None) -> int:
        tokens = _tokens(access, refresh, expires_in, member)
        return _succeed(self._pointer, ctypes.byref(tokens))

    def fail(self, code: str, retry_after_ms: int = -1) -> int:
        return _fail(self._pointer, ERRORS[code], retry_after_ms)


class Runtime:
    """A session on the library's own loop thread."""

    def __init__(self, refresher: Optional[Callable[[RefreshRequest, str], None]] = None,
                 min_refresh_interval_ms: Optional[int] = None,
                 token_endpoint: Optional[str] = None, client_id: Optional[str] = None,
                 revocation_endpoint: Optional[str] = None, store_directory: Optional[str] = None,
                 introspection_endpoint: Optional[str] = None, scope: Optional[str] = None,
                 on_refresher_released: Optional[Callable[[], None]] = None,
                 start_manually: bool = False,
                 store_key: Optional[bytes] = None, store_key_file: Optional[str] = None,
                 issuer: Optional[str] = None):
        """`refresher` is called on the loop thread, never after destroy() returned;
        `on_refresher_released` runs once (on the loop thread, before destroy() returns)
        after its last call, when the library lets go of it (sf_options.refresh_release).
        `start_manually`: the session waits for start() before its start-up events, so
        subscribe to events first and miss none (sf_options.start_manually).
        `store_key` (32 bytes) or `store_key_file`: the file store's key from the host
        (sf_options.store_key / store_key_file; copied at create).
        `issuer` without `token_endpoint`: the built-in authority's endpoints come from the
        issuer's metadata, on first use (sf_options.issuer); sign-ins default to it."""
        options = _Options()
        _options_init(ctypes.byref(options))
        options.start_manually = 1 if start_manually else 0
        if min_refresh_interval_ms is not None:
            options.min_refresh_interval_ms = min_refresh_interval_ms
        # ctypes keeps these bytes alive with the struct; the library copies them.
        self._strings = [s.encode() if s else None for s in (token_endpoint, client_id, revocation_endpoint, store_directory,
                                                             introspection_endpoint, scope, issuer)]
        (options.token_endpoint, options.client_id, options.revocation_endpoint, options.store_directory,
         options.introspection_endpoint, options.scope, options.issuer) = self._strings
        key_buffer = ctypes.create_string_buffer(store_key, len(store_key)) if store_key is not None else None
        if key_buffer is not None:
            options.store_key = ctypes.cast(key_buffer, ctypes.c_void_p)
            options.store_key_size = len(store_key)
        self._key_file = store_key_file.encode() if store_key_file else None
        options.store_key_file = self._key_file
        refresher_key = None
        if refresher is not None:
            def trampoline(request, refresh_token, _userdata):
                refresher(RefreshRequest(request), refresh_token.decode())

            def release(_userdata):
                if on_refresher_released:
                    on_refresher_released()
                _drop(refresher_key)

            # Kept alive until the library releases them (refresh_release), not with `self`.
            callbacks = (_REFRESH_FN(trampoline), _VOID_FN(release))
            refresher_key = _keep(callbacks)
            options.refresh, options.refresh_release = callbacks
        self._pointer = ctypes.c_void_p()
        code = _create(ctypes.byref(options), ctypes.byref(self._pointer))
        if code < 0 and refresher_key is not None:
            _drop(refresher_key)  # a failed create takes no ownership: nothing will be called
        if key_buffer is not None:
            ctypes.memset(key_buffer, 0, len(store_key))  # copied by create: wipe ours
        _check(code, "sf_runtime_create")
        self._token_callbacks: dict[int, object] = {}

    # lifecycle
    def start(self) -> None:
        """Starts a session made with start_manually (a no-op otherwise)."""
        _check(_start(self._pointer), "sf_runtime_start")

    def destroy(self) -> int:
        """Destroys the runtime; returns how many subscriptions were never closed."""
        unclosed = ctypes.c_size_t()
        _check(_destroy_report(self._pointer, ctypes.byref(unclosed)), "sf_runtime_destroy")
        return unclosed.value

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            self.destroy()
        except SessionFlowError:
            pass

    # observing
    @property
    def state(self) -> State:
        out = ctypes.c_int()
        _check(_state_get(self._pointer, ctypes.byref(out)), "sf_session_state_get")
        return State(out.value)

    def subscribe_state(self, on_state: Callable[[State], None],
                        on_complete: Optional[Callable[[], None]] = None,
                        on_release: Optional[Callable[[], None]] = None) -> Subscription:
        key = None

        def state_cb(state, _):
            on_state(State(state))

        def error_cb(code, message, _):
            pass

        def complete_cb(_):
            if on_complete:
                on_complete()

        def release_cb(_):
            if on_release:
                on_release()
            _drop(key)

        callbacks = (_STATE_FN(state_cb), _ERROR_FN(error_cb), _VOID_FN(complete_cb), _VOID_FN(release_cb))
        key = _keep(callbacks)
        observer = _Observer(ctypes.sizeof(_Observer), *callbacks, None)
        handle = ctypes.c_uint64()
        code = _subscribe_state(self._pointer, ctypes.byref(observer), ctypes.byref(handle))
        if code < 0:
            _drop(key)  # a failed subscribe takes no ownership: nothing will be called
            raise SessionFlowError(code, "sf_subscribe_session_state")
        return Subscription(handle.value)

    def subscribe_events(self, on_event: Callable[[Event], None],
                         on_release: Optional[Callable[[], None]] = None) -> Subscription:
        key = None

        def event_cb(raw, _):
            on_event(Event(raw.contents))

        def error_cb(code, message, _):
            pass

        def complete_cb(_):
            pass

        def release_cb(_):
            if on_release:
                on_release()
            _drop(key)

        callbacks = (_EVENT_FN(event_cb), _ERROR_FN(error_cb), _VOID_FN(complete_cb), _VOID_FN(release_cb))
        key = _keep(callbacks)
        observer = _EventObserver(ctypes.sizeof(_EventObserver), *callbacks, None)
        handle = ctypes.c_uint64()
        code = _subscribe_events(self._pointer, ctypes.byref(observer), ctypes.byref(handle))
        if code < 0:
            _drop(key)
            raise SessionFlowError(code, "sf_subscribe_events")
        return Subscription(handle.value)

    @property
    def store_status(self) -> "tuple[StoreStatus, str]":
        """Whether the store has answered, and why not ("" unless UNAVAILABLE). With the state,
        tells "no session" (LOGGED_OUT, AVAILABLE) from "cannot read the session yet"."""
        out = ctypes.c_int()
        reason = ctypes.create_string_buffer(4096)
        _check(_store_status(self._pointer, ctypes.byref(out), reason, len(reason)), "sf_session_store_status")
        return StoreStatus(out.value), reason.value.decode(errors="replace")

    def subscribe_store_status(self, on_status: Callable[[StoreStatus, str], None],
                               on_release: Optional[Callable[[], None]] = None) -> Subscription:
        """The current store status first, then each change (on the loop thread)."""
        key = None

        def status_cb(status, reason, _):
            on_status(StoreStatus(status), (reason or b"").decode(errors="replace"))

        def error_cb(code, message, _):
            pass

        def complete_cb(_):
            pass

        def release_cb(_):
            if on_release:
                on_release()
            _drop(key)

        callbacks = (_STORE_FN(status_cb), _ERROR_FN(error_cb), _VOID_FN(complete_cb), _VOID_FN(release_cb))
        key = _keep(callbacks)
        observer = _StoreObserver(ctypes.sizeof(_StoreObserver), *callbacks, None)
        handle = ctypes.c_uint64()
        code = _subscribe_store_status(self._pointer, ctypes.byref(observer), ctypes.byref(handle))
        if code < 0:
            _drop(key)
            raise SessionFlowError(code, "sf_subscribe_store_status")
        return Subscription(handle.value)

    # session
    def sign_in(self, access: str, refresh: Optional[str], expires_in: int, member: Optional[str] = None,
                replacing_store: bool = False) -> None:
        """Signs in. While the store cannot be read (store_status UNAVAILABLE since the start),
        this raises SF_ESTORE unless replacing_store: the host's choice to replace it."""
        tokens = _tokens(access, refresh, expires_in, member)
        if replacing_store:
            _check(_sign_in_replacing_store(self._pointer, ctypes.byref(tokens)), "sf_session_sign_in_replacing_store")
        else:
            _check(_sign_in(self._pointer, ctypes.byref(tokens)), "sf_session_sign_in")

    def logout(self) -> None:
        _check(_logout(self._pointer), "sf_session_logout")

    def notify_unauthorized(self, access_token: str) -> None:
        """A request got 401 with `access_token`: refreshed if it is still the current one."""
        _check(_notify_unauthorized(self._pointer, access_token.encode()), "sf_session_notify_unauthorized")

    def is_logged_in(self) -> bool:
        return _check(_is_logged_in(self._pointer), "sf_session_is_logged_in") == 1

    def member_id(self) -> str:
        buffer = ctypes.create_string_buffer(256)
        _check(_member_id(self._pointer, buffer, len(buffer)), "sf_session_member_id")
        return buffer.value.decode()

    # several accounts (a store_directory keeps one record per account)
    def accounts(self) -> list[str]:
        """The account keys with a session, sorted."""
        needed = ctypes.c_size_t(0)
        while True:
            buffer = ctypes.create_string_buffer(max(needed.value, 1))
            code = _accounts(self._pointer, buffer, len(buffer), ctypes.byref(needed))
            if code == ERRORS["SF_ERANGE"]:
                continue  # the list grew meanwhile: `needed` has its new size
            _check(code, "sf_session_accounts")
            return [key.decode() for key in buffer.raw[:needed.value - 1].split(b"\0") if key]

    def active_account(self) -> str:
        """The active account's key ("" when none is signed in)."""
        buffer = ctypes.create_string_buffer(1024)
        _check(_active_account(self._pointer, buffer, len(buffer)), "sf_session_active_account")
        return buffer.value.decode()

    def account_state(self, account: str) -> State:
        out = ctypes.c_int(0)
        _check(_account_state(self._pointer, account.encode(), ctypes.byref(out)), "sf_session_account_state")
        return State(out.value)

    def switch_account(self, account: str) -> None:
        _check(_switch_account(self._pointer, account.encode()), "sf_session_switch_account")

    def add_account(self, access: str, refresh: Optional[str], expires_in: int, member: Optional[str] = None) -> None:
        """Signs in another account; the active one goes on in the background."""
        tokens = _tokens(access, refresh, expires_in, member)
        _check(_add_account(self._pointer, ctypes.byref(tokens)), "sf_session_add_account")

    def logout_account(self, account: str) -> None:
        _check(_logout_account(self._pointer, account.encode()), "sf_session_logout_account")

    def logout_all(self) -> None:
        _check(_logout_all(self._pointer), "sf_session_logout_all")

    def fresh_token(self, timeout: float = 10.0) -> str:
        """Waits for a usable access token (refreshed first if due)."""
        done = threading.Event()
        answer: dict = {}

        def token_cb(result, token, _):
            answer["result"] = result
            answer["token"] = token.decode() if token else None
            done.set()

        callback = _TOKEN_FN(token_cb)
        _check(_fresh_token(self._pointer, callback, None), "sf_session_fresh_token")
        if not done.wait(timeout):
            _keep(callback)  # the library may still call it: never free it
            raise TimeoutError("no token answer")
        _check(answer["result"], "sf_session_fresh_token (callback)")
        return answer["token"]

    # sign-in flows
    def sign_in_device(self, issuer: Optional[str] = None, *, scope: Optional[str] = None,
                       device_authorization_endpoint: Optional[str] = None,
                       on_prompt: Optional[Callable[[SignInPrompt], None]] = None,
                       replace_unreadable_store: bool = False) -> SignIn:
        """Starts the device authorization grant (RFC 8628): `on_prompt` (loop thread) gets the
        user code and the verification URI; the library polls until the user approves. With
        `issuer`, the endpoints come from its metadata (RFC 8414) and the client is the
        runtime's client_id; else from the runtime's token endpoint and
        `device_authorization_endpoint`. Raises SessionFlowError (SF_EINVAL, SF_ESTATE...) when
        it cannot start; the outcome comes through the returned SignIn."""
        return self._sign_in(_sign_in_device, "sf_session_sign_in_device", issuer, scope,
                             device_authorization_endpoint, None, None, on_prompt, replace_unreadable_store)

    def sign_in_browser(self, issuer: Optional[str] = None, *, scope: Optional[str] = None,
                        authorization_endpoint: Optional[str] = None, timeout_ms: Optional[int] = None,
                        on_prompt: Optional[Callable[[SignInPrompt], None]] = None,
                        replace_unreadable_store: bool = False) -> SignIn:
        """Starts the authorization code grant with PKCE on a loopback redirect: `on_prompt`
        (loop thread) gets the authorization URL to open in a browser and the redirect URI the
        library listens on. Gives up after `timeout_ms` (SF_EEXPIRED). As sign_in_device."""
        return self._sign_in(_sign_in_browser, "sf_session_sign_in_browser", issuer, scope,
                             None, authorization_endpoint, timeout_ms, on_prompt, replace_unreadable_store)

    def _sign_in(self, function, call, issuer, scope, device_endpoint, authorization_endpoint, timeout_ms,
                 on_prompt, replace_unreadable_store) -> SignIn:
        options = _SignInOptions()
        _sign_in_options_init(ctypes.byref(options))
        # The library copies the strings during the call.
        strings = [s.encode() if s else None for s in (issuer, device_endpoint, authorization_endpoint, scope)]
        options.issuer, options.device_authorization_endpoint, options.authorization_endpoint, options.scope = strings
        if timeout_ms is not None:
            options.timeout_ms = timeout_ms
        options.replace_unreadable_store = 1 if replace_unreadable_store else 0
        sign_in = SignIn(call)
        key = None

        def prompt_cb(raw, _):
            sign_in.prompt = SignInPrompt(raw.contents)
            if on_prompt:
                on_prompt(sign_in.prompt)

        def done_cb(result, message, _):
            sign_in.result = result
            sign_in.message = message.decode(errors="replace") if message else ""

        def release_cb(_):
            sign_in._done.set()  # after on_done: nothing of this sign-in follows
            _drop(key)

        callbacks = (_PROMPT_FN(prompt_cb), _DONE_FN(done_cb), _VOID_FN(release_cb))
        key = _keep(callbacks)
        observer = _SignInObserver(*callbacks, None)
        handle = ctypes.c_uint64()
        code = function(self._pointer, ctypes.byref(options), ctypes.byref(observer), ctypes.byref(handle))
        if code < 0:
            _drop(key)  # a failed start takes no ownership: nothing will be called
            raise SessionFlowError(code, call)
        sign_in.handle = handle.value
        return sign_in
