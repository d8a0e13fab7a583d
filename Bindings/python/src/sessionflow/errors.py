"""The error model.

Every C call that returns a negative SF_E* code raises SessionFlowError (or the subclass of
that code: ``except sessionflow.NetworkError``); nothing returns an error code. A
SessionFlowError carries:

  code    the SF_E* value (negative int; ErrorCode names the known ones)
  name    its name from sf_err_name, e.g. "SF_ESTATE"
  text    its description from sf_strerror
  call    the C function that returned it (or the step, e.g. "sf_session_fresh_token (answer)")
  detail  more words when there are any: why the call failed (the C API's per-thread
          sf_last_error_message, e.g. "sf_options.token_endpoint uses plain http to a host that
          is not loopback ..."), the library's message of a failed sign-in, of a
          subscription's terminal error...; None otherwise

No message, repr or detail of this binding carries a token.

An exception raised by the host's own code in a callback is another matter: see CallbackError
(sessionflow._callbacks) and the README's "Exceptions in callbacks".
"""
from __future__ import annotations

import enum
from typing import Any, Dict, Optional, Tuple, Type

from . import _ffi


class ErrorCode(enum.IntEnum):
    """The header's SF_ERRNO_MAP (codes are only ever appended)."""

    OK = 0
    EINVAL = -1
    ECLOSED = -2
    EBUSY = -3
    ETHREAD = -4
    ESTATE = -5
    ESTORE = -6
    EAUTH = -7
    ENETWORK = -8
    ERANGE = -9
    ESHUTDOWN = -10
    ECONFIG = -11
    ENOTLOGGEDIN = -12
    EUNAUTHORIZED = -13
    ESESSIONENDED = -14
    ECANCELLED = -15
    EDENIED = -16
    EEXPIRED = -17


SF_OK = 0


def error_name(code: int) -> str:
    """sf_err_name: "SF_EINVAL"... ("SF_EUNKNOWN" for an unknown code)."""
    return _ffi.text(_ffi.lib.sf_err_name(code))


def strerror(code: int) -> str:
    """sf_strerror: a short description ("unknown error" for an unknown code)."""
    return _ffi.text(_ffi.lib.sf_strerror(code))


def last_error_message() -> Optional[str]:
    """sf_last_error_message: why the last failing call of this thread failed ("call: why"),
    or None before its first failure. The errors this binding raises carry it as `detail`."""
    message = _ffi.lib.sf_last_error_message()
    return _ffi.text(message) if message else None


def answer_detail(code: int) -> Optional[str]:
    """Inside a callback answering with a negative code, on the loop thread: why the answer
    failed, as the library said it ("sf_session_authorize (answer): why" — the why)."""
    try:
        message = last_error_message()
    except Exception:  # noqa: BLE001 - never out of a callback thunk (the interpreter going away)
        return None
    marker = " (answer): "
    if not message or marker not in message:
        return None
    detail = message.split(marker, 1)[1]
    return None if detail == strerror(code) else detail


def _detail_of(code: int, call: str) -> Optional[str]:
    """What the library said of the call that just failed on this thread, beyond its code."""
    message = last_error_message()
    function = call.split(" ")[0]
    if not message or not message.startswith(function + ": "):
        return None
    detail = message[len(function) + 2:]
    return None if detail == strerror(code) else detail


# Every code the library knows, by name ("SF_ECLOSED": -2), read from the library itself.
ERRORS: Dict[str, int] = {
    error_name(code): code for code in range(-1, -64, -1) if error_name(code) != "SF_EUNKNOWN"
}


class SessionFlowError(Exception):
    """A negative SF_E* code from the library, with its name, text and where it came from."""

    code: int
    name: str
    text: str
    call: Optional[str]
    detail: Optional[str]

    def __init__(self, code: int, call: Optional[str] = None, detail: Optional[str] = None) -> None:
        super().__init__(code, call, detail)  # args: what pickling needs to build it again
        self.code = code
        self.name = error_name(code)
        self.text = strerror(code)
        self.call = call
        self.detail = detail

    def __str__(self) -> str:
        message = f"{self.name}: {self.text}"
        if self.call:
            message = f"{self.call}: {message}"
        if self.detail:
            message = f"{message} ({self.detail})"
        return message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.code}, {self.call!r}, {self.detail!r})"

    @staticmethod
    def from_code(code: int, call: Optional[str] = None, detail: Optional[str] = None) -> "SessionFlowError":
        """The error for `code`: its subclass (AuthError for SF_EAUTH...) when it has one."""
        return _CLASSES.get(code, SessionFlowError)(code, call, detail)

    def __reduce__(self) -> Tuple[Any, ...]:
        return (type(self), (self.code, self.call, self.detail))


class InvalidArgumentError(SessionFlowError):
    """SF_EINVAL: an invalid argument or option (the library's log names it)."""


class ClosedError(SessionFlowError):
    """SF_ECLOSED: an unknown, closed or already completed handle (a destroyed runtime...)."""


class BusyError(SessionFlowError):
    """SF_EBUSY: would wait for itself (destroy on the loop thread), or too many requests waiting."""


class WrongThreadError(SessionFlowError):
    """SF_ETHREAD: must be called on the thread that runs the borrowed loop."""


class InvalidStateError(SessionFlowError):
    """SF_ESTATE: not allowed in the current session state (sign in twice, log out logged out)."""


class StoreError(SessionFlowError):
    """SF_ESTORE: the credential store failed, or its session is not known yet."""


class AuthError(SessionFlowError):
    """SF_EAUTH: the authority refused for good: the session has expired."""


class NetworkError(SessionFlowError):
    """SF_ENETWORK: a transient failure (network, timeout, 5xx, 429): retried later."""


class RangeError(SessionFlowError):
    """SF_ERANGE: a buffer was too small (the binding retries with a larger one)."""


class ShutdownError(SessionFlowError):
    """SF_ESHUTDOWN: the runtime is shutting down or shut down."""


class ConfigError(SessionFlowError):
    """SF_ECONFIG: the authority rejected the client configuration (or there is no authority)."""


class NotLoggedInError(SessionFlowError):
    """SF_ENOTLOGGEDIN: no one is signed in."""


class UnauthorizedError(SessionFlowError):
    """SF_EUNAUTHORIZED: a freshly refreshed token was refused again."""


class SessionEndedError(SessionFlowError):
    """SF_ESESSIONENDED: the session ended (logout, new sign-in) before the answer."""


class SignInCancelledError(SessionFlowError):
    """SF_ECANCELLED: the sign-in was cancelled."""


class SignInDeniedError(SessionFlowError):
    """SF_EDENIED: the user or the authority refused the sign-in."""


class SignInExpiredError(SessionFlowError):
    """SF_EEXPIRED: the sign-in took too long: start it again."""


_CLASSES: Dict[int, Type[SessionFlowError]] = {
    ErrorCode.EINVAL: InvalidArgumentError,
    ErrorCode.ECLOSED: ClosedError,
    ErrorCode.EBUSY: BusyError,
    ErrorCode.ETHREAD: WrongThreadError,
    ErrorCode.ESTATE: InvalidStateError,
    ErrorCode.ESTORE: StoreError,
    ErrorCode.EAUTH: AuthError,
    ErrorCode.ENETWORK: NetworkError,
    ErrorCode.ERANGE: RangeError,
    ErrorCode.ESHUTDOWN: ShutdownError,
    ErrorCode.ECONFIG: ConfigError,
    ErrorCode.ENOTLOGGEDIN: NotLoggedInError,
    ErrorCode.EUNAUTHORIZED: UnauthorizedError,
    ErrorCode.ESESSIONENDED: SessionEndedError,
    ErrorCode.ECANCELLED: SignInCancelledError,
    ErrorCode.EDENIED: SignInDeniedError,
    ErrorCode.EEXPIRED: SignInExpiredError,
}


def check(code: int, call: str) -> int:
    """`code` when it is not negative; raises SessionFlowError.from_code otherwise."""
    if code < 0:
        raise SessionFlowError.from_code(code, call, _detail_of(code, call))
    return code


def code_of(code: "int | str") -> int:
    """An error code from an int, an ErrorCode, or a name ("SF_EAUTH" or "EAUTH")."""
    if isinstance(code, int):
        return int(code)
    name = code if code.startswith("SF_") else f"SF_{code}"
    if name not in ERRORS:
        raise ValueError(f"unknown error code name {code!r}; known: {', '.join(sorted(ERRORS))}")
    return ERRORS[name]
