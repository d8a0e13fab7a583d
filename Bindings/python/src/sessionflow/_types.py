"""The values the library hands to Python: states, events, store statuses, sign-in prompts."""
from __future__ import annotations

import ctypes
import datetime
import enum
from dataclasses import dataclass
from typing import List, Optional, Tuple, Union

from . import _ffi


class State(enum.IntEnum):
    """sf_session_state."""

    LOGGED_OUT = 0
    LOGGED_IN = 1
    SESSION_EXPIRED = 2


class EventKind(enum.IntEnum):
    """sf_event_kind."""

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
    """sf_store_status."""

    READING = 0
    AVAILABLE = 1
    UNAVAILABLE = 2


class LogLevel(enum.IntEnum):
    """sf_log_level: the levels of the library's log lines (Runtime(log=..., log_level=...))."""

    TRACE = 0
    DEBUG = 1
    INFO = 2
    NOTICE = 3
    WARNING = 4
    ERROR = 5
    CRITICAL = 6


class DPoP(enum.IntEnum):
    """sf_options.dpop (SF_DPOP_*): sender-constrained tokens (RFC 9449) for sign-ins."""

    OFF = 0
    REQUIRED = 1
    IF_SUPPORTED = 2


class StoreKeySource(enum.IntEnum):
    """sf_options.store_key_source (SF_STORE_KEY_*)."""

    AUTOMATIC = 0
    FILE = 1
    SECRET_SERVICE = 2


def _optional(value: Optional[bytes]) -> Optional[str]:
    return value.decode("utf-8", errors="replace") if value else None


def _kind(value: int) -> Union[EventKind, int]:
    try:
        return EventKind(value)
    except ValueError:  # a kind of a newer library: kept as its number
        return value


@dataclass(frozen=True)
class Event:
    """A session event (sf_event). Strings are copied out of the callback's borrowed ones.

    member_id: SIGNED_IN, ACCOUNT_SWITCHED; reason: SIGNED_OUT, TOKEN_REFRESHED,
    REFRESH_FAILED, SESSION_EXPIRED, STORE_ERROR; code, attempt, retry_in_ms (-1: no retry
    scheduled): REFRESH_FAILED; expires_in_ms: TOKEN_REFRESHED; state: INITIAL_SESSION.
    Never a token."""

    kind: Union[EventKind, int]
    state: State
    member_id: Optional[str]
    reason: Optional[str]
    code: int
    attempt: int
    retry_in_ms: int
    expires_in_ms: int

    @classmethod
    def _from_raw(cls, raw: _ffi.RawEvent) -> "Event":
        return cls(
            kind=_kind(int(raw.kind)),
            state=State(int(raw.state)),
            member_id=_optional(raw.member_id),
            reason=_optional(raw.reason),
            code=int(raw.code),
            attempt=int(raw.attempt),
            retry_in_ms=int(raw.retry_in_ms),
            expires_in_ms=int(raw.expires_in_ms),
        )


@dataclass(frozen=True)
class TokenInfo:
    """The access token's details (sf_session_token_info, sf_session_token_scope); never the
    token itself.

    token_type: "Bearer", or "DPoP" for a sender-constrained session. scope: the scope granted
    (RFC 6749 §3.3, space-separated names) — the token endpoint's `scope`, else the scope the
    sign-in asked for; a refresh whose answer has none keeps it; None when not known (signed in
    with tokens and no scope).
    expires_in_ms: time left on the monotonic clock, negative once expired (None: unknown).
    expires_at: when it expires on the wall clock, a UTC datetime (None: unknown)."""

    token_type: str
    scope: Optional[str]
    expires_in_ms: Optional[int]
    expires_at: Optional[datetime.datetime]

    @property
    def scopes(self) -> List[str]:
        """The granted scope's names ([] when not known)."""
        return self.scope.split(" ") if self.scope else []

    @classmethod
    def _from_raw(cls, raw: _ffi.TokenInfoStruct, scope: str) -> "TokenInfo":
        expires_in = int(raw.expires_in_ms)
        expires_at = int(raw.expires_at_unix_ms)
        return cls(
            token_type=_ffi.text(raw.token_type),
            scope=scope or None,
            expires_in_ms=None if expires_in == -(1 << 63) else expires_in,
            expires_at=(datetime.datetime.fromtimestamp(expires_at / 1000, tz=datetime.timezone.utc)
                        if expires_at != 0 else None),
        )


@dataclass(frozen=True)
class Profile:
    """Who minted an account's tokens (sf_session_account_profile), kept beside them in the
    same sealed store record; no secret in it.

    issuer: the issuer URL the account signed in with. client_id: the client the tokens were
    issued to. requested_scope: the scope the sign-in asked for (None: none asked for).
    granted_scope: the scope granted now — the sign-in's, replaced by a refresh whose answer
    names a scope (None: not known)."""

    issuer: str
    client_id: str
    requested_scope: Optional[str]
    granted_scope: Optional[str]

    @property
    def scopes(self) -> List[str]:
        """The granted scope's names ([] when not known)."""
        return self.granted_scope.split(" ") if self.granted_scope else []


@dataclass(frozen=True)
class SignInPrompt:
    """What the user is shown (sf_sign_in_prompt). Device flow: go to `verification_uri` and
    enter `user_code` (or open `verification_uri_complete`). Browser flow: open
    `authorization_url`; it comes back to `redirect_uri`. `start_url` redirects to
    `authorization_url` once: give it to a program you start (its arguments are readable by
    every local user; the authorization URL's state is not for them), and show it to a person
    too, or sign in with `start_page=False` (then `start_url` is None) and show the
    authorization URL. Fields not of the flow are None.
    (No device code, code verifier or token is ever in it.)"""

    user_code: Optional[str]
    verification_uri: Optional[str]
    verification_uri_complete: Optional[str]
    expires_in_ms: int
    interval_ms: int
    authorization_url: Optional[str]
    redirect_uri: Optional[str]
    start_url: Optional[str]

    @classmethod
    def _from_raw(cls, raw: _ffi.SignInPromptStruct) -> "SignInPrompt":
        return cls(
            user_code=_optional(raw.user_code),
            verification_uri=_optional(raw.verification_uri),
            verification_uri_complete=_optional(raw.verification_uri_complete),
            expires_in_ms=int(raw.expires_in_ms),
            interval_ms=int(raw.interval_ms),
            authorization_url=_optional(raw.authorization_url),
            redirect_uri=_optional(raw.redirect_uri),
            start_url=_optional(raw.start_url),
        )


class Authorization:
    """What to add to one HTTP request (sf_authorization): `headers`, every (name, value) pair
    in order ([("Authorization", "Bearer <token>")]; a sender-constrained session's are
    [("Authorization", "DPoP <token>"), ("DPoP", proof)]: add them all), and `scheme` ("Bearer"
    or "DPoP").
    `method` and `url` are the request's; hand the authorization back to
    Runtime.unauthorized() when the server refuses it.

    The values are secrets, copied out of the library's memory into Python strings (which
    cannot be wiped): keep an authorization only as long as its request. repr() shows no value."""

    __slots__ = ("method", "url", "scheme", "headers")

    def __init__(self, method: str, url: str, scheme: str, headers: List[Tuple[str, str]]) -> None:
        self.method = method
        self.url = url
        self.scheme = scheme
        self.headers = headers

    @property
    def value(self) -> str:
        """The Authorization header's value ("Bearer <token>")."""
        for name, value in self.headers:
            if name.lower() == "authorization":
                return value
        raise ValueError("this authorization has no Authorization header")

    @classmethod
    def _from_raw(cls, method: str, url: str, raw: _ffi.AuthorizationStruct) -> "Authorization":
        headers = []
        for index in range(int(raw.header_count)):
            header = raw.headers[index]
            # Borrowed for the callback: copied now.
            value = ctypes.string_at(header.value).decode("utf-8", errors="replace") if header.value else ""
            headers.append((_ffi.text(header.name), value))
        return cls(method, url, _ffi.text(raw.scheme), headers)

    def __repr__(self) -> str:
        names = ", ".join(name for name, _ in self.headers)
        return f"Authorization({self.scheme}, {self.method} {self.url}, headers: {names}; values <redacted>)"


class Subscription:
    """A subscription handle (sf_subscription). close() from any thread, any number of times,
    also inside its own callback: when it returns (outside that callback), no callback of the
    subscription runs or will start. Also a context manager (closes on exit)."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def close(self) -> bool:
        """sf_subscription_close: True the first time; False when already closed or completed
        (SF_ECLOSED, the one answer it can give besides SF_OK)."""
        return int(_ffi.lib.sf_subscription_close(self.handle)) == 0

    def __enter__(self) -> "Subscription":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Subscription({self.handle})"
