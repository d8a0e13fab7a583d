"""Callbacks from the library's loop thread: keeping them alive, and what happens when the
host's code in one raises.

The policy (README, "Exceptions in callbacks"): an exception raised by a callback of the
host's (a state, event or store observer, a refresher, on_prompt, on_release...) is never
swallowed. It never reaches ctypes (which would print and drop it). With
Runtime(on_callback_error=handler), the handler gets it, on the loop thread, right after the
callback; without one, it is logged at ERROR (logger "sessionflow", with the traceback) and
kept: the next call the host makes on that runtime from outside a callback raises
CallbackError (its __cause__ and .exception are the callback's exception), before doing
anything else; destroy() destroys first, then raises it. Further exceptions until then are
logged and counted (CallbackError.more). A handler that raises itself falls back to the
default for both exceptions.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Dict, Optional, TypeVar

from . import _ffi
from .errors import answer_detail

_log = logging.getLogger("sessionflow")

CallbackErrorHandler = Callable[[BaseException], None]
T = TypeVar("T")


class CallbackError(Exception):
    """A callback of the host's raised; raised from the runtime's next call (see the policy)."""

    exception: BaseException
    where: str
    more: int

    def __init__(self, exception: BaseException, where: str, more: int = 0) -> None:
        extra = f"; {more} more callback exception(s) since, logged" if more else ""
        super().__init__(f"a callback raised {type(exception).__name__}: {exception} (in {where}){extra}")
        self.exception = exception
        self.where = where
        self.more = more


# ---- Callbacks: permanent C thunks, the host's side in a table --------------------------
# The C function pointers handed to the library are the module-level thunks below, created
# once and never freed: a ctypes function object is never released while the library could
# still be running it (release() is the last call of an observer, and runs *inside* such a
# function). What differs per subscription, refresher, token request or sign-in is an Entry,
# kept in a table under an integer key that the library carries as `userdata`, and dropped
# after the last call the library makes with it (release, or the one token answer).

_alive: Dict[int, "Entry"] = {}
_alive_lock = threading.Lock()
_next_key = 0


def keep(entry: "Entry") -> int:
    """Keeps `entry` under a new key (the userdata to hand to the library) until drop(key)."""
    global _next_key
    with _alive_lock:
        _next_key += 1
        _alive[_next_key] = entry
        return _next_key


def drop(key: Optional[int]) -> None:
    if key is not None:
        with _alive_lock:
            _alive.pop(key, None)


def kept() -> int:
    """How many entries the library may still call (for the tests: leaks)."""
    with _alive_lock:
        return len(_alive)


class Entry:
    """The host's side of one subscription, refresher, token request or sign-in. Each method is
    one C callback; each runs inside its runtime's ErrorSink (see the policy below)."""

    def __init__(self, sink: "ErrorSink", where: str) -> None:
        self.sink = sink
        self.where = where

    def on_state(self, state: int) -> None: ...
    def on_event(self, raw: Any) -> None: ...
    def on_status(self, status: int, reason: Optional[bytes]) -> None: ...
    def on_error(self, code: int, message: Optional[bytes]) -> None: ...
    def on_complete(self) -> None: ...
    def on_release(self) -> None: ...
    def on_token(self, result: int, token: Optional[bytes], detail: Optional[str]) -> None: ...
    def on_refresh(self, request: int, refresh_token: Optional[bytes]) -> None: ...
    def on_cancel(self, request: int) -> None: ...
    def on_prompt(self, raw: Any) -> None: ...
    def on_log(self, level: int, line: Optional[bytes]) -> None: ...
    def on_done(self, result: int, message: Optional[bytes]) -> None: ...
    def on_authorized(self, result: int, raw: Any, detail: Optional[str]) -> None: ...


def _entry(userdata: Optional[int]) -> Optional[Entry]:
    return _alive.get(userdata) if userdata is not None else None


def _dispatch(userdata: Optional[int], name: str, *args: Any) -> None:
    entry = _entry(userdata)
    if entry is not None:
        entry.sink.run(f"{entry.where} {name}", getattr(entry, name), *args)


def _last(userdata: Optional[int], name: str, *args: Any) -> None:
    """The entry's last callback: dispatched, then the entry is dropped."""
    try:
        _dispatch(userdata, name, *args)
    finally:
        drop(userdata)


def _state(state: int, userdata: Optional[int]) -> None:
    _dispatch(userdata, "on_state", state)


def _error(code: int, message: Optional[bytes], userdata: Optional[int]) -> None:
    _dispatch(userdata, "on_error", code, message)


def _complete(userdata: Optional[int]) -> None:
    _dispatch(userdata, "on_complete")


def _release(userdata: Optional[int]) -> None:
    _last(userdata, "on_release")


def _event(raw: Any, userdata: Optional[int]) -> None:
    _dispatch(userdata, "on_event", raw)


def _status(status: int, reason: Optional[bytes], userdata: Optional[int]) -> None:
    _dispatch(userdata, "on_status", status, reason)


def _token(result: int, token: Optional[bytes], userdata: Optional[int]) -> None:
    # Why a failing answer failed: this (the loop) thread's sf_last_error_message, read now.
    _last(userdata, "on_token", result, token, answer_detail(result) if result < 0 else None)


def _refresh(request: Optional[int], refresh_token: Optional[bytes], userdata: Optional[int]) -> None:
    _dispatch(userdata, "on_refresh", request or 0, refresh_token)


def _cancel(request: Optional[int], userdata: Optional[int]) -> None:
    _dispatch(userdata, "on_cancel", request or 0)


def _prompt(raw: Any, userdata: Optional[int]) -> None:
    _dispatch(userdata, "on_prompt", raw)


def _done(result: int, message: Optional[bytes], userdata: Optional[int]) -> None:
    _dispatch(userdata, "on_done", result, message)


def _authorized(result: int, raw: Any, userdata: Optional[int]) -> None:
    _last(userdata, "on_authorized", result, raw, answer_detail(result) if result < 0 else None)


def _log_line(level: int, line: Optional[bytes], userdata: Optional[int]) -> None:
    _dispatch(userdata, "on_log", level, line)


LOG_THUNK = _ffi.LOG_FN(_log_line)
STATE_THUNK = _ffi.STATE_FN(_state)
ERROR_THUNK = _ffi.ERROR_FN(_error)
COMPLETE_THUNK = _ffi.VOID_FN(_complete)
RELEASE_THUNK = _ffi.VOID_FN(_release)
EVENT_THUNK = _ffi.EVENT_FN(_event)
STATUS_THUNK = _ffi.STORE_FN(_status)
TOKEN_THUNK = _ffi.TOKEN_FN(_token)
REFRESH_THUNK = _ffi.REFRESH_FN(_refresh)
CANCEL_THUNK = _ffi.CANCEL_FN(_cancel)
PROMPT_THUNK = _ffi.PROMPT_FN(_prompt)
DONE_THUNK = _ffi.DONE_FN(_done)
AUTHORIZE_THUNK = _ffi.AUTHORIZE_FN(_authorized)


# ---- The policy --------------------------------------------------------------------------

_inside = threading.local()


def inside_callback() -> bool:
    """Whether this thread is running a callback of the library right now."""
    return bool(getattr(_inside, "depth", 0))


class ErrorSink:
    """One runtime's exceptions from callbacks: handed to its handler, or kept for its next call.

    Callbacks hold the sink, not the Runtime, so that a kept callback never keeps a Runtime
    (or an asyncio iterator) alive."""

    def __init__(self, handler: Optional[CallbackErrorHandler]) -> None:
        self._handler = handler
        self._lock = threading.Lock()
        self._pending: Optional[CallbackError] = None
        self._more = 0
        self.loop_thread: Optional[int] = None  # the thread the callbacks run on (the loop's)

    def run(self, where: str, function: Callable[..., T], *args: Any) -> Optional[T]:
        """Calls function(*args) as a callback: whatever it raises goes through the policy."""
        self.loop_thread = threading.get_ident()
        _inside.depth = getattr(_inside, "depth", 0) + 1
        try:
            return function(*args)
        except BaseException as exception:  # noqa: B902 - nothing may reach ctypes
            self.report(exception, where)
            return None
        finally:
            _inside.depth -= 1

    def report(self, exception: BaseException, where: str) -> None:
        if self._handler is not None:
            try:
                self._handler(exception)
                return
            except BaseException as handler_exception:  # the handler failed: the default for both
                self._keep(exception, where)
                self._keep(handler_exception, "on_callback_error")
                return
        self._keep(exception, where)

    def _keep(self, exception: BaseException, where: str) -> None:
        with self._lock:  # kept first: once the record is out, the next call raises it
            if self._pending is None:
                self._pending = CallbackError(exception, where)
            else:
                self._more += 1
        _log.error("exception in a sessionflow callback (%s): raised from the runtime's next call",
                   where, exc_info=(type(exception), exception, exception.__traceback__))

    def raise_pending(self) -> None:
        """Raises the kept CallbackError (once), unless called from inside a callback."""
        if self._pending is None or inside_callback():
            return
        with self._lock:
            pending, more = self._pending, self._more
            self._pending, self._more = None, 0
        if pending is not None:
            error = CallbackError(pending.exception, pending.where, more)
            raise error from pending.exception

    @property
    def pending(self) -> bool:
        return self._pending is not None
