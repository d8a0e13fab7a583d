"""The C API as ctypes sees it: sessionflow.h's structs, callback types and prototypes.

Every prototype is named as in the header (`lib.sf_session_resume`), so that the coverage
test (tests/test_api_coverage.py) can check that each header function is either exposed
(EXPOSED: the Python API that calls it) or deliberately not (NOT_EXPOSED: why).
"""
from __future__ import annotations

import ctypes
from typing import Any, Dict, List, Tuple

from . import _loader
from ._version import __version__

# ---- Callback types (sf_*_fn and the observers' members) --------------------------------

STATE_FN = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p)
ERROR_FN = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
VOID_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
TOKEN_FN = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
REFRESH_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)
CANCEL_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
STORE_FN = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


# ---- Structs (the header's layouts, field for field) ------------------------------------

class Observer(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("on_state", STATE_FN),
        ("on_error", ERROR_FN),
        ("on_complete", VOID_FN),
        ("release", VOID_FN),
        ("userdata", ctypes.c_void_p),
    ]


class RawEvent(ctypes.Structure):
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


EVENT_FN = ctypes.CFUNCTYPE(None, ctypes.POINTER(RawEvent), ctypes.c_void_p)


class EventObserver(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("on_event", EVENT_FN),
        ("on_error", ERROR_FN),
        ("on_complete", VOID_FN),
        ("release", VOID_FN),
        ("userdata", ctypes.c_void_p),
    ]


class StoreObserver(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("on_status", STORE_FN),
        ("on_error", ERROR_FN),
        ("on_complete", VOID_FN),
        ("release", VOID_FN),
        ("userdata", ctypes.c_void_p),
    ]


class Tokens(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("access_token", ctypes.c_char_p),
        ("refresh_token", ctypes.c_char_p),
        ("expires_in", ctypes.c_int64),
        ("member_id", ctypes.c_char_p),
    ]


class Options(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("refresh_margin_ms", ctypes.c_int64),
        ("refresh_timeout_ms", ctypes.c_int64),
        ("min_backoff_ms", ctypes.c_int64),
        ("max_backoff_ms", ctypes.c_int64),
        ("refresh", REFRESH_FN),
        ("refresh_userdata", ctypes.c_void_p),
        ("min_refresh_interval_ms", ctypes.c_int64),
        ("token_endpoint", ctypes.c_char_p),
        ("client_id", ctypes.c_char_p),
        ("client_secret", ctypes.c_char_p),
        ("scope", ctypes.c_char_p),
        ("revocation_endpoint", ctypes.c_char_p),
        ("introspection_endpoint", ctypes.c_char_p),
        ("store_directory", ctypes.c_char_p),
        ("refresh_release", VOID_FN),
        ("start_manually", ctypes.c_int),
        ("refresh_cancel", CANCEL_FN),
        ("store_key", ctypes.c_void_p),
        ("store_key_size", ctypes.c_size_t),
        ("store_key_file", ctypes.c_char_p),
        ("store_key_source", ctypes.c_int),
        ("issuer", ctypes.c_char_p),
        ("log", LOG_FN),
        ("log_userdata", ctypes.c_void_p),
        ("log_level", ctypes.c_int),
        ("dpop", ctypes.c_int),
    ]


class SignInOptions(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("issuer", ctypes.c_char_p),
        ("device_authorization_endpoint", ctypes.c_char_p),
        ("authorization_endpoint", ctypes.c_char_p),
        ("scope", ctypes.c_char_p),
        ("timeout_ms", ctypes.c_int64),
        ("replace_unreadable_store", ctypes.c_int),
        ("no_start_page", ctypes.c_int),
    ]


class SignInPromptStruct(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("user_code", ctypes.c_char_p),
        ("verification_uri", ctypes.c_char_p),
        ("verification_uri_complete", ctypes.c_char_p),
        ("expires_in_ms", ctypes.c_int64),
        ("interval_ms", ctypes.c_int64),
        ("authorization_url", ctypes.c_char_p),
        ("redirect_uri", ctypes.c_char_p),
        ("start_url", ctypes.c_char_p),
    ]


PROMPT_FN = ctypes.CFUNCTYPE(None, ctypes.POINTER(SignInPromptStruct), ctypes.c_void_p)
DONE_FN = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


class SignInObserver(ctypes.Structure):
    _fields_ = [
        ("on_prompt", PROMPT_FN),
        ("on_done", DONE_FN),
        ("release", VOID_FN),
        ("userdata", ctypes.c_void_p),
    ]


class Header(ctypes.Structure):
    # value is a secret lent in place: read with ctypes.string_at, never kept as c_char_p
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_void_p)]


class AuthorizationStruct(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("scheme", ctypes.c_char_p),
        ("headers", ctypes.POINTER(Header)),
        ("header_count", ctypes.c_size_t),
    ]


AUTHORIZE_FN = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.POINTER(AuthorizationStruct), ctypes.c_void_p)


class TokenInfoStruct(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("token_type", ctypes.c_char * 16),
        ("expires_in_ms", ctypes.c_int64),
        ("expires_at_unix_ms", ctypes.c_int64),
    ]


# sf_profile_field: which part of an account's profile sf_session_account_profile copies.
PROFILE_ISSUER = 0
PROFILE_CLIENT_ID = 1
PROFILE_REQUESTED_SCOPE = 2
PROFILE_GRANTED_SCOPE = 3


# sf_options_init / sf_sign_in_options_init write the library's whole struct, whose size may
# be larger in a newer library (fields are only appended). These buffers leave room for that;
# the caller then sets `size` to this binding's layout, which every later library accepts
# ("hosts built against an older header (a smaller size)").
_SLACK = 1024


class OptionsBuffer(ctypes.Structure):
    _fields_ = [("options", Options), ("slack", ctypes.c_ubyte * _SLACK)]


class SignInOptionsBuffer(ctypes.Structure):
    _fields_ = [("options", SignInOptions), ("slack", ctypes.c_ubyte * _SLACK)]


# ---- Loading and prototypes --------------------------------------------------------------

_loaded = _loader.load()
lib: ctypes.CDLL = _loaded.library
library_path: str = _loaded.path
library_source: str = _loaded.source

_P = ctypes.POINTER
_int, _u64, _i64, _size = ctypes.c_int, ctypes.c_uint64, ctypes.c_int64, ctypes.c_size_t
_ptr, _str = ctypes.c_void_p, ctypes.c_char_p

_PROTOTYPES: List[Tuple[str, Any, List[Any]]] = [
    ("sf_version", ctypes.c_uint, []),
    ("sf_version_string", _str, []),
    ("sf_strerror", _str, [_int]),
    ("sf_err_name", _str, [_int]),
    ("sf_last_error_message", _str, []),
    ("sf_options_init", None, [ctypes.c_void_p]),
    ("sf_runtime_create", _int, [ctypes.c_void_p, _P(_ptr)]),
    ("sf_runtime_start", _int, [_ptr]),
    ("sf_runtime_destroy_report", _int, [_ptr, _P(_size)]),
    ("sf_session_state_get", _int, [_ptr, _P(_int)]),
    ("sf_subscribe_session_state", _int, [_ptr, _P(Observer), _P(_u64)]),
    ("sf_subscribe_events", _int, [_ptr, _P(EventObserver), _P(_u64)]),
    ("sf_session_store_status", _int, [_ptr, _P(_int), _str, _size]),
    ("sf_subscribe_store_status", _int, [_ptr, _P(StoreObserver), _P(_u64)]),
    ("sf_subscription_close", _int, [_u64]),
    ("sf_session_sign_in", _int, [_ptr, _P(Tokens)]),
    ("sf_session_sign_in_replacing_store", _int, [_ptr, _P(Tokens)]),
    ("sf_session_sign_in_dpop", _int, [_ptr, _P(Tokens), ctypes.c_char_p]),
    ("sf_session_logout", _int, [_ptr]),
    ("sf_session_reconfigure", _int, [_ptr]),
    ("sf_session_is_logged_in", _int, [_ptr]),
    ("sf_session_member_id", _int, [_ptr, _str, _size]),
    ("sf_session_token_info", _int, [_ptr, _P(TokenInfoStruct)]),
    ("sf_session_token_scope", _int, [_ptr, _str, _size]),
    ("sf_session_accounts", _int, [_ptr, _str, _size, _P(_size)]),
    ("sf_session_active_account", _int, [_ptr, _str, _size]),
    ("sf_session_account_state", _int, [_ptr, _str, _P(_int)]),
    ("sf_session_account_profile", _int, [_ptr, _str, _int, _str, _size, _P(_size)]),
    ("sf_session_switch_account", _int, [_ptr, _str]),
    ("sf_session_add_account", _int, [_ptr, _P(Tokens)]),
    ("sf_session_logout_account", _int, [_ptr, _str]),
    ("sf_session_logout_all", _int, [_ptr]),
    ("sf_session_fresh_token", _int, [_ptr, TOKEN_FN, _ptr]),
    ("sf_session_notify_unauthorized", _int, [_ptr, _str]),
    ("sf_session_resume", _int, [_ptr]),
    ("sf_session_refresh_now", _int, [_ptr, TOKEN_FN, _ptr]),
    ("sf_session_authorize", _int, [_ptr, _str, _str, AUTHORIZE_FN, _ptr]),
    ("sf_session_unauthorized", _int, [_ptr, _str, _str, _str, _int, _str, AUTHORIZE_FN, _ptr]),
    ("sf_session_unauthorized_dpop", _int, [_ptr, _str, _str, _str, _int, _str, _str, AUTHORIZE_FN, _ptr]),
    ("sf_session_remember_dpop_nonce", _int, [_ptr, _str, _str]),
    ("sf_sign_in_options_init", None, [ctypes.c_void_p]),
    ("sf_session_sign_in_device", _int, [_ptr, ctypes.c_void_p, _P(SignInObserver), _P(_u64)]),
    ("sf_session_sign_in_browser", _int, [_ptr, ctypes.c_void_p, _P(SignInObserver), _P(_u64)]),
    ("sf_sign_in_cancel", _int, [_u64]),
    ("sf_refresh_request_succeed", _int, [_ptr, _P(Tokens)]),
    ("sf_refresh_request_fail", _int, [_ptr, _int, _i64]),
]

for _name, _restype, _argtypes in _PROTOTYPES:
    try:
        _function = getattr(lib, _name)
    except AttributeError as _error:
        raise _loader.LibraryNotFoundError(
            f"libsessionflow at {library_path} ({library_source}) has no {_name}: it is older than this "
            f"binding ({__version__}) expects. Use a library of version {__version__} or later.",
            name="sessionflow",
        ) from _error
    _function.restype = _restype
    _function.argtypes = _argtypes

DECLARED: Tuple[str, ...] = tuple(name for name, _, _ in _PROTOTYPES)


def _parse_version(text: str) -> Tuple[int, int, int]:
    major, minor, patch = (int(part) for part in text.split("."))
    return major, minor, patch


BINDING_VERSION = _parse_version(__version__)
_hex = int(lib.sf_version())
LIBRARY_VERSION = (_hex >> 16, (_hex >> 8) & 0xFF, _hex & 0xFF)
# The structs above are the binding's header: a library of another major version may lay
# them out differently, and an older one lacks fields this binding sets.
if LIBRARY_VERSION[0] != BINDING_VERSION[0] or LIBRARY_VERSION < BINDING_VERSION:
    raise _loader.LibraryNotFoundError(
        f"libsessionflow at {library_path} ({library_source}) is version "
        f"{'.'.join(map(str, LIBRARY_VERSION))}; this binding ({__version__}) needs "
        f"{BINDING_VERSION[0]}.x, at least {__version__}.",
        name="sessionflow",
    )


def text(value: "bytes | None") -> str:
    """A borrowed C string as str ("" for NULL); never raises on bad UTF-8."""
    return value.decode("utf-8", errors="replace") if value else ""


# ---- What Python exposes of the header ---------------------------------------------------
# tests/test_api_coverage.py checks: every function `Bindings/header-functions.sh` lists is in
# exactly one of these two; every EXPOSED target exists and its source calls that function.

EXPOSED: Dict[str, str] = {
    "sf_version": "version_info",
    "sf_version_string": "version",
    "sf_strerror": "strerror",
    "sf_err_name": "error_name",
    "sf_last_error_message": "last_error_message",
    "sf_runtime_create": "Runtime.__init__",
    "sf_runtime_start": "Runtime.start",
    "sf_runtime_destroy_report": "Runtime.destroy",
    "sf_session_state_get": "Runtime.state",
    "sf_subscribe_session_state": "Runtime.subscribe_state",
    "sf_subscribe_events": "Runtime.subscribe_events",
    "sf_session_store_status": "Runtime.store_status",
    "sf_subscribe_store_status": "Runtime.subscribe_store_status",
    "sf_subscription_close": "Subscription.close",
    "sf_session_sign_in": "Runtime.sign_in",
    "sf_session_sign_in_replacing_store": "Runtime.sign_in",
    "sf_session_sign_in_dpop": "Runtime.sign_in",
    "sf_session_unauthorized_dpop": "Runtime.unauthorized",
    "sf_session_remember_dpop_nonce": "Runtime.remember_dpop_nonce",
    "sf_session_logout": "Runtime.logout",
    "sf_session_reconfigure": "Runtime.reconfigure",
    "sf_session_is_logged_in": "Runtime.is_logged_in",
    "sf_session_member_id": "Runtime.member_id",
    "sf_session_token_info": "Runtime.token_info",
    "sf_session_token_scope": "Runtime.token_info",
    "sf_session_accounts": "Runtime.accounts",
    "sf_session_active_account": "Runtime.active_account",
    "sf_session_account_state": "Runtime.account_state",
    "sf_session_account_profile": "Runtime.profile",
    "sf_session_switch_account": "Runtime.switch_account",
    "sf_session_add_account": "Runtime.add_account",
    "sf_session_logout_account": "Runtime.logout_account",
    "sf_session_logout_all": "Runtime.logout_all",
    "sf_session_fresh_token": "Runtime.fresh_token",
    "sf_session_notify_unauthorized": "Runtime.notify_unauthorized",
    "sf_session_resume": "Runtime.resume",
    "sf_session_refresh_now": "Runtime.refresh_now",
    "sf_session_authorize": "Runtime.authorize",
    "sf_session_unauthorized": "Runtime.unauthorized",
    "sf_session_sign_in_device": "Runtime.sign_in_device",
    "sf_session_sign_in_browser": "Runtime.sign_in_browser",
    "sf_sign_in_cancel": "SignIn.cancel",
    "sf_refresh_request_succeed": "RefreshRequest.succeed",
    "sf_refresh_request_fail": "RefreshRequest.fail",
}

NOT_EXPOSED: Dict[str, str] = {
    # Fills an sf_options with the defaults: Runtime(...) calls it before applying its
    # keyword arguments; there is nothing else for Python to do with it.
    "sf_options_init": "used by Runtime.__init__ to start from the defaults; no use on its own",
    # Same for the sign-in flows' options.
    "sf_sign_in_options_init": "used by Runtime.sign_in_device/sign_in_browser for the defaults",
    # Runtime.destroy() calls sf_runtime_destroy_report, which is sf_runtime_destroy plus the
    # count of subscriptions never closed (destroy() returns it).
    "sf_runtime_destroy": "Runtime.destroy() uses sf_runtime_destroy_report (the same, plus the count)",
    # A borrowed runtime needs a libuv uv_loop_t that the host runs itself. Python has none to
    # lend: asyncio's loop is not libuv, and uvloop does not expose its uv_loop_t*. A loop made
    # through ctypes would need a thread of the host running uv_run, with create, destroy,
    # sign-in and logout confined to that thread (SF_ETHREAD): the owned runtime already is
    # exactly that, a libuv loop on a thread of its own. asyncio hosts use the bridge instead
    # (Runtime.states(), events(), store_statuses(), fresh_token_async()).
    "sf_runtime_create_on_loop": "Python has no libuv loop to lend (asyncio is not libuv): "
    "the owned runtime plus the asyncio bridge cover it",
}
