"""SessionFlow for Python: an authenticated session that keeps itself alive, through ctypes
over libsessionflow (the C API of sessionflow.h).

    import sessionflow
    with sessionflow.Runtime(refresher=my_refresher) as runtime:
        runtime.sign_in(access, refresh, expires_in=3600, member="alice")
        token = runtime.fresh_token()

The library is found in this order: SESSIONFLOW_LIB, the copy bundled in the wheel
(sessionflow/_lib/libsessionflow.so), the system's (ctypes.util.find_library); else the
import raises LibraryNotFoundError (an ImportError) saying what was tried.

Threading: callbacks run on the runtime's loop thread; `async for state in
runtime.states()` and `await runtime.fresh_token_async()` bring them to asyncio.
Errors: every SF_E* code is raised as SessionFlowError (.code, .name, .text, .call, .detail)
or its subclass; an exception in a callback of yours is never swallowed (CallbackError, or
Runtime(on_callback_error=...)). README.md beside the package says more.
"""
from __future__ import annotations

from typing import Tuple

from . import _ffi
from ._asyncio import FlowIterator
from ._callbacks import CallbackError, CallbackErrorHandler
from ._loader import LibraryNotFoundError
from ._runtime import RefreshRequest, Runtime, SignIn
from ._types import (Authorization, DPoP, Event, EventKind, LogLevel, Profile, SignInPrompt, State, StoreKeySource, StoreStatus,
                     Subscription, TokenInfo)
from ._version import __version__
from .errors import (ERRORS, SF_OK, AuthError, BusyError, ClosedError, ConfigError, ErrorCode,
                     InvalidArgumentError, InvalidStateError, NetworkError, NotLoggedInError, RangeError,
                     SessionEndedError, SessionFlowError, ShutdownError, SignInCancelledError,
                     SignInDeniedError, SignInExpiredError, StoreError, UnauthorizedError, WrongThreadError,
                     error_name, last_error_message, strerror)

library_path: str = _ffi.library_path
"""What was loaded: the path (SESSIONFLOW_LIB, the bundled copy) or the system's library name."""
library_source: str = _ffi.library_source
"""Where it came from: "SESSIONFLOW_LIB", "bundled" or "system"."""


def version() -> str:
    """The library's version, "MAJOR.MINOR.PATCH" (sf_version_string)."""
    return _ffi.text(_ffi.lib.sf_version_string())


def version_info() -> Tuple[int, int, int]:
    """The library's version as (major, minor, patch), from sf_version (SF_VERSION_HEX)."""
    value = int(_ffi.lib.sf_version())
    return value >> 16, (value >> 8) & 0xFF, value & 0xFF


__all__ = [
    "ERRORS", "SF_OK", "AuthError", "Authorization", "BusyError", "CallbackError", "CallbackErrorHandler",
    "ClosedError",
    "ConfigError", "ErrorCode", "Event", "EventKind", "FlowIterator", "InvalidArgumentError", "InvalidStateError",
    "LibraryNotFoundError", "LogLevel", "DPoP", "NetworkError", "NotLoggedInError", "Profile", "RangeError", "RefreshRequest", "Runtime",
    "SessionEndedError", "SessionFlowError", "ShutdownError", "SignIn", "SignInCancelledError",
    "SignInDeniedError", "SignInExpiredError", "SignInPrompt", "State", "StoreError", "StoreKeySource",
    "StoreStatus", "Subscription", "TokenInfo", "UnauthorizedError", "WrongThreadError", "__version__", "error_name", "last_error_message",
    "library_path", "library_source", "strerror", "version", "version_info",
]
