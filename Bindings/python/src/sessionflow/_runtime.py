"""Runtime, RefreshRequest and SignIn: the C API's objects, from Python.

Threading: every callback runs on the runtime's loop thread (a thread the library started;
ctypes takes the GIL for it), never inside the call that caused it. Calls are allowed from
any thread, callbacks included (but destroy(): SF_EBUSY there, and the blocking
fresh_token(): use a callback or fresh_token_async()). The C objects the library calls back
(the thunks) live as long as the module; what each callback needs is kept until the library
lets go of it (release), so there is nothing for the host to keep alive.
"""
from __future__ import annotations

import asyncio
import ctypes
import functools
import logging
import os
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple, TypeVar, Union, cast

from . import _ffi
from ._asyncio import (AsyncTokenEntry, Channel, EventPush, FlowIterator, StatePush, StatusPush,
                       running_loop)
from ._callbacks import (AUTHORIZE_THUNK, COMPLETE_THUNK, DONE_THUNK, ERROR_THUNK, EVENT_THUNK, PROMPT_THUNK,
                         REFRESH_THUNK, CANCEL_THUNK, LOG_THUNK, RELEASE_THUNK, STATE_THUNK, STATUS_THUNK, TOKEN_THUNK,
                         CallbackErrorHandler, Entry, ErrorSink, drop, inside_callback, keep)
from ._types import (Authorization, DPoP, Event, LogLevel, Profile, SignInPrompt, State, StoreKeySource, StoreStatus, Subscription,
                     TokenInfo)
from .errors import ErrorCode, SessionFlowError, check, code_of

_log = logging.getLogger("sessionflow")
F = TypeVar("F", bound=Callable[..., Any])
PathLike = Union[str, "os.PathLike[str]"]


def _bytes(value: Optional[PathLike]) -> Optional[bytes]:
    """An optional string (or path) for a C string field; "" counts as not set, as NULL."""
    if value is None:
        return None
    text = os.fspath(value)
    return text.encode() if text else None


def _tokens(access: str, refresh: Optional[str], expires_in: int, member: Optional[str]) -> _ffi.Tokens:
    return _ffi.Tokens(ctypes.sizeof(_ffi.Tokens), access.encode(), _bytes(refresh), int(expires_in), _bytes(member))


def _api(method: F) -> F:
    """A Runtime call: first raises a callback's exception kept since the last call (the
    policy in sessionflow._callbacks), unless it is made from inside a callback."""

    @functools.wraps(method)
    def call(self: "Runtime", *args: Any, **kwargs: Any) -> Any:
        self._sink.raise_pending()
        return method(self, *args, **kwargs)

    return cast(F, call)


# ---- The host's refresher ----------------------------------------------------------------

class RefreshRequest:
    """A refresh the host performs (sf_refresh_request): complete it once, from any thread,
    now or later, with succeed() or fail(). Both raise SessionFlowError when the library
    refuses (SF_EINVAL: bad tokens or code, the request stays open; SF_ECLOSED: completed
    already, or its session ended or its runtime was destroyed meanwhile)."""

    def __init__(self, pointer: int) -> None:
        self._pointer = pointer
        self._completed = False

    @property
    def completed(self) -> bool:
        """Whether succeed() or fail() has been accepted through this object."""
        return self._completed

    def succeed(self, access: str, refresh: Optional[str], expires_in: int, member: Optional[str] = None) -> None:
        """New tokens (refresh / member None: keep the old ones). expires_in in seconds."""
        tokens = _tokens(access, refresh, expires_in, member)
        check(int(_ffi.lib.sf_refresh_request_succeed(self._pointer, ctypes.byref(tokens))),
              "sf_refresh_request_succeed")
        self._completed = True

    def fail(self, code: Union[int, str], retry_after_ms: int = -1) -> None:
        """A failure: SF_EAUTH (terminal: the session expires), SF_ENETWORK (transient: retried
        after max(backoff, retry_after_ms)) or SF_ECONFIG. `code`: ErrorCode.EAUTH, -7,
        "SF_EAUTH" or "EAUTH"."""
        check(int(_ffi.lib.sf_refresh_request_fail(self._pointer, code_of(code), int(retry_after_ms))),
              "sf_refresh_request_fail")
        self._completed = True

    def __repr__(self) -> str:
        return f"RefreshRequest(0x{self._pointer:x}, completed={self._completed})"


Refresher = Callable[[RefreshRequest, str], None]
RefreshCanceller = Callable[[RefreshRequest], None]


class _LogEntry(Entry):
    def __init__(self, sink: ErrorSink, log: Callable[[LogLevel, str], None]) -> None:
        super().__init__(sink, "log")
        self.log = log

    def on_log(self, level: int, line: Optional[bytes]) -> None:
        self.log(LogLevel(level), _ffi.text(line))


class _RefresherEntry(Entry):
    def __init__(self, sink: ErrorSink, refresher: Optional[Refresher], cancel: Optional[RefreshCanceller],
                 released: Optional[Callable[[], None]]) -> None:
        super().__init__(sink, "refresher")
        self.refresher = refresher
        self.cancel = cancel
        self.released = released
        self.open: Dict[int, RefreshRequest] = {}  # for refresh_cancel: the same object again

    def on_refresh(self, request: int, refresh_token: Optional[bytes]) -> None:
        for pointer in [p for p, r in self.open.items() if r.completed]:
            del self.open[pointer]
        wrapped = RefreshRequest(request)
        self.open[request] = wrapped
        if self.refresher is None:
            return
        try:
            self.refresher(wrapped, _ffi.text(refresh_token))
        except BaseException:
            # A refresher that raises before answering fails its request as transient
            # (retried with backoff) rather than leaving it to time out; then the policy.
            if not wrapped.completed:
                try:
                    wrapped.fail(ErrorCode.ENETWORK)
                except SessionFlowError:
                    pass
            raise

    def on_cancel(self, request: int) -> None:
        if self.cancel is not None:
            self.cancel(self.open.get(request) or RefreshRequest(request))

    def on_release(self) -> None:
        self.open.clear()
        if self.released is not None:
            self.released()


# ---- Subscriptions -----------------------------------------------------------------------

ErrorCallback = Callable[[SessionFlowError], None]


class _ObserverEntry(Entry):
    def __init__(self, sink: ErrorSink, where: str, on_error: Optional[ErrorCallback],
                 on_complete: Optional[Callable[[], None]], on_release: Optional[Callable[[], None]]) -> None:
        super().__init__(sink, where)
        self.error_callback = on_error
        self.complete_callback = on_complete
        self.release_callback = on_release

    def on_error(self, code: int, message: Optional[bytes]) -> None:
        error = SessionFlowError.from_code(code, f"{self.where} (on_error)", _ffi.text(message) or None)
        if self.error_callback is not None:
            self.error_callback(error)
        else:  # a terminal error with no one to take it: at least said
            _log.error("a %s subscription ended with an error: %s", self.where, error)

    def on_complete(self) -> None:
        if self.complete_callback is not None:
            self.complete_callback()

    def on_release(self) -> None:
        if self.release_callback is not None:
            self.release_callback()


class _StateEntry(_ObserverEntry):
    def __init__(self, on_state: Callable[[State], None], *args: Any) -> None:
        super().__init__(*args)
        self.callback = on_state

    def on_state(self, state: int) -> None:
        self.callback(State(state))


class _EventEntry(_ObserverEntry):
    def __init__(self, on_event: Callable[[Event], None], *args: Any) -> None:
        super().__init__(*args)
        self.callback = on_event

    def on_event(self, raw: Any) -> None:
        self.callback(Event._from_raw(raw.contents))


class _StatusEntry(_ObserverEntry):
    def __init__(self, on_status: Callable[[StoreStatus, str], None], *args: Any) -> None:
        super().__init__(*args)
        self.callback = on_status

    def on_status(self, status: int, reason: Optional[bytes]) -> None:
        self.callback(StoreStatus(status), _ffi.text(reason))


class _TokenEntry(Entry):
    def __init__(self, sink: ErrorSink) -> None:
        super().__init__(sink, "fresh_token")
        self.done = threading.Event()
        self.result = 0
        self.token = ""
        self.detail: Optional[str] = None

    def on_token(self, result: int, token: Optional[bytes], detail: Optional[str] = None) -> None:
        self.result, self.token, self.detail = result, _ffi.text(token), detail
        self.done.set()


def _c_text(text: str, what: str) -> bytes:
    """A str for a C string argument: a NUL inside would cut it short without a word."""
    if "\0" in text:
        raise SessionFlowError.from_code(ErrorCode.EINVAL, None, f"{what} holds a NUL character")
    return text.encode()


def _refusal(authorization: Authorization, status: int, www_authenticate: Optional[str]) -> Tuple[Any, ...]:
    """sf_session_unauthorized's arguments between the runtime and the callback: method, url,
    refused, http_status, www_authenticate (the library reads 8 KiB of it; a NUL ends it)."""
    challenge = www_authenticate.replace("\0", " ").encode("utf-8", errors="replace") \
        if www_authenticate is not None else None
    return (_c_text(authorization.method, "method"), _c_text(authorization.url, "url"),
            _c_text(authorization.value, "the refused authorization"), int(status), challenge)


class _AuthorizeEntry(Entry):
    """One sf_session_authorize / sf_session_unauthorized answer: waited for on the caller's
    thread, or (with an asyncio loop) resolved on that loop."""

    def __init__(self, sink: ErrorSink, call: str, method: str, url: str,
                 loop: Optional[asyncio.AbstractEventLoop] = None) -> None:
        super().__init__(sink, call.replace("sf_session_", ""))
        self.call, self.method, self.url = call, method, url
        self.done = threading.Event()
        self.result = 0
        self.authorization: Optional[Authorization] = None
        self.detail: Optional[str] = None
        self.loop = loop
        self.future: "Optional[asyncio.Future[Authorization]]" = loop.create_future() if loop else None

    def on_authorized(self, result: int, raw: Any, detail: Optional[str] = None) -> None:
        if result == 0 and raw:
            self.authorization = Authorization._from_raw(self.method, self.url, raw.contents)
        self.result, self.detail = result, detail
        self.done.set()
        if self.loop is not None:
            try:
                self.loop.call_soon_threadsafe(self._resolve)
            except RuntimeError:
                pass  # the event loop is closed: no one awaits it

    def _answer(self) -> Authorization:
        # Not check(): sf_last_error_message is of this thread's calls; the answer's reason came
        # with it (read on the loop thread, in the callback).
        if self.result < 0:
            raise SessionFlowError.from_code(self.result, f"{self.call} (answer)", self.detail)
        if self.authorization is None:  # never: SF_OK always comes with one
            raise SessionFlowError.from_code(ErrorCode.EINVAL, f"{self.call} (answer)", "no authorization")
        return self.authorization

    def _resolve(self) -> None:
        if self.future is None or self.future.done():  # the awaiting task was cancelled
            return
        try:
            self.future.set_result(self._answer())
        except SessionFlowError as error:
            self.future.set_exception(error)

    def wait(self, key: int, code: int, timeout: float) -> Authorization:
        if code < 0:
            drop(key)
            check(code, self.call)  # raises, with what the library said
        if not self.done.wait(timeout):
            raise TimeoutError(f"{self.call}: no answer within {timeout} s")
        return self._answer()

    async def wait_async(self, key: int, code: int) -> Authorization:
        if code < 0:
            drop(key)
            check(code, self.call)  # raises, with what the library said
        assert self.future is not None
        return await self.future


# ---- Sign-in flows -----------------------------------------------------------------------

class SignIn:
    """A sign-in in progress. cancel() from any thread (also inside on_prompt); wait() for its
    outcome: returns when signed in, raises SessionFlowError (SignInDeniedError,
    SignInExpiredError, SignInCancelledError, ConfigError...) with the library's message as
    `detail` otherwise."""

    def __init__(self, call: str) -> None:
        self._call = call
        self._done = threading.Event()
        self.handle = 0
        self.result: Optional[int] = None
        self.message: Optional[str] = None
        self.prompt: Optional[SignInPrompt] = None

    def cancel(self) -> bool:
        """sf_sign_in_cancel: True the first time while it runs; False when cancelled already or
        finished (SF_ECLOSED, its one other answer). on_done still follows, on the loop thread."""
        return int(_ffi.lib.sf_sign_in_cancel(self.handle)) == 0

    @property
    def done(self) -> bool:
        """Whether the outcome is in (on_done and release have run)."""
        return self._done.is_set()

    def wait(self, timeout: Optional[float] = None) -> None:
        """Waits for the outcome; raises SessionFlowError for a failure, TimeoutError if none came."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"{self._call}: no outcome within {timeout} s")
        if self.result is None or self.result < 0:
            raise SessionFlowError.from_code(self.result or int(ErrorCode.ESHUTDOWN), self._call, self.message)

    def __repr__(self) -> str:
        return f"SignIn({self._call}, handle={self.handle}, done={self.done}, result={self.result})"


class _SignInEntry(Entry):
    def __init__(self, sink: ErrorSink, sign_in: SignIn, on_prompt: Optional[Callable[[SignInPrompt], None]]) -> None:
        super().__init__(sink, f"{sign_in._call}")
        self.sign_in = sign_in
        self.prompt_callback = on_prompt

    def on_prompt(self, raw: Any) -> None:
        prompt = SignInPrompt._from_raw(raw.contents)
        self.sign_in.prompt = prompt
        if self.prompt_callback is not None:
            self.prompt_callback(prompt)

    def on_done(self, result: int, message: Optional[bytes]) -> None:
        self.sign_in.result = result
        self.sign_in.message = _ffi.text(message)

    def on_release(self) -> None:
        self.sign_in._done.set()  # after on_done: nothing of this sign-in follows


# ---- Runtime -----------------------------------------------------------------------------

class Runtime:
    """A session on the library's own loop thread (sf_runtime_create): one loop, one session.

    Destroy it with destroy(), or use it as a context manager. Every call raises
    SessionFlowError for an SF_E* code; a callback's exception kept by the callback-error
    policy is raised (as CallbackError) from the next call, before that call does anything."""

    def __init__(
        self,
        refresher: Optional[Refresher] = None,
        min_refresh_interval_ms: Optional[int] = None,
        token_endpoint: Optional[str] = None,
        client_id: Optional[str] = None,
        revocation_endpoint: Optional[str] = None,
        store_directory: Optional[PathLike] = None,
        introspection_endpoint: Optional[str] = None,
        scope: Optional[str] = None,
        on_refresher_released: Optional[Callable[[], None]] = None,
        start_manually: bool = False,
        store_key: Optional[bytes] = None,
        store_key_file: Optional[PathLike] = None,
        issuer: Optional[str] = None,
        *,
        client_secret: Optional[str] = None,
        refresh_margin_ms: Optional[int] = None,
        refresh_timeout_ms: Optional[int] = None,
        min_backoff_ms: Optional[int] = None,
        max_backoff_ms: Optional[int] = None,
        refresh_cancel: Optional[RefreshCanceller] = None,
        store_key_source: Optional[Union[StoreKeySource, int]] = None,
        on_callback_error: Optional[CallbackErrorHandler] = None,
        log: Optional[Callable[[LogLevel, str], None]] = None,
        log_level: Union[LogLevel, int] = LogLevel.INFO,
        dpop: Union[DPoP, int] = DPoP.OFF,
    ) -> None:
        """Creates the runtime (sf_runtime_create); every argument is an sf_options field,
        None keeping the library's default:

        refresher(request, refresh_token): the host's refresher, on the loop thread; complete
            `request` once (RefreshRequest.succeed/fail), from any thread. If it raises before
            completing it, the request fails as SF_ENETWORK (retried) and the exception goes
            through the callback-error policy.
        refresh_cancel(request): asked to stop a refresh still open at refresh_timeout_ms
            (then complete it as usual); needs `refresher`.
        on_refresher_released(): once, on the loop thread, before destroy() returns, after
            the refresher's last call (sf_options.refresh_release).
        token_endpoint, client_id, client_secret, scope, revocation_endpoint,
        introspection_endpoint, issuer: the built-in OAuth 2.0 authority (issuer alone: its
            endpoints are discovered; sign-ins default to it).
        store_directory: the encrypted file store (None: the session lives in memory);
            store_key (32 bytes, copied at create and wiped here), store_key_file or
            store_key_source (StoreKeySource): where its key comes from.
        refresh_margin_ms, refresh_timeout_ms, min_backoff_ms, max_backoff_ms,
        min_refresh_interval_ms: the refresh schedule (see sessionflow.h, sf_options).
        start_manually: the session waits for start() before its start-up events, so
            subscribe to events first and miss none.
        on_callback_error(exception): the callback-error policy's handler (on the loop thread);
            None: logged and raised from the runtime's next call (see the README).
        log(level, line): where the library's log lines go (sf_options.log), those at
            log_level (LogLevel) or above; from whichever thread logs, one at a time, never
            after destroy() returned; never a token. None: standard error, warnings and above.
            An exception it raises goes through the callback-error policy.
        dpop (DPoP): sender-constrained tokens (DPoP, RFC 9449) for the built-in client's
            sign-ins: OFF (bearer), REQUIRED, IF_SUPPORTED (when the issuer lists ES256).
            authorize() then answers `Authorization: DPoP` and a `DPoP` proof header; the
            adapters add whatever headers it gives, unchanged.
        """
        if refresh_cancel is not None and refresher is None:
            raise ValueError("refresh_cancel needs a refresher: it cancels the refresher's requests")
        self._sink = ErrorSink(on_callback_error)
        self._destroyed = False
        buffer = _ffi.OptionsBuffer()
        _ffi.lib.sf_options_init(ctypes.byref(buffer))
        options = buffer.options
        options.size = ctypes.sizeof(_ffi.Options)  # this binding's layout (see OptionsBuffer)
        # The longest the library may take to answer a token request: waiting for another
        # process's refresh lease (six refresh timeouts), then the refresh whose answer is
        # arriving (four) and its guard (one), and a margin. The calls that wait wait this long
        # by default: a slow refresh answers with the session's error, never a TimeoutError.
        self._answer_wait = 12 * (refresh_timeout_ms if refresh_timeout_ms is not None else 30_000) / 1000 + 10
        for field, value in (("refresh_margin_ms", refresh_margin_ms), ("refresh_timeout_ms", refresh_timeout_ms),
                             ("min_backoff_ms", min_backoff_ms), ("max_backoff_ms", max_backoff_ms),
                             ("min_refresh_interval_ms", min_refresh_interval_ms)):
            if value is not None:
                setattr(options, field, int(value))
        # The library copies every string during sf_runtime_create; ctypes keeps these bytes
        # alive with `buffer` until then.
        for field, text in (("token_endpoint", token_endpoint), ("client_id", client_id),
                            ("client_secret", client_secret), ("scope", scope),
                            ("revocation_endpoint", revocation_endpoint),
                            ("introspection_endpoint", introspection_endpoint),
                            ("store_directory", store_directory), ("store_key_file", store_key_file),
                            ("issuer", issuer)):
            setattr(options, field, _bytes(text))
        options.start_manually = 1 if start_manually else 0
        if store_key_source is not None:
            options.store_key_source = int(store_key_source)
        key_buffer = None
        if store_key is not None:
            key_buffer = ctypes.create_string_buffer(bytes(store_key), len(store_key))
            options.store_key = ctypes.cast(key_buffer, ctypes.c_void_p)
            options.store_key_size = len(store_key)
        self._log_key: Optional[int] = None
        if log is not None:
            self._log_key = keep(_LogEntry(self._sink, log))
            options.log = LOG_THUNK
            options.log_userdata = self._log_key
        options.log_level = int(log_level)
        options.dpop = int(dpop)
        refresher_key: Optional[int] = None
        if refresher is not None or on_refresher_released is not None:
            refresher_key = keep(_RefresherEntry(self._sink, refresher, refresh_cancel, on_refresher_released))
            options.refresh_userdata = refresher_key
            options.refresh_release = RELEASE_THUNK
            if refresher is not None:
                options.refresh = REFRESH_THUNK
            if refresh_cancel is not None:
                options.refresh_cancel = CANCEL_THUNK
        self._pointer = ctypes.c_void_p()
        try:
            code = int(_ffi.lib.sf_runtime_create(ctypes.byref(buffer), ctypes.byref(self._pointer)))
        finally:
            if key_buffer is not None:
                ctypes.memset(key_buffer, 0, len(key_buffer))  # copied by create: wipe ours
        if code < 0:
            drop(refresher_key)  # a failed create takes no ownership: nothing will be called
            drop(self._log_key)  # (its reason was logged before it returned)
            self._destroyed = True
        check(code, "sf_runtime_create")

    def __repr__(self) -> str:
        return f"<sessionflow.Runtime 0x{self._pointer.value or 0:x}{' destroyed' if self._destroyed else ''}>"

    # ---- lifecycle

    @_api
    def start(self) -> None:
        """Starts a session made with start_manually (a no-op otherwise)."""
        check(int(_ffi.lib.sf_runtime_start(self._pointer)), "sf_runtime_start")

    def destroy(self) -> int:
        """Destroys the runtime (sf_runtime_destroy_report); returns how many subscriptions were
        never closed. Every open subscription completes, pending token requests are answered
        SF_ESHUTDOWN, running sign-ins end, the refresher is released: all before it returns.
        Then raises a callback's exception kept by the policy (CallbackError), if any — also
        one raised during this teardown. Not on the loop thread (SF_EBUSY)."""
        unclosed = ctypes.c_size_t()
        code = int(_ffi.lib.sf_runtime_destroy_report(self._pointer, ctypes.byref(unclosed)))
        if code >= 0:
            self._destroyed = True
            drop(self._log_key)  # nothing is logged after the teardown
        self._sink.raise_pending()
        check(code, "sf_runtime_destroy_report")
        return int(unclosed.value)

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, exc_type: Optional[type], exc: Optional[BaseException], tb: Any) -> None:
        """destroy(), unless destroyed already. If the block raised, its exception goes on and a
        pending callback exception (logged already) is not raised over it."""
        if self._destroyed:
            if exc_type is None:
                self._sink.raise_pending()
            return
        try:
            self.destroy()
        except BaseException:
            if exc_type is None:
                raise

    # ---- observing

    @property
    @_api
    def state(self) -> State:
        """The current state (sf_session_state_get), point in time."""
        out = ctypes.c_int()
        check(int(_ffi.lib.sf_session_state_get(self._pointer, ctypes.byref(out))), "sf_session_state_get")
        return State(out.value)

    def _subscribe(self, call: str, function: Any, struct: Any, main_thunk: Any, entry: Entry) -> Subscription:
        key = keep(entry)
        observer = struct(ctypes.sizeof(struct), main_thunk, ERROR_THUNK, COMPLETE_THUNK, RELEASE_THUNK, key)
        handle = ctypes.c_uint64()
        code = int(function(self._pointer, ctypes.byref(observer), ctypes.byref(handle)))
        if code < 0:
            drop(key)  # a failed subscribe takes no ownership: nothing will be called
            raise SessionFlowError.from_code(code, call)
        return Subscription(handle.value)

    @_api
    def subscribe_state(self, on_state: Callable[[State], None],
                        on_complete: Optional[Callable[[], None]] = None,
                        on_release: Optional[Callable[[], None]] = None,
                        *, on_error: Optional[ErrorCallback] = None) -> Subscription:
        """sf_subscribe_session_state: on_state gets the current state first, then each change
        (conflated: a slow observer skips intermediate states, always ends on the latest).
        on_complete: the runtime was destroyed; on_error: a terminal error (logged if None);
        on_release: the subscription's last call. All on the loop thread."""
        entry = _StateEntry(on_state, self._sink, "subscribe_state", on_error, on_complete, on_release)
        return self._subscribe("sf_subscribe_session_state", _ffi.lib.sf_subscribe_session_state, _ffi.Observer,
                               STATE_THUNK, entry)

    @_api
    def subscribe_events(self, on_event: Callable[[Event], None],
                         on_release: Optional[Callable[[], None]] = None,
                         *, on_error: Optional[ErrorCallback] = None,
                         on_complete: Optional[Callable[[], None]] = None) -> Subscription:
        """sf_subscribe_events: the events after this call, in order, on the loop thread."""
        entry = _EventEntry(on_event, self._sink, "subscribe_events", on_error, on_complete, on_release)
        return self._subscribe("sf_subscribe_events", _ffi.lib.sf_subscribe_events, _ffi.EventObserver,
                               EVENT_THUNK, entry)

    @property
    @_api
    def store_status(self) -> Tuple[StoreStatus, str]:
        """sf_session_store_status: whether the store has answered, and why not ("" unless
        UNAVAILABLE). With the state, tells "no session" (LOGGED_OUT, AVAILABLE) from "cannot
        read the session yet"."""
        out = ctypes.c_int()
        size = 1024
        while True:
            reason = ctypes.create_string_buffer(size)
            code = int(_ffi.lib.sf_session_store_status(self._pointer, ctypes.byref(out), reason, size))
            if code == ErrorCode.ERANGE and size < (1 << 24):
                size *= 4
                continue
            check(code, "sf_session_store_status")
            return StoreStatus(out.value), _ffi.text(reason.value)

    @_api
    def subscribe_store_status(self, on_status: Callable[[StoreStatus, str], None],
                               on_release: Optional[Callable[[], None]] = None,
                               *, on_error: Optional[ErrorCallback] = None,
                               on_complete: Optional[Callable[[], None]] = None) -> Subscription:
        """sf_subscribe_store_status: the current store status first, then each change."""
        entry = _StatusEntry(on_status, self._sink, "subscribe_store_status", on_error, on_complete, on_release)
        return self._subscribe("sf_subscribe_store_status", _ffi.lib.sf_subscribe_store_status, _ffi.StoreObserver,
                               STATUS_THUNK, entry)

    # ---- the asyncio bridge

    @_api
    def states(self) -> FlowIterator[State]:
        """`async for state in runtime.states()`: the current state, then each change,
        conflated (a slow consumer skips intermediate states but always ends on the latest,
        never the same state twice in a row). Ends when the runtime is destroyed. Call it in a
        coroutine; see sessionflow._asyncio for when the subscription is closed."""
        channel = Channel(running_loop("states"), conflate=True)
        subscription = self._subscribe("sf_subscribe_session_state", _ffi.lib.sf_subscribe_session_state,
                                       _ffi.Observer, STATE_THUNK, StatePush(self._sink, "states()", channel))
        return FlowIterator(subscription, channel, self._sink, distinct=True)

    @_api
    def events(self) -> FlowIterator[Event]:
        """`async for event in runtime.events()`: every event after this call, in order."""
        channel = Channel(running_loop("events"), conflate=False)
        subscription = self._subscribe("sf_subscribe_events", _ffi.lib.sf_subscribe_events, _ffi.EventObserver,
                                       EVENT_THUNK, EventPush(self._sink, "events()", channel))
        return FlowIterator(subscription, channel, self._sink, distinct=False)

    @_api
    def store_statuses(self) -> FlowIterator[Tuple[StoreStatus, str]]:
        """`async for status, reason in runtime.store_statuses()`: conflated, as states()."""
        channel = Channel(running_loop("store_statuses"), conflate=True)
        subscription = self._subscribe("sf_subscribe_store_status", _ffi.lib.sf_subscribe_store_status,
                                       _ffi.StoreObserver, STATUS_THUNK,
                                       StatusPush(self._sink, "store_statuses()", channel))
        return FlowIterator(subscription, channel, self._sink, distinct=True)

    async def fresh_token_async(self) -> str:
        """`await runtime.fresh_token_async()`: a usable access token (refreshed first if due),
        without blocking the event loop. Raises SessionFlowError (NotLoggedInError, AuthError,
        NetworkError, ConfigError, SessionEndedError, ShutdownError...). Cancelling the await
        abandons the answer (the request itself still runs)."""
        self._sink.raise_pending()
        loop = asyncio.get_running_loop()
        future: "asyncio.Future[str]" = loop.create_future()
        key = keep(AsyncTokenEntry(self._sink, loop, future))
        code = int(_ffi.lib.sf_session_fresh_token(self._pointer, TOKEN_THUNK, key))
        if code < 0:
            drop(key)
            raise SessionFlowError.from_code(code, "sf_session_fresh_token")
        return await future

    # ---- session

    @_api
    def sign_in(self, access: str, refresh: Optional[str], expires_in: int, member: Optional[str] = None,
                replacing_store: bool = False, dpop_key: Optional[str] = None) -> None:
        """Signs in (sf_session_sign_in; expires_in in seconds). While the store cannot be read
        (store_status UNAVAILABLE since the start) this raises StoreError (SF_ESTORE) unless
        replacing_store (sf_session_sign_in_replacing_store): the host's choice to replace it.
        dpop_key (sf_session_sign_in_dpop; not with replacing_store): the DPoP key the tokens
        are bound to, base64url of a P-256 private key's 32 bytes, for a host that signed in
        with DPoP itself. Waits for the loop: from a coroutine, await
        asyncio.to_thread(runtime.sign_in, ...)."""
        tokens = _tokens(access, refresh, expires_in, member)
        if dpop_key is not None:
            if replacing_store:
                raise ValueError("dpop_key and replacing_store: sf_session_sign_in_dpop does not replace a store")
            check(int(_ffi.lib.sf_session_sign_in_dpop(self._pointer, ctypes.byref(tokens), _c_text(dpop_key, "dpop_key"))),
                  "sf_session_sign_in_dpop")
        elif replacing_store:
            check(int(_ffi.lib.sf_session_sign_in_replacing_store(self._pointer, ctypes.byref(tokens))),
                  "sf_session_sign_in_replacing_store")
        else:
            check(int(_ffi.lib.sf_session_sign_in(self._pointer, ctypes.byref(tokens))), "sf_session_sign_in")

    @_api
    def logout(self) -> None:
        """sf_session_logout: the store cleared, timers stopped, tokens revoked best effort."""
        check(int(_ffi.lib.sf_session_logout(self._pointer)), "sf_session_logout")

    @_api
    def reconfigure(self) -> None:
        """sf_session_reconfigure: SESSION_EXPIRED -> LOGGED_OUT, forgetting the member id
        (InvalidStateError otherwise)."""
        check(int(_ffi.lib.sf_session_reconfigure(self._pointer)), "sf_session_reconfigure")

    @_api
    def resume(self) -> None:
        """sf_session_resume: the host is back from the background: validate the session
        (expiry check and a refresh if due; coalesced with one already due). Returns at once."""
        check(int(_ffi.lib.sf_session_resume(self._pointer)), "sf_session_resume")

    @_api
    def notify_unauthorized(self, access_token: str) -> None:
        """sf_session_notify_unauthorized: a request got HTTP 401 with `access_token`: it is
        refreshed if it is still the current one (once, whoever else reports it)."""
        check(int(_ffi.lib.sf_session_notify_unauthorized(self._pointer, access_token.encode())),
              "sf_session_notify_unauthorized")

    @_api
    def is_logged_in(self) -> bool:
        """sf_session_is_logged_in: a local check, no network."""
        return check(int(_ffi.lib.sf_session_is_logged_in(self._pointer)), "sf_session_is_logged_in") == 1

    def _copy_string(self, function: Any, call: str, *args: Any) -> str:
        size = 256
        while True:
            buffer = ctypes.create_string_buffer(size)
            code = int(function(self._pointer, *args, buffer, size))
            if code == ErrorCode.ERANGE and size < (1 << 24):
                size *= 4
                continue
            check(code, call)
            return _ffi.text(buffer.value)

    @_api
    def member_id(self) -> str:
        """sf_session_member_id ("" when there is none)."""
        return self._copy_string(_ffi.lib.sf_session_member_id, "sf_session_member_id")

    @_api
    def token_info(self) -> Optional[TokenInfo]:
        """sf_session_token_info and sf_session_token_scope: the access token's type, granted
        scope and expiry (never the token); None when there is no access token (signed out,
        or the session expired). A point-in-time reading, no network; any thread."""
        raw = _ffi.TokenInfoStruct()
        raw.size = ctypes.sizeof(_ffi.TokenInfoStruct)
        code = int(_ffi.lib.sf_session_token_info(self._pointer, ctypes.byref(raw)))
        if code == ErrorCode.ESTATE:
            return None
        check(code, "sf_session_token_info")
        scope = self._copy_string(_ffi.lib.sf_session_token_scope, "sf_session_token_scope")
        return TokenInfo._from_raw(raw, scope)

    # ---- several accounts (a store_directory keeps one record per account)

    @_api
    def accounts(self) -> List[str]:
        """sf_session_accounts: the account keys with a session, sorted."""
        needed = ctypes.c_size_t(0)
        code = int(_ffi.lib.sf_session_accounts(self._pointer, None, 0, ctypes.byref(needed)))  # the size
        if code != ErrorCode.ERANGE:
            check(code, "sf_session_accounts")
        while True:
            buffer = ctypes.create_string_buffer(max(needed.value, 1))
            code = int(_ffi.lib.sf_session_accounts(self._pointer, buffer, len(buffer), ctypes.byref(needed)))
            if code == ErrorCode.ERANGE:
                continue  # the list grew meanwhile: `needed` has its new size
            check(code, "sf_session_accounts")
            return [key.decode("utf-8", errors="replace") for key in buffer.raw[:needed.value].split(b"\0") if key]

    @_api
    def active_account(self) -> str:
        """sf_session_active_account: the active account's key ("" when none is signed in)."""
        return self._copy_string(_ffi.lib.sf_session_active_account, "sf_session_active_account")

    @_api
    def account_state(self, account: str) -> State:
        """sf_session_account_state: LOGGED_IN or SESSION_EXPIRED (InvalidArgumentError: no such account)."""
        out = ctypes.c_int(0)
        check(int(_ffi.lib.sf_session_account_state(self._pointer, account.encode(), ctypes.byref(out))),
              "sf_session_account_state")
        return State(out.value)

    @_api
    def profile(self, account: Optional[str] = None) -> Optional[Profile]:
        """sf_session_account_profile: who minted `account`'s tokens (None: the active account)
        — issuer, client id, requested and granted scope. None when the account has no profile
        (signed in with tokens, or a record written before profiles) or, for the active account,
        when none is signed in. InvalidArgumentError: no such account. Any thread; the fields are
        read one by one, all of one account (the active one is named first: a switch meanwhile
        cannot mix two accounts' fields)."""
        active = account is None
        if account is None:
            account = self.active_account()
            if not account:
                return None
        key = account.encode()

        def field(which: int) -> Optional[str]:
            needed = ctypes.c_size_t(0)
            while True:
                code = int(_ffi.lib.sf_session_account_profile(self._pointer, key, which, None, 0, ctypes.byref(needed)))
                if code == ErrorCode.ESTATE or (active and code == ErrorCode.EINVAL):
                    return None  # (the active account, logged out since it was named: none)
                if code != ErrorCode.ERANGE:
                    check(code, "sf_session_account_profile")
                buffer = ctypes.create_string_buffer(max(needed.value, 1))
                code = int(_ffi.lib.sf_session_account_profile(
                    self._pointer, key, which, buffer, len(buffer), ctypes.byref(needed)))
                if code == ErrorCode.ERANGE:
                    continue  # it grew meanwhile (a refresh named a longer scope): ask again
                if code == ErrorCode.ESTATE or (active and code == ErrorCode.EINVAL):
                    return None
                check(code, "sf_session_account_profile")
                return _ffi.text(buffer.value)

        issuer = field(_ffi.PROFILE_ISSUER)
        client_id = field(_ffi.PROFILE_CLIENT_ID)
        requested = field(_ffi.PROFILE_REQUESTED_SCOPE)
        granted = field(_ffi.PROFILE_GRANTED_SCOPE)
        if issuer is None or client_id is None:
            return None
        return Profile(issuer=issuer, client_id=client_id, requested_scope=requested or None,
                       granted_scope=granted or None)

    @_api
    def switch_account(self, account: str) -> None:
        """sf_session_switch_account: makes `account` the active one."""
        check(int(_ffi.lib.sf_session_switch_account(self._pointer, account.encode())), "sf_session_switch_account")

    @_api
    def add_account(self, access: str, refresh: Optional[str], expires_in: int, member: Optional[str] = None) -> None:
        """sf_session_add_account: signs in another account; the active one goes on in the background."""
        tokens = _tokens(access, refresh, expires_in, member)
        check(int(_ffi.lib.sf_session_add_account(self._pointer, ctypes.byref(tokens))), "sf_session_add_account")

    @_api
    def logout_account(self, account: str) -> None:
        """sf_session_logout_account: logs `account` out; the others stay."""
        check(int(_ffi.lib.sf_session_logout_account(self._pointer, account.encode())), "sf_session_logout_account")

    @_api
    def logout_all(self) -> None:
        """sf_session_logout_all."""
        check(int(_ffi.lib.sf_session_logout_all(self._pointer)), "sf_session_logout_all")

    @_api
    def fresh_token(self, timeout: Optional[float] = None) -> str:
        """sf_session_fresh_token, waited for: a usable access token (refreshed first if due).
        Raises SessionFlowError for the library's answer, TimeoutError after `timeout` seconds
        (the answer still comes later, and is dropped; None: twelve refresh timeouts and 10 s,
        longer than the library may take — a lease held by another process, a refresh whose
        answer is arriving). Not on the runtime's own loop thread
        (inside its callbacks), where it would wait for itself: BusyError."""
        self._not_on_loop_thread("fresh_token", "fresh_token_async()")
        entry = _TokenEntry(self._sink)
        key = keep(entry)  # until the one answer the library owes (also at destroy: SF_ESHUTDOWN)
        code = int(_ffi.lib.sf_session_fresh_token(self._pointer, TOKEN_THUNK, key))
        return self._wait_token(entry, key, code, "sf_session_fresh_token", self._wait(timeout))

    @_api
    def refresh_now(self, timeout: Optional[float] = None) -> str:
        """sf_session_refresh_now, waited for: refreshes now, whatever the margin says (joins a
        refresh in flight), and returns the new access token. For a token that went bad in a way
        no 401 shows. Raises as fresh_token()."""
        self._not_on_loop_thread("refresh_now", "a thread of your own")
        entry = _TokenEntry(self._sink)
        key = keep(entry)
        code = int(_ffi.lib.sf_session_refresh_now(self._pointer, TOKEN_THUNK, key))
        return self._wait_token(entry, key, code, "sf_session_refresh_now", self._wait(timeout))

    def _not_on_loop_thread(self, call: str, instead: str) -> None:
        """A call that waits for the loop, refused on the loop's own thread (BusyError)."""
        if inside_callback() and self._sink.loop_thread == threading.get_ident():
            raise SessionFlowError.from_code(
                ErrorCode.EBUSY, f"Runtime.{call}",
                f"called on the runtime's own loop thread, it would wait for itself: use {instead}")

    def _wait(self, timeout: Optional[float]) -> float:
        return self._answer_wait if timeout is None else timeout

    @staticmethod
    def _wait_token(entry: "_TokenEntry", key: int, code: int, call: str, timeout: float) -> str:
        if code < 0:
            drop(key)
            check(code, call)  # raises, with what the library said
        if not entry.done.wait(timeout):
            raise TimeoutError(f"{call}: no answer within {timeout} s")
        if entry.result < 0:
            raise SessionFlowError.from_code(entry.result, f"{call} (answer)", entry.detail)
        return entry.token

    # ---- authorizing requests (the one primitive of sessionflow.httpx and sessionflow.requests)

    @_api
    def authorize(self, method: str, url: str, timeout: Optional[float] = None) -> Authorization:
        """sf_session_authorize, waited for: the headers that authorize `method` on `url`
        (absolute https://, or http:// to a loopback host), with the access token refreshed first
        if due (one refresh shared by every request). Add every header of `.headers`, send, and on
        HTTP 401 ask unauthorized() for the authorization to retry with, once.
        Raises InvalidArgumentError (a method or URL refused), NotLoggedInError, AuthError (the
        session expired), NetworkError, ConfigError...; TimeoutError after `timeout` seconds (None:
        as fresh_token());
        BusyError on the runtime's loop thread (use authorize_async() or a callback-free thread)."""
        self._not_on_loop_thread("authorize", "authorize_async()")
        c_method, c_url = _c_text(method, "method"), _c_text(url, "url")
        entry = _AuthorizeEntry(self._sink, "sf_session_authorize", method, url)
        key = keep(entry)  # until the one answer the library owes (also at destroy: SF_ESHUTDOWN)
        code = int(_ffi.lib.sf_session_authorize(self._pointer, c_method, c_url, AUTHORIZE_THUNK, key))
        return entry.wait(key, code, self._wait(timeout))

    @_api
    def unauthorized(self, authorization: Authorization, status: int, www_authenticate: Optional[str] = None,
                     timeout: Optional[float] = None, dpop_nonce: Optional[str] = None) -> Authorization:
        """sf_session_unauthorized, waited for: the request sent with `authorization` got HTTP
        `status` (401, or 403) with `www_authenticate` (the WWW-Authenticate header, or None): the
        authorization to retry with, once. On 401 the session refreshes only if the refused token
        is still its own (compare-and-refresh: N requests refused with one token, one refresh).
        Raises UnauthorizedError at once for a 403 (a new token would not help:
        insufficient_scope or a plain refusal), AuthError when the refresh finds the session dead
        (state SESSION_EXPIRED: do not retry), UnauthorizedError when the token of a refresh made
        for this refusal was refused again, InvalidArgumentError for another status; as authorize().
        dpop_nonce: the answer's DPoP-Nonce header (sf_session_unauthorized_dpop): a DPoP session's
        use_dpop_nonce refusal is then answered with a proof carrying it, nothing refreshed. An
        invalid_dpop_proof refusal (the proof, not the token, refused) gets a new proof for the
        same token, nothing refreshed either."""
        self._not_on_loop_thread("unauthorized", "unauthorized_async()")
        args = _refusal(authorization, status, www_authenticate)
        call = "sf_session_unauthorized" if dpop_nonce is None else "sf_session_unauthorized_dpop"
        entry = _AuthorizeEntry(self._sink, call, authorization.method, authorization.url)
        key = keep(entry)
        if dpop_nonce is not None:
            code = int(_ffi.lib.sf_session_unauthorized_dpop(self._pointer, *args, _c_text(dpop_nonce, "dpop_nonce"),
                                                             AUTHORIZE_THUNK, key))
        else:
            code = int(_ffi.lib.sf_session_unauthorized(self._pointer, *args, AUTHORIZE_THUNK, key))
        return entry.wait(key, code, self._wait(timeout))

    def remember_dpop_nonce(self, url: str, nonce: str) -> bool:
        """sf_session_remember_dpop_nonce: the DPoP-Nonce header of an answer, whatever its status,
        to a request authorized for `url`: remembered for that server, so that the next proof to
        it carries it (RFC 9449 §8.2: a server may give a new nonce on a 200 and accept only that
        one from then on; without this, each rotation costs the next request a refusal and a
        retry). The adapters call it for every answer from the URL they authorized, except a
        refusal they hand to unauthorized() (which takes its nonce). Returns at once (no hop to
        the loop), and never raises: it runs after the server answered, and a request that got
        its answer must not fail for it. False, nothing remembered, when the nonce is none a proof
        can carry (1 to 1024 NQCHARs), the URL is one authorize() refuses, or the runtime is
        destroyed. Concurrent answers from one server: the last one handed over wins (an older
        nonce then costs one refusal and retry)."""
        if "\0" in url or "\0" in nonce:
            return False
        try:
            code = int(_ffi.lib.sf_session_remember_dpop_nonce(self._pointer, url.encode(), nonce.encode()))
        except Exception:  # a pointer of a destroyed runtime, an unencodable string
            return False
        return code == 0

    async def authorize_async(self, method: str, url: str) -> Authorization:
        """`await runtime.authorize_async(method, url)`: authorize() without blocking the event
        loop (sf_session_authorize). Cancelling the await abandons the answer."""
        self._sink.raise_pending()
        c_method, c_url = _c_text(method, "method"), _c_text(url, "url")
        entry = _AuthorizeEntry(self._sink, "sf_session_authorize", method, url, asyncio.get_running_loop())
        key = keep(entry)
        code = int(_ffi.lib.sf_session_authorize(self._pointer, c_method, c_url, AUTHORIZE_THUNK, key))
        return await entry.wait_async(key, code)

    async def unauthorized_async(self, authorization: Authorization, status: int,
                                 www_authenticate: Optional[str] = None,
                                 dpop_nonce: Optional[str] = None) -> Authorization:
        """`await runtime.unauthorized_async(...)`: unauthorized() without blocking the event loop
        (sf_session_unauthorized)."""
        self._sink.raise_pending()
        args = _refusal(authorization, status, www_authenticate)
        call = "sf_session_unauthorized" if dpop_nonce is None else "sf_session_unauthorized_dpop"
        entry = _AuthorizeEntry(self._sink, call, authorization.method, authorization.url,
                                asyncio.get_running_loop())
        key = keep(entry)
        if dpop_nonce is not None:
            code = int(_ffi.lib.sf_session_unauthorized_dpop(self._pointer, *args, _c_text(dpop_nonce, "dpop_nonce"),
                                                             AUTHORIZE_THUNK, key))
        else:
            code = int(_ffi.lib.sf_session_unauthorized(self._pointer, *args, AUTHORIZE_THUNK, key))
        return await entry.wait_async(key, code)

    # ---- sign-in flows

    @_api
    def sign_in_device(self, issuer: Optional[str] = None, *, scope: Optional[str] = None,
                       device_authorization_endpoint: Optional[str] = None,
                       on_prompt: Optional[Callable[[SignInPrompt], None]] = None,
                       replace_unreadable_store: bool = False) -> SignIn:
        """Starts the device authorization grant (RFC 8628, sf_session_sign_in_device):
        `on_prompt` (loop thread) gets the user code and the verification URI; the library
        polls until the user approves. With `issuer`, the endpoints come from its metadata
        (RFC 8414) and the client is the runtime's client_id; else from the runtime's token
        endpoint and `device_authorization_endpoint`. Raises SessionFlowError
        (InvalidArgumentError, InvalidStateError...) when it cannot start; the outcome comes
        through the returned SignIn."""
        return self._sign_in_flow(_ffi.lib.sf_session_sign_in_device, "sf_session_sign_in_device", issuer, scope,
                                  device_authorization_endpoint, None, None, on_prompt, replace_unreadable_store)

    @_api
    def sign_in_browser(self, issuer: Optional[str] = None, *, scope: Optional[str] = None,
                        authorization_endpoint: Optional[str] = None, timeout_ms: Optional[int] = None,
                        on_prompt: Optional[Callable[[SignInPrompt], None]] = None,
                        replace_unreadable_store: bool = False, start_page: bool = True) -> SignIn:
        """Starts the authorization code grant with PKCE on a loopback redirect
        (sf_session_sign_in_browser): `on_prompt` (loop thread) gets the authorization URL to
        open in a browser, the start URL that redirects to it once (give a program you start,
        such as `webbrowser.open`, that one), and the redirect URI the library listens on.
        Use one of the two URLs: with `start_page=False` there is no start URL (None, and the
        listener answers it 404) — pass that when you show the person the authorization URL.
        Gives up after `timeout_ms` (SignInExpiredError). Otherwise as sign_in_device."""
        return self._sign_in_flow(_ffi.lib.sf_session_sign_in_browser, "sf_session_sign_in_browser", issuer, scope,
                                  None, authorization_endpoint, timeout_ms, on_prompt, replace_unreadable_store,
                                  start_page)

    def _sign_in_flow(self, function: Any, call: str, issuer: Optional[str], scope: Optional[str],
                      device_endpoint: Optional[str], authorization_endpoint: Optional[str],
                      timeout_ms: Optional[int], on_prompt: Optional[Callable[[SignInPrompt], None]],
                      replace_unreadable_store: bool, start_page: bool = True) -> SignIn:
        buffer = _ffi.SignInOptionsBuffer()
        _ffi.lib.sf_sign_in_options_init(ctypes.byref(buffer))
        options = buffer.options
        options.size = ctypes.sizeof(_ffi.SignInOptions)  # this binding's layout
        options.issuer = _bytes(issuer)  # copied by the starting call
        options.device_authorization_endpoint = _bytes(device_endpoint)
        options.authorization_endpoint = _bytes(authorization_endpoint)
        options.scope = _bytes(scope)
        if timeout_ms is not None:
            options.timeout_ms = int(timeout_ms)
        options.replace_unreadable_store = 1 if replace_unreadable_store else 0
        options.no_start_page = 0 if start_page else 1
        sign_in = SignIn(call)
        key = keep(_SignInEntry(self._sink, sign_in, on_prompt))
        observer = _ffi.SignInObserver(PROMPT_THUNK, DONE_THUNK, RELEASE_THUNK, key)
        handle = ctypes.c_uint64()
        code = int(function(self._pointer, ctypes.byref(buffer), ctypes.byref(observer), ctypes.byref(handle)))
        if code < 0:
            drop(key)  # a failed start takes no ownership: nothing will be called
            raise SessionFlowError.from_code(code, call)
        sign_in.handle = handle.value
        return sign_in
