/*
 * sessionflow.h — the C API of SessionFlow (libsessionflow).
 *
 * An authenticated session that keeps itself alive (tokens refreshed before they
 * expire, backoff when the authority struggles, one refresh at a time), ends cleanly
 * (SF_SESSION_EXPIRED when the refresh token is dead; logout wipes everything), and that
 * C/FFI hosts observe through callbacks on one libuv loop thread.
 *
 * THREADING (the whole contract; every function also says where it may be called)
 *  1. Every callback (state, event, error, complete, release, token, refresh, prompt, done,
 *     authorize) runs on the runtime's loop thread — never inside the call that caused it,
 *     never while a library lock is held. A callback may call any function of this API, except
 *     sf_runtime_destroy on an owned runtime (SF_EBUSY).
 *  2. A new state subscriber first receives the current state, then each change
 *     (conflated: a slow observer skips intermediate states but always ends on the
 *     latest; never the same state twice in a row).
 *  3. sf_subscription_close is safe from any thread, any number of times. When it
 *     returns, no callback of that subscription is running or will start — except when
 *     called from inside that subscription's own callback: that callback finishes and
 *     nothing follows. (Off the loop thread it waits for the loop to finish calling that
 *     flow's subscribers, if it is.) The one way to deadlock: closing from a thread that a
 *     running callback of the same flow (state or events) is itself waiting for.
 *  4. `release(userdata)` runs exactly once for every successful subscribe, on the loop
 *     thread, after that subscription's last callback. A subscribe that fails takes no
 *     ownership: nothing is called, the host keeps its userdata.
 *  5. on_error / on_complete are terminal: at most one of them, once. Destroying the
 *     runtime completes every open subscription (on_complete), then releases it.
 *  6. A call that returns an error never invokes any of its callbacks.
 *  7. Tokens never appear in logs or error messages.
 *
 * Owned runtime (sf_runtime_create): the library runs a libuv loop on a thread of its
 * own. Borrowed runtime (sf_runtime_create_on_loop): the host's uv_loop_t, run by the
 * host; create and destroy on the thread that runs it; calls that wait for an answer
 * (sign in, logout, reconfigure, destroy) must be made on that thread too (SF_ETHREAD).
 *
 * MEMORY: strings passed in are copied before the call returns. Strings handed to a
 * callback are borrowed: valid only during that call.
 *
 * ERRORS: functions return SF_OK (0) or a negative SF_E* code. sf_strerror and
 * sf_err_name return static strings. Codes are only ever appended.
 *
 * LIMITS: the loop never queues without bound. At most 65 536 requests (any call that
 * hands work to the loop: tokens, sign-in, logout, resume...) wait for the loop at once,
 * and at most 10 000 token requests wait for an answer; a call beyond either limit
 * returns SF_EBUSY and queues nothing (a loop stuck in a host callback, or a refresh that
 * hangs). Answers to work already accepted are never refused. Destroy with a full queue
 * answers every accepted request and returns.
 */
#ifndef SESSIONFLOW_H
#define SESSIONFLOW_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Version ---------------------------------------------------------------- */

#define SF_VERSION_MAJOR 0
#define SF_VERSION_MINOR 2
#define SF_VERSION_PATCH 0
#define SF_VERSION_HEX ((SF_VERSION_MAJOR << 16) | (SF_VERSION_MINOR << 8) | SF_VERSION_PATCH)

/* The library's version as SF_VERSION_HEX (compare with the header's). Any thread. */
unsigned int sf_version(void);
/* The library's version as "MAJOR.MINOR.PATCH" (static). Any thread. */
const char *sf_version_string(void);

/* ---- Errors ------------------------------------------------------------------- */

#define SF_ERRNO_MAP(XX)                                                                  \
    XX(EINVAL, -1, "invalid argument")                                                    \
    XX(ECLOSED, -2, "unknown, closed or already completed handle")                        \
    XX(EBUSY, -3, "busy: would wait for itself, or too many requests already waiting")   \
    XX(ETHREAD, -4, "must be called on the thread that runs the borrowed loop")           \
    XX(ESTATE, -5, "not allowed in the current session state")                            \
    XX(ESTORE, -6, "credential store failure")                                            \
    XX(EAUTH, -7, "the authority refused for good: the session has expired")              \
    XX(ENETWORK, -8, "transient failure (network, timeout, 5xx, 429): retried later")     \
    XX(ERANGE, -9, "buffer too small")                                                    \
    XX(ESHUTDOWN, -10, "the runtime is shutting down or shut down")                       \
    XX(ECONFIG, -11, "the authority rejected the client configuration")                   \
    XX(ENOTLOGGEDIN, -12, "no one is signed in")                                          \
    XX(EUNAUTHORIZED, -13, "a freshly refreshed token was refused again")                 \
    XX(ESESSIONENDED, -14, "the session ended (logout or new sign-in) before the answer") \
    XX(ECANCELLED, -15, "the sign-in was cancelled")                                      \
    XX(EDENIED, -16, "the user or the authority refused the sign-in")                     \
    XX(EEXPIRED, -17, "the sign-in took too long: start it again")

typedef enum sf_error {
    SF_OK = 0,
#define SF_ERROR_ENUM_(name, value, text) SF_##name = value,
    SF_ERRNO_MAP(SF_ERROR_ENUM_)
#undef SF_ERROR_ENUM_
} sf_error;

/* A short description of `code` (static; "unknown error" for an unknown code). Any thread. */
const char *sf_strerror(int code);
/* The name of `code`, e.g. "SF_EINVAL" (static; "SF_EUNKNOWN" for an unknown code). Any thread. */
const char *sf_err_name(int code);
/* Why the last call on this thread that returned a negative code failed, in one line that
 * names the call and what was wrong, e.g. "sf_runtime_create: sf_options.token_endpoint uses
 * plain http to a host that is not loopback" or "sf_session_sign_in: signed in already: log
 * out first"; the code's sf_strerror text when there is nothing more to say. Like errno:
 * a call that succeeds leaves it as it was, so read it right after the failing call. NULL
 * before the thread's first failure. The text is the thread's own, valid until its next
 * failing call; never a token or key. Any thread. One more writer: a failing answer
 * (sf_authorize_fn, sf_token_fn with a negative `result`) sets it on the thread that runs the
 * callback, just before calling it — "sf_session_authorize (answer): <the session's reason>";
 * read it first thing in the callback. That thread is the loop's: on a borrowed loop it is
 * yours, inside uv_run or inside a call that answers waiting requests there (sf_session_logout
 * fails them), which then leaves this message set although it succeeded. */
const char *sf_last_error_message(void);

/* ---- Types -------------------------------------------------------------------- */

/* A runtime: one loop, one session. Opaque; never dereference. */
typedef struct sf_runtime sf_runtime;

/* A subscription handle. 0 is "none"; handles are never reused within a process, so a
 * closed or unknown handle yields SF_ECLOSED, never a crash.
 * Every handle (runtime, refresh request, subscription, sign-in) is a number from one
 * process-wide counter carrying its kind in its low 3 bits: no two handles are equal, and a
 * handle of one kind given where another kind is expected finds nothing (SF_ECLOSED, as an
 * unknown one), never the object of another kind. */
typedef uint64_t sf_subscription;

/* A refresh the host performs (see sf_options.refresh). Opaque. */
typedef struct sf_refresh_request sf_refresh_request;

/* libuv's loop type, for sf_runtime_create_on_loop (include <uv.h> to create one). */
struct uv_loop_s;

typedef enum sf_session_state {
    SF_LOGGED_OUT = 0,
    SF_LOGGED_IN = 1,
    SF_SESSION_EXPIRED = 2
} sf_session_state;

/* Observer of the session state. Any callback may be NULL, but not all of them (SF_EINVAL: a
 * subscription that can call nothing would only leak). `size` first, as in every struct a
 * host passes in: only sizes of released layouts are accepted (SF_EINVAL otherwise), so a
 * host built against another header is refused, never read half-way through a pointer.
 * Initialize with a designated initializer:
 *     sf_observer observer = {.size = sizeof(sf_observer), .on_state = on_state, .userdata = p}; */
typedef struct sf_observer {
    size_t size; /* set to sizeof(sf_observer); any other value is SF_EINVAL */
    void (*on_state)(sf_session_state state, void *userdata);
    void (*on_error)(int code, const char *message, void *userdata);
    void (*on_complete)(void *userdata);
    void (*release)(void *userdata);
    void *userdata;
} sf_observer;

typedef enum sf_event_kind {
    SF_EVENT_INITIAL_SESSION = 1, /* state: the state read from the store at start */
    SF_EVENT_SIGNED_IN = 2,       /* member_id (may be NULL) */
    SF_EVENT_SIGNED_OUT = 3,      /* reason: "userRequested" or "reconfigured" */
    SF_EVENT_TOKEN_REFRESHED = 4, /* expires_in_ms; reason: why it was refreshed */
    SF_EVENT_REFRESH_FAILED = 5,  /* attempt, retry_in_ms (-1: none scheduled), code, reason */
    SF_EVENT_SESSION_EXPIRED = 6, /* reason */
    SF_EVENT_VALIDATED = 7,
    SF_EVENT_STORE_ERROR = 8,     /* reason */
    SF_EVENT_ACCOUNT_SWITCHED = 9 /* member_id: the account key now active (sf_session_switch_account,
                                     or signed out here, following another process to an account
                                     this runtime has in the background) */
} sf_event_kind;

/* A session event. Strings are borrowed for the duration of the callback. member_id is the
 * host's (sf_tokens.member_id) or the server's (a userinfo `sub`, a refresh answer) as it was
 * given: valid UTF-8, but it may hold any character, bidi and control characters included —
 * escape it for your terminal or log. reason is the library's words, printable. */
typedef struct sf_event {
    size_t size; /* sizeof(sf_event) of the library that filled it */
    sf_event_kind kind;
    sf_session_state state;
    const char *member_id;
    const char *reason;
    int code;
    int attempt;
    int64_t retry_in_ms;
    int64_t expires_in_ms;
} sf_event;

/* Observer of session events. Any callback may be NULL. */
typedef struct sf_event_observer {
    size_t size; /* set to sizeof(sf_event_observer); any other value is SF_EINVAL */
    void (*on_event)(const sf_event *event, void *userdata);
    void (*on_error)(int code, const char *message, void *userdata);
    void (*on_complete)(void *userdata);
    void (*release)(void *userdata);
    void *userdata;
} sf_event_observer;

/* Whether the session has its credential store's answer. Observed next to the state, it
 * tells "no session" (SF_LOGGED_OUT, SF_STORE_AVAILABLE) from "cannot read the session
 * yet" (SF_LOGGED_OUT, SF_STORE_READING or SF_STORE_UNAVAILABLE): a host shows a sign-in
 * screen only for the first. */
typedef enum sf_store_status {
    SF_STORE_READING = 0,    /* the stored session is being read (a runtime made on a borrowed
                                loop's thread, which never waits for the store): the state says
                                SF_LOGGED_OUT until the read answers, then what the store holds */
    SF_STORE_AVAILABLE = 1,  /* the store answered its last read or write */
    SF_STORE_UNAVAILABLE = 2 /* the store cannot be read (the stored session is restored once
                                it can: read again every few seconds) or missed a write (the
                                session goes on in memory; written again later); reason says why */
} sf_store_status;

/* Observer of the store status. Any callback may be NULL. `reason` (borrowed for the call)
 * is "" unless the status is SF_STORE_UNAVAILABLE; it names paths and causes, never a token. */
typedef struct sf_store_observer {
    size_t size; /* set to sizeof(sf_store_observer); any other value is SF_EINVAL */
    void (*on_status)(sf_store_status status, const char *reason, void *userdata);
    void (*on_error)(int code, const char *message, void *userdata);
    void (*on_complete)(void *userdata);
    void (*release)(void *userdata);
    void *userdata;
} sf_store_observer;

/* Tokens for a sign-in or a completed refresh. Strings are copied. Limits (beyond them, or
 * another size, the call is SF_EINVAL and sf_last_error_message names the field): tokens at
 * most 65 536 bytes each, kept byte for byte; member_id at most 1 024 bytes of valid UTF-8
 * (so it comes back exactly as given: invalid bytes would come back changed, and two ids
 * could become one account). Account keys (sf_session_switch_account...) follow the member
 * id's rule. A member id may hold any character: the library's log lines write control,
 * format and bidi characters as \u{..}, whatever their source. */
typedef struct sf_tokens {
    size_t size;               /* set to sizeof(sf_tokens) */
    const char *access_token;  /* required, not blank; at most 65 536 bytes */
    const char *refresh_token; /* may be NULL (no refresh possible; for a refresh: keep the old one) */
    int64_t expires_in;        /* seconds the access token lives (negative counts as 0) */
    const char *member_id;     /* may be NULL (for a refresh: keep the old one); UTF-8, <= 1 024 bytes */
} sf_tokens;

/* Receives a token: result is SF_OK and access_token (borrowed) the token, or a negative
 * code and access_token NULL. Runs on the loop thread, exactly once per accepted call. */
typedef void (*sf_token_fn)(int result, const char *access_token, void *userdata);

/* The host's refresher: called on the loop thread with the refresh token (borrowed).
 * Complete `request` exactly once, from any thread, now or later, with
 * sf_refresh_request_succeed or sf_refresh_request_fail. If it never answers, the
 * refresh times out (refresh_timeout_ms) and is retried with backoff (with
 * `sf_options.refresh_cancel` set, it is cancelled first and waited for). A request still
 * open when the runtime is destroyed is closed by sf_runtime_destroy: completing it then
 * returns SF_ECLOSED and calls nothing. Never called after sf_runtime_destroy returned;
 * `sf_options.refresh_release` tells when its userdata may be freed. */
typedef void (*sf_refresh_fn)(sf_refresh_request *request, const char *refresh_token, void *userdata);

/* Levels of sf_options.log, as swift-log's. */
typedef enum sf_log_level {
    SF_LOG_TRACE = 0,
    SF_LOG_DEBUG = 1,
    SF_LOG_INFO = 2,
    SF_LOG_NOTICE = 3,
    SF_LOG_WARNING = 4,
    SF_LOG_ERROR = 5,
    SF_LOG_CRITICAL = 6
} sf_log_level;

typedef struct sf_options {
    size_t size;                 /* set by sf_options_init */
    /* When a token is refreshed by itself. Its latest point is expiry − m, where m is
     * min(refresh_margin_ms, half the token's lifetime) (default margin 300000: a 1-hour
     * token's latest point is 55 min; a 5-minute token's, half-life). The refresh is due at a
     * random point of a window that ends at that latest point and reaches back 46% of the
     * time from the token's issue to it, at most one hour; the density falls linearly
     * towards the earliest point (on average a third of the way back). So a 1-hour token is
     * refreshed between 29.7 and 55 min after issue, on average at 46.6 min — never after the
     * latest point, never before issue, and never sooner than min_refresh_interval_ms after
     * the last refresh. A token request (sf_session_fresh_token) within m of expiry refreshes
     * at once. 0 refreshes only at expiry (and on request). docs/reliability.md says
     * why the jitter has this shape. */
    int64_t refresh_margin_ms;
    /* An unanswered refresh fails after this (default 30000; 1 to 600000). With the built-in OAuth
     * authority, a refresh whose answer is arriving (its 2xx status line is in: the server has
     * rotated the refresh token) is not cancelled then: it ends only when no byte arrives for
     * refresh_timeout_ms (a stall) or at 4 x refresh_timeout_ms from its start (the cap). If that
     * answer is lost anyway (dropped mid-body, stalled), SF_EVENT_REFRESH_FAILED reports it
     * with retry_in_ms 0 and a reason starting "transient answer_lost: the server accepted
     * the refresh (HTTP 200) but its answer was lost", and the same refresh token is sent
     * once more at once (servers accept it within their reuse grace period); a second loss
     * backs off as usual. docs/session.md has the rule. */
    int64_t refresh_timeout_ms;
    int64_t min_backoff_ms;      /* first retry delay after a transient failure (default 1000) */
    int64_t max_backoff_ms;      /* cap of the doubling retry delay (default 30000) */
    sf_refresh_fn refresh;       /* the host's refresher; NULL: refreshes fail with SF_ECONFIG */
    void *refresh_userdata;      /* handed to `refresh`; owned by the host */
    int64_t min_refresh_interval_ms; /* never refresh sooner than this after a refresh (default 10000) */
    /* The built-in OAuth 2.0 authority (used when `refresh` is NULL and token_endpoint is
     * set). Strings are copied; NULL means "not used". */
    const char *token_endpoint;         /* RFC 6749 token endpoint (refresh_token grant) */
    const char *client_id;              /* required with token_endpoint */
    const char *client_secret;          /* confidential clients (client_secret_post); NULL: public */
    const char *scope;                  /* requested on refresh; NULL keeps the grant's */
    const char *revocation_endpoint;    /* RFC 7009, used on logout */
    const char *introspection_endpoint; /* RFC 7662, used by sf_session_resume */
    /* The encrypted file store (AES-GCM, key file beside it), shared safely by several
     * processes; NULL: the session lives in memory only. Created 0700 if missing (files
     * 0600); an existing directory must be the process's own and not writable by group or
     * others, and is never chmod-ed. Links, foreign or shared files are refused: a store
     * error (SF_EVENT_STORE_ERROR) naming the path and the reason. */
    const char *store_directory;
    /* Frees `refresh_userdata` (NULL: the host frees it itself, after the runtime is gone).
     * A runtime that was created (SF_OK) calls it exactly once, whether or not `refresh`
     * is set, on the loop thread, during the teardown of sf_runtime_destroy: after the last
     * call of `refresh` has returned and after every sf_refresh_request it handed out has
     * become SF_ECLOSED. Nothing is called with `refresh_userdata` after it. Owned
     * runtime: it has run when sf_runtime_destroy returns. Borrowed runtime: it runs on
     * the host's next loop iteration (the teardown; see sf_runtime_destroy), before the
     * host's uv_run can return. A create that fails never calls it. Hosts built against
     * an older header (a smaller `size`) have none. */
    void (*refresh_release)(void *refresh_userdata);
    /* Start-up events (SF_EVENT_INITIAL_SESSION, a start-up SF_EVENT_STORE_ERROR) are
     * emitted once, when the session starts. 0 (default): it starts by itself on the
     * loop's first turn after create — subscribe to events right after create to see them,
     * racing that turn. 1: it waits for sf_runtime_start, so subscribe first, then start,
     * and no start-up event is missed. Any session call before sf_runtime_start starts it
     * first. Hosts built against an older header (a smaller `size`) have 0. */
    int start_manually;
    /* Cancels a refresh the host is performing. A refresh request that may already have
     * reached the server may have rotated (used up) the refresh token: sending the old
     * token again while it is still running gets the whole session revoked by servers that
     * detect reuse. So when a request of `refresh` is still open after refresh_timeout_ms,
     * this is called (once, on the loop thread, with that request and refresh_userdata):
     * stop it, then complete it as usual — sf_refresh_request_fail(request, SF_ENETWORK,
     * -1) when it was stopped, or sf_refresh_request_succeed if the tokens arrived after
     * all (they are kept). Until it is completed the session sends no other refresh and
     * its callers keep waiting; if it is not completed within another refresh_timeout_ms,
     * the session gives up on it (logged as an error) and retries with backoff. Never
     * called for a request already completed, nor after sf_runtime_destroy has returned
     * (destroy closes the open requests: SF_ECLOSED).
     * NULL (default, and hosts built against an older header): the host's refreshes cannot
     * be cancelled; one still open at refresh_timeout_ms is counted as failed then (a
     * success that comes later for the current refresh token is still kept). */
    void (*refresh_cancel)(sf_refresh_request *request, void *refresh_userdata);
    /* Where the file store's key comes from (with store_directory; docs/storage-and-oauth.md,
     * "Threat model of the store", says what each protects against). In this order:
     *  1. A key the host supplies: `store_key` (exactly 32 bytes, store_key_size 32; copied
     *     by sf_runtime_create*, so the host may wipe its buffer once that returns) or
     *     `store_key_file` (the path of a file holding 32 bytes or 64 hex digits; it must be a
     *     regular file of this user with no group/other permission, in a directory of this
     *     user not writable by group or others; read once, at create). At most one of them.
     *     The host's key encrypts the store's own data key (kept in `<store>.key`), which
     *     logout rotates; the library cannot rotate the host's key itself.
     *  2. `store_key_source` (when neither is set): SF_STORE_KEY_AUTOMATIC (0, default: the
     *     desktop Secret Service when a session bus and the service answer, else a key file
     *     beside the store), SF_STORE_KEY_FILE, SF_STORE_KEY_SECRET_SERVICE (required: the
     *     store is unavailable without it). An existing store is only ever opened with the
     *     source that sealed it (its header says which): a store whose key is in the Secret
     *     Service, opened without a session bus, reports SF_EVENT_STORE_ERROR and is never
     *     overwritten.
     * Bad values (a size other than 0 or 32, a key with a NULL pointer, both a key and a key
     * file, a key without store_directory, an unreadable key file, an unknown source) make
     * create fail with SF_EINVAL, the field named in the log. Hosts built against an older
     * header (a smaller `size`) have none of these: SF_STORE_KEY_AUTOMATIC. */
    const unsigned char *store_key;
    size_t store_key_size;
    const char *store_key_file;
    int store_key_source;
    /* The built-in OAuth 2.0 authority from an issuer alone (copied; NULL: not used): when
     * `refresh` and `token_endpoint` are NULL, the token, revocation and introspection
     * endpoints come from this issuer's metadata (RFC 8414, OpenID Connect Discovery as the
     * fallback), fetched on the loop the first time the session needs them (a refresh, a
     * logout's revocation, sf_session_resume) and kept; until then nothing is sent. A
     * discovery that gets no answer (or HTTP 408, 429, 5xx) fails that refresh as transient
     * (retried with backoff, tokens kept); a refused document fails it as SF_ECONFIG. Needs
     * client_id. It is also the issuer of sign-in flows whose sf_sign_in_options.issuer is
     * NULL. An issuer that is not https (or http to loopback), or has a query or fragment,
     * makes create fail with SF_EINVAL (named in the log). Hosts built against an older
     * header (a smaller `size`) have none. */
    const char *issuer;
    /* Where the library's log lines go. NULL (default): standard error, warnings and above
     * (more with the environment variable SESSIONFLOW_LOG=trace|debug|info|notice). Set: each
     * line of this runtime at `log_level` or above is handed to it instead (SESSIONFLOW_LOG is
     * then ignored), from the thread that logs — the loop thread mostly, or the host's thread
     * inside a call (sf_runtime_create reports a refused option this way) — one line at a time
     * per runtime, never two at once. `line` (borrowed, no newline) is the logger's label, the
     * message and its metadata, e.g. "sessionflow: refresh failed, retrying attempt=1
     * retryIn=1.0 seconds"; never a token or key. Return promptly: other threads that log
     * wait meanwhile, so never wait there for a thread that may be calling the library (the
     * loop thread above all: a deadlock). Do not call the library from it (a line the library
     * logs on the same thread is dropped; sf_runtime_destroy of its runtime is SF_EBUSY).
     * Nothing is handed to it after sf_runtime_destroy's teardown (owned: before destroy
     * returns; borrowed: once the host's uv_run has returned after destroy; a create that
     * fails logs its reason first), so `log_userdata` must live until then. Hosts built
     * against an older header (a smaller `size`) have none. */
    void (*log)(int level, const char *line, void *log_userdata); /* level: an sf_log_level */
    void *log_userdata;
    int log_level; /* an sf_log_level: the lowest level handed to `log` (default SF_LOG_INFO) */
    /* Sender-constrained tokens (DPoP, RFC 9449) for the built-in OAuth 2.0 client's sign-in
     * flows: SF_DPOP_OFF (0, default: bearer tokens), SF_DPOP_REQUIRED (every sign-in makes a
     * new ES256 key and proves it; a token answer whose token_type is not DPoP — the server
     * ignored the proof — fails the sign-in with SF_ECONFIG), SF_DPOP_IF_SUPPORTED (DPoP when
     * the issuer's metadata lists ES256 in dpop_signing_alg_values_supported, bearer tokens
     * otherwise). The key is sealed in the store record with the tokens and wiped with them at
     * logout; every refresh carries a proof by it, and sf_session_authorize then answers
     * `Authorization: DPoP <token>` plus a `DPoP: <proof>` header (scheme "DPoP"). A server
     * nonce (use_dpop_nonce) costs one retry of a refresh; a server that demands a new one
     * again fails that refresh with SF_ECONFIG. Another value makes create fail with
     * SF_EINVAL. Hosts built against an older header (a smaller `size`) have SF_DPOP_OFF. */
    int dpop;
} sf_options;

/* Values of sf_options.store_key_source. */
#define SF_STORE_KEY_AUTOMATIC 0
#define SF_STORE_KEY_FILE 1
#define SF_STORE_KEY_SECRET_SERVICE 2

/* Values of sf_options.dpop. */
#define SF_DPOP_OFF 0
#define SF_DPOP_REQUIRED 1
#define SF_DPOP_IF_SUPPORTED 2

/* ---- Options -------------------------------------------------------------------- */

/* Fills `options` with the defaults (and its size). Any thread. NULL is ignored. */
void sf_options_init(sf_options *options);

/* ---- Runtime -------------------------------------------------------------------- */

/* Creates a runtime with a loop thread of its own. `options` may be NULL (defaults).
 * On success *out is the runtime; on failure *out is untouched.
 * Returns SF_OK, SF_EINVAL (NULL out, bad options: sf_last_error_message names the field
 * and what is wrong with it, and it is logged). Any thread. */
int sf_runtime_create(const sf_options *options, sf_runtime **out);

/* Creates a runtime on the host's loop. Call on the thread that runs `loop`; the host
 * keeps running it. After sf_runtime_destroy, the host's uv_run returns once its own
 * handles are closed, and uv_loop_close gives 0.
 * Returns SF_OK, SF_EINVAL (as sf_runtime_create). Thread: the loop's thread. */
int sf_runtime_create_on_loop(struct uv_loop_s *loop, const sf_options *options, sf_runtime **out);

/* Starts the session of a runtime created with `start_manually`: restores what the
 * store held and emits the start-up events (see sf_options.start_manually), on the loop
 * thread, never inside this call. A second call, or one on a runtime that started by
 * itself, does nothing. Returns SF_OK, SF_EINVAL (NULL), SF_ECLOSED, SF_ESHUTDOWN.
 * Any thread. */
int sf_runtime_start(sf_runtime *runtime);

/* Destroys the runtime: completes every open subscription (on_complete, then release),
 * ends every running sign-in (its flow stopped; on_done SF_ESHUTDOWN, then release),
 * answers every pending token request with SF_ESHUTDOWN, stops every timer, closes the
 * host's refresher and runs `refresh_release`. The session stays in the store. NULL is a
 * no-op (SF_OK). A destroyed runtime yields SF_ECLOSED (so does destroying it twice).
 * When it returns SF_OK, in both modes: every call with the runtime is SF_ECLOSED; the
 * host's `refresh` is never called again (a `refresh` call that is itself making this
 * call finishes, nothing follows); every sf_refresh_request still open is SF_ECLOSED (a
 * late succeed/fail changes nothing).
 * From inside the runtime's sf_options.log function: SF_EBUSY (it would wait for itself).
 * Owned: any thread but the loop's (SF_EBUSY there); returns when the teardown is done:
 * every subscription callback, token answer and `refresh_release` has run, and nothing
 * of the host's is called after it returns; the store work the session submitted (its
 * last write or clear) has landed too.
 * Borrowed: the loop's thread only (SF_ETHREAD). The teardown runs in the host's next
 * loop iteration, never inside this call, on the loop thread, in this order: the work
 * accepted before this call (it may deliver states and events, but never calls
 * `refresh`), the pending token answers (SF_ESHUTDOWN), the running sign-ins (on_done
 * SF_ESHUTDOWN, then release), `refresh_release`, then
 * on_complete and release of each open subscription. After that teardown nothing of the
 * host's is called again (no timer, no refresher). Keep running the loop until uv_run
 * returns: the runtime keeps it alive until its teardown is done, then uv_run returns
 * once the host's own handles are closed. (An owned runtime's teardown is the same, on
 * its own loop thread, before this call returns.) The store work the session submitted
 * (its last write or clear) lands on the session's store worker thread, which a borrowed
 * loop never waits for: it may still be running when uv_run returns (a process that exits
 * at once then keeps the store as before that write — atomic replace: never a mix). */
int sf_runtime_destroy(sf_runtime *runtime);

/* Like sf_runtime_destroy, and stores in *unclosed (may be NULL) how many
 * subscriptions were never closed by the host (leak diagnostics). Returns and threads as
 * sf_runtime_destroy. */
int sf_runtime_destroy_report(sf_runtime *runtime, size_t *unclosed);

/* ---- Observing ------------------------------------------------------------------ */

/* The current state, point in time. Any thread. Returns SF_OK, SF_EINVAL, SF_ECLOSED. */
int sf_session_state_get(sf_runtime *runtime, sf_session_state *out);

/* Subscribes to the session state (the current state first). The observer is copied;
 * `observer->userdata` is owned by the subscription until `release` runs.
 * Returns SF_OK and *out, or SF_EINVAL, SF_ECLOSED, SF_ESHUTDOWN (nothing is then called).
 * Any thread. Called off the loop thread, the first callbacks may run on the loop thread
 * before this call has written *out: a callback that needs the handle gets it from the
 * host under the host's own lock (or subscribe on the loop thread). */
int sf_subscribe_session_state(sf_runtime *runtime, const sf_observer *observer, sf_subscription *out);

/* Subscribes to session events (only those after this call). Same ownership and returns
 * as sf_subscribe_session_state. Any thread. */
int sf_subscribe_events(sf_runtime *runtime, const sf_event_observer *observer, sf_subscription *out);

/* The store status, point in time, in *out; with `reason` non-NULL, also why the store is
 * unavailable (NUL-terminated; "" for the other statuses; never a token) — `reason` may be
 * NULL (then `length` is ignored). Returns SF_OK, SF_EINVAL (NULL out), SF_ERANGE (`length`
 * too small for the reason: nothing written), SF_ECLOSED. Any thread. */
int sf_session_store_status(sf_runtime *runtime, sf_store_status *out, char *reason, size_t length);

/* Subscribes to the store status: the current status first, then each change (conflated,
 * as the state: never the same status and reason twice in a row). Same ownership and
 * returns as sf_subscribe_session_state; the observer's on_complete runs when the runtime
 * is destroyed. Any thread. */
int sf_subscribe_store_status(sf_runtime *runtime, const sf_store_observer *observer, sf_subscription *out);

/* Closes a subscription (see THREADING 3). Returns SF_OK the first time, SF_ECLOSED for
 * 0, an unknown handle or one already closed or completed. Any thread. */
int sf_subscription_close(sf_subscription subscription);

/* ---- Session -------------------------------------------------------------------- */

/* Signs in (LOGGED_OUT or SESSION_EXPIRED → LOGGED_IN). Returns SF_OK, SF_EINVAL (NULL or
 * blank access token), SF_ESTATE (already signed in: log out first), SF_ESTORE (the stored
 * session is not known — see below), SF_ECLOSED, SF_ESHUTDOWN, SF_ETHREAD (borrowed loop,
 * off its thread). Owned: any thread (waits for the loop unless called on it). Returns once
 * signed in in memory; the store's write lands shortly after, on the session's store worker
 * thread (see sf_session_logout).
 * A sign-in never replaces a stored session the runtime has not read: while the store status
 * is SF_STORE_UNAVAILABLE because the store could not be read since the start, or still
 * SF_STORE_READING (a borrowed runtime, before its first read answered), it fails with
 * SF_ESTORE and changes nothing. Wait for sf_subscribe_store_status to report
 * SF_STORE_AVAILABLE (the stored session, if any, is then restored), or sign in with
 * sf_session_sign_in_replacing_store. (An SF_STORE_UNAVAILABLE from a missed write, after
 * the store was read, does not refuse sign-ins.) */
int sf_session_sign_in(sf_runtime *runtime, const sf_tokens *tokens);

/* sf_session_sign_in, replacing a store the runtime cannot read (yet): the host's choice to
 * drop whatever the store holds. The session is signed in in memory; its write replaces the
 * stored session once the store takes writes (the file store refuses to write over a file it
 * cannot read: SF_EVENT_STORE_ERROR, retried). When the store's read answers later, what it
 * held is not restored: this sign-in wins. With the store's answer known (SF_STORE_AVAILABLE)
 * it is exactly sf_session_sign_in (SF_ESTATE if a stored session was restored). Returns,
 * threads: as sf_session_sign_in, never SF_ESTORE. */
int sf_session_sign_in_replacing_store(sf_runtime *runtime, const sf_tokens *tokens);

/* sf_session_sign_in for a host that signed in with DPoP (RFC 9449) itself: `dpop_key` is the
 * key its tokens are bound to, base64url (43 characters, no padding) of a P-256 private key's
 * 32 bytes. The session keeps it (sealed in the store record with the tokens, wiped with them
 * at logout), proves it on every refresh, and answers sf_session_authorize with scheme
 * "DPoP": `Authorization: DPoP <token>` and a `DPoP: <proof>` header. Copied into the
 * library's secret memory: the host may wipe its buffer once the call returns. Returns,
 * threads: as sf_session_sign_in; SF_EINVAL also for a NULL `dpop_key` or one that is not a
 * key (named in sf_last_error_message). */
int sf_session_sign_in_dpop(sf_runtime *runtime, const sf_tokens *tokens, const char *dpop_key);

/* Logs out: the store's clear submitted first (before anything the session stores
 * after it), every timer and retry stopped, a refresh in flight cancelled (its answer
 * discarded), then the
 * tokens revoked best effort. Returns once the logout took effect in memory (state,
 * sf_session_is_logged_in); the clear itself lands shortly after on the session's store
 * worker thread (store work never runs on the loop thread), and a failure is reported
 * as SF_EVENT_STORE_ERROR (retried; never undoing the logout). An owned runtime's
 * sf_runtime_destroy returns only after it has landed. Returns SF_OK, SF_ESTATE (no one
 * signed in), SF_ECLOSED, SF_ESHUTDOWN, SF_ETHREAD. Threads: as sf_session_sign_in. */
int sf_session_logout(sf_runtime *runtime);

/* SESSION_EXPIRED → LOGGED_OUT, forgetting the member id. Returns and threads as
 * sf_session_logout. */
int sf_session_reconfigure(sf_runtime *runtime);

/* 1 if a non-blank access token is held, 0 if not, or a negative code (SF_EINVAL,
 * SF_ECLOSED): a local check, no network. Any thread. */
int sf_session_is_logged_in(sf_runtime *runtime);

/* Copies the member id (NUL-terminated; "" when there is none) into `buffer`.
 * Returns SF_OK, SF_EINVAL (NULL buffer), SF_ERANGE (`length` too small: nothing
 * written), SF_ECLOSED. Any thread. */
int sf_session_member_id(sf_runtime *runtime, char *buffer, size_t length);

/* The access token's details (never the token itself), filled in by
 * sf_session_token_info. Set `size` to sizeof(sf_token_info) before the call. */
typedef struct sf_token_info {
    size_t size;                /* set to sizeof(sf_token_info) */
    char token_type[16];        /* "Bearer", or "DPoP" for a sender-constrained session (NUL-terminated) */
    int64_t expires_in_ms;      /* time left, monotonic clock (negative: expired); INT64_MIN: unknown */
    int64_t expires_at_unix_ms; /* when it expires, wall clock (ms since the Unix epoch); 0: unknown */
} sf_token_info;

/* Fills *out (whose `size` the host set) with the current access token's type and expiry:
 * a point-in-time reading, no network. Returns SF_OK, SF_EINVAL (NULL out, `size` not
 * sizeof(sf_token_info)), SF_ECLOSED, SF_ESTATE (no access token: signed out, or the
 * session expired; *out untouched). Any thread. */
int sf_session_token_info(sf_runtime *runtime, sf_token_info *out);

/* Copies the scope granted to the access token (RFC 6749 §3.3: space-separated names,
 * NUL-terminated) into `buffer`: the token endpoint's `scope`, else the scope the sign-in
 * asked for; a refresh whose answer has no `scope` keeps it. "" when not known (signed in
 * with sf_tokens, or no access token). Returns SF_OK, SF_EINVAL (NULL buffer), SF_ERANGE
 * (`length` too small: nothing written), SF_ECLOSED. Any thread. */
int sf_session_token_scope(sf_runtime *runtime, char *buffer, size_t length);

/* ---- Several accounts ----------------------------------------------------------- */
/* A session on a store_directory keeps one record per account (the member id it signed in
 * with; "default" without one) and one session per account: each refreshes on its own, and
 * the active one drives the state, the events and sf_session_* calls. A switch emits
 * SF_EVENT_ACCOUNT_SWITCHED; it refreshes, cancels and signs out nothing. An account signed
 * out — here or by another process sharing the store — leaves the list. While signed out, the
 * runtime follows the account another process signs in and makes active: SF_EVENT_SIGNED_IN, or
 * SF_EVENT_ACCOUNT_SWITCHED to its session here if that account is in the background. Without a
 * store_directory there is one account at most. sf_session_sign_in signs in the active
 * account (SF_ESTATE if that account is signed in already, here or in the background:
 * switch to it); sf_session_logout signs out the active one only. */

/* Copies the account keys, sorted, each NUL-terminated, then one more NUL (an empty key
 * ends the list: "alice\0bob\0\0"; no account: "\0") into `buffer`, and stores in
 * *needed (may be NULL) the bytes the list takes, whether it fits or not — pass a NULL
 * buffer with length 0 to ask. Returns SF_OK, SF_ERANGE (`length` too small: nothing
 * written), SF_EINVAL (NULL buffer with a length), SF_ECLOSED. Any thread: a snapshot (a
 * borrowed runtime lists its accounts once the store has been read: see
 * sf_session_store_status). */
int sf_session_accounts(sf_runtime *runtime, char *buffer, size_t length, size_t *needed);

/* Copies the active account's key (NUL-terminated; "" when none is signed in) into
 * `buffer`. Returns as sf_session_member_id. Any thread. */
int sf_session_active_account(sf_runtime *runtime, char *buffer, size_t length);

/* Stores in *out the state of `account`'s session (SF_LOGGED_IN or SF_SESSION_EXPIRED).
 * Returns SF_OK, SF_EINVAL (NULL argument, or no such account), SF_ECLOSED. Any thread. */
int sf_session_account_state(sf_runtime *runtime, const char *account, sf_session_state *out);

/* The parts of an account's profile sf_session_account_profile reads. */
typedef enum sf_profile_field {
    SF_PROFILE_ISSUER = 0,          /* the issuer URL the account signed in with (discovery) */
    SF_PROFILE_CLIENT_ID = 1,       /* the client the tokens were issued to */
    SF_PROFILE_REQUESTED_SCOPE = 2, /* the scope the sign-in asked for ("" when none) */
    SF_PROFILE_GRANTED_SCOPE = 3    /* the scope granted now: the sign-in's, replaced by a refresh
                                     * whose answer names a scope ("" when not known) */
} sf_profile_field;

/* Copies one field of `account`'s profile — who minted its tokens, kept beside them in the
 * same sealed store record — NUL-terminated into `buffer`, and stores in *needed (may be
 * NULL) the bytes the field takes with its NUL, whether it fits or not: pass a NULL buffer
 * with length 0 to ask. `account` NULL: the active account. An account has a profile once
 * it signed in through an issuer (sf_sign_in_options.issuer or sf_options.issuer, or
 * `watch-session login`); one signed in with sf_tokens, or read from a record written before
 * profiles existed, has none. No secret is in a profile.
 * Returns SF_OK, SF_ERANGE (`length` too small: nothing written), SF_EINVAL (NULL buffer with
 * a length, a field not in sf_profile_field, or no such account: sf_last_error_message names
 * it), SF_ESTATE (the account has no profile, or `account` is NULL and none is signed in),
 * SF_ECLOSED. Any thread: a snapshot (a borrowed runtime knows its accounts once the store
 * has been read: see sf_session_store_status). */
int sf_session_account_profile(sf_runtime *runtime, const char *account, sf_profile_field field, char *buffer,
                               size_t length, size_t *needed);

/* Makes `account` the active one (the store remembers it for the next start). Returns
 * SF_OK (also when it is active already: the store, which another process may have pointed
 * elsewhere, names it again), SF_EINVAL (NULL, or no such account), SF_ECLOSED,
 * SF_ESHUTDOWN, SF_ETHREAD. Threads: as sf_session_sign_in. */
int sf_session_switch_account(sf_runtime *runtime, const char *account);

/* Signs in another account, keeping the active one signed in, in the background; the new
 * one becomes active (as sf_session_sign_in when no account is signed in). Returns and
 * threads as sf_session_sign_in (SF_ESTATE: that account is signed in already). */
int sf_session_add_account(sf_runtime *runtime, const sf_tokens *tokens);

/* Logs `account` out (its record removed, its tokens revoked best effort); the others stay.
 * The active account: as sf_session_logout. Returns SF_OK, SF_EINVAL (NULL, or no such
 * account), SF_ECLOSED, SF_ESHUTDOWN, SF_ETHREAD. Threads: as sf_session_sign_in. */
int sf_session_logout_account(sf_runtime *runtime, const char *account);

/* Logs every account out. Returns SF_OK (also when none was signed in), SF_ECLOSED,
 * SF_ESHUTDOWN, SF_ETHREAD. Threads: as sf_session_sign_in. */
int sf_session_logout_all(sf_runtime *runtime);

/* Asks for a usable access token: the current one, or a refreshed one when within the
 * margin of expiry (one refresh shared by every caller). `callback` runs once on the
 * loop thread with the token or the reason there is none (SF_ENOTLOGGEDIN,
 * SF_EAUTH, SF_ENETWORK, SF_ECONFIG, SF_ESESSIONENDED, SF_ESHUTDOWN). Callbacks of one
 * refresh run one after another: once one of them ends the session (sf_session_logout,
 * a switch of account, destroy), the later ones get SF_ENOTLOGGEDIN (or SF_EAUTH,
 * SF_ESHUTDOWN), never the token.
 * Returns SF_OK (the callback will run), or SF_EINVAL, SF_ECLOSED, SF_ESHUTDOWN, or
 * SF_EBUSY (it will not): at most 10 000 token requests (this call's and
 * sf_session_notify_unauthorized's) wait for an answer at once, and at most 65 536
 * requests of any kind wait for the loop (a loop stuck in a callback, a hung refresh);
 * beyond that nothing is queued. Any thread. */
int sf_session_fresh_token(sf_runtime *runtime, sf_token_fn callback, void *userdata);

/* A request failed with HTTP 401 using `access_token` (copied): if it is still the
 * current token it is refreshed (once, whoever else reports it); otherwise nothing
 * happens. Get the token to retry with from sf_session_fresh_token. Returns SF_OK,
 * SF_EINVAL, SF_ECLOSED, SF_ESHUTDOWN, SF_EBUSY (see LIMITS). Any thread. */
int sf_session_notify_unauthorized(sf_runtime *runtime, const char *access_token);

/* The host is back from the background: validate the session (expiry check and a
 * refresh if due; coalesced with one already due). Returns SF_OK, SF_ECLOSED,
 * SF_ESHUTDOWN. Any thread. */
int sf_session_resume(sf_runtime *runtime);

/* Refreshes now, whatever the margin says (joins a refresh already in flight; brings a
 * scheduled retry forward): for a host that knows the token went bad in a way no 401
 * shows (a permission changed server-side). `callback` runs once on the loop thread with the
 * new token (borrowed, as sf_session_fresh_token's) or the reason there is none (as
 * sf_session_fresh_token's). Returns SF_OK (the callback will run), or SF_EINVAL (NULL
 * callback), SF_ECLOSED, SF_ESHUTDOWN, SF_EBUSY (see LIMITS): then it will not. Any thread. */
int sf_session_refresh_now(sf_runtime *runtime, sf_token_fn callback, void *userdata);

/* ---- Authorizing requests --------------------------------------------------------- */
/* The one primitive an HTTP client needs: sf_session_authorize gives the header fields to
 * add to a request (today `Authorization: Bearer <token>`; a sender-constrained session will
 * add a `DPoP` proof field beside it: add every field you are given, in order, and nothing
 * changes for you), refreshing first when the token is due (one refresh shared by every
 * request). Send the request. On HTTP 401 (or 403) hand the refusal to
 * sf_session_unauthorized: it refreshes only if the refused token is still the session's
 * (compare-and-refresh: 50 requests refused with one token cause one refresh) and answers
 * the authorization to retry with. Retry once; a second refusal is the answer, never a loop
 * (a token fresh from such a refresh that is refused again is SF_EUNAUTHORIZED, not another
 * refresh). Bindings/examples/curl_client.c does this with libcurl.
 *
 * Secrets: the header values are the session's own secret memory, lent to the callback in
 * place (never copied into a string the library cannot wipe) and zeroed after the last use.
 * Copy them only where your HTTP client needs them (curl_slist_append copies: free the list
 * with curl_slist_free_all when the request is done), and wipe your own copies. */

/* One header field: name and value, NUL-terminated, no CR or LF. */
typedef struct sf_header {
    const char *name;  /* "Authorization" (and "DPoP" for a sender-constrained session) */
    const char *value; /* "Bearer <access token>": a secret */
} sf_header;

/* What to add to one request. */
typedef struct sf_authorization {
    size_t size;              /* sizeof(sf_authorization) of the library: fields are only appended */
    const char *scheme;       /* "Bearer", or "DPoP" for a sender-constrained session */
    const sf_header *headers; /* add every one, in order */
    size_t header_count;      /* 1 today */
} sf_authorization;

/* The answer to sf_session_authorize or sf_session_unauthorized: on the loop thread, exactly
 * once per accepted call, never inside the call that asked, not at all if that call failed.
 * On SF_OK `authorization` and every string in it are borrowed for the callback only (the
 * values are the session's secret memory, zeroed later: copy them only where your HTTP client
 * needs them); otherwise `authorization` is NULL and `result` says why: SF_ENOTLOGGEDIN,
 * SF_EAUTH (the session expired: the refresh token is dead too; the state is then
 * SF_SESSION_EXPIRED), SF_EUNAUTHORIZED (a token fresh from the refresh made for this very
 * refusal was refused again), SF_ENETWORK, SF_ECONFIG, SF_ESESSIONENDED, SF_ESHUTDOWN, or
 * SF_EINVAL (the session's token cannot go in a header: it holds a control character). */
typedef void (*sf_authorize_fn)(int result, const sf_authorization *authorization, void *userdata);

/* Asks for the header fields that authorize `method` (an HTTP method name, at most 32 bytes)
 * on `url` (absolute https://, or http:// to a loopback host; no fragment; printable ASCII;
 * at most 8192 bytes), with the current access token, refreshed first when it is within the
 * margin of expiry (one refresh shared with every other token request). Both strings are
 * copied. `on_done` runs once, as sf_authorize_fn says.
 * Returns SF_OK (on_done will run), or (it will not) SF_EINVAL (NULL runtime, method, url or
 * on_done; a method or URL refused as above: sf_last_error_message names it), SF_ECLOSED,
 * SF_ESHUTDOWN, SF_EBUSY (see LIMITS). Any thread, callbacks included. */
int sf_session_authorize(sf_runtime *runtime, const char *method, const char *url, sf_authorize_fn on_done,
                         void *userdata);

/* The request `method` `url`, sent with the Authorization value `refused` (as it was sent:
 * "Bearer <token>", the scheme in any case; at most 65 536 bytes; copied into secret memory),
 * got `http_status` with the `WWW-Authenticate` field `www_authenticate` (may be NULL; read
 * up to 8192 bytes): `on_done` gets the authorization to retry with, once.
 *  - 401 (whatever the challenge): compare-and-refresh. If `refused` carries the session's
 *    current token it is refreshed (once, shared by every request refused with it) and the
 *    answer carries the new one; if the session has moved on already, the current one at
 *    once. A session whose refresh token is dead answers SF_EAUTH (once per call, no retry
 *    to make) and goes SF_SESSION_EXPIRED.
 *  - 403: a new token would not help (with error="insufficient_scope" it would not have more
 *    scope): SF_EUNAUTHORIZED is returned at once, nothing is refreshed, on_done never runs.
 * Returns SF_OK (on_done will run), or (it will not) SF_EINVAL (NULL runtime, method, url,
 * refused or on_done; a method or URL refused as sf_session_authorize's; `refused` too long
 * or not a Bearer value; an `http_status` other than 401 or 403), SF_EUNAUTHORIZED (403),
 * SF_ECLOSED, SF_ESHUTDOWN, SF_EBUSY (see LIMITS). Any thread, callbacks included. */
int sf_session_unauthorized(sf_runtime *runtime, const char *method, const char *url, const char *refused,
                            int http_status, const char *www_authenticate, sf_authorize_fn on_done,
                            void *userdata);

/* sf_session_unauthorized with the answer's `DPoP-Nonce` header (`dpop_nonce`, may be NULL; at
 * most 1024 bytes, copied), for a DPoP session (scheme "DPoP", `refused` "DPoP <token>"): a
 * 401 whose challenge is `DPoP error="use_dpop_nonce"` (RFC 9449 §9) is no reason to refresh —
 * the nonce is remembered for that server and on_done gets the same token with a new proof
 * carrying it (also when another request learnt that nonce meanwhile: the library cannot tell
 * which nonce the refused proof carried, so retry once and take a second refusal as the
 * answer). SF_EUNAUTHORIZED in on_done when the server names no nonce, or one no proof can
 * carry (not NQCHARs, RFC 9449 §4.2: never remembered). Nor is `DPoP error="invalid_dpop_proof"`
 * (§7.1: the proof was refused, its iat outside the server's window or its jti seen before):
 * on_done gets the same token with a new proof (with sf_session_unauthorized too), nothing
 * refreshed. Otherwise exactly sf_session_unauthorized. Returns, threads:
 * as sf_session_unauthorized (SF_EINVAL also for a `dpop_nonce` too long). */
int sf_session_unauthorized_dpop(sf_runtime *runtime, const char *method, const char *url, const char *refused,
                                 int http_status, const char *www_authenticate, const char *dpop_nonce,
                                 sf_authorize_fn on_done, void *userdata);

/* The `DPoP-Nonce` header `dpop_nonce` of an answer to a request the session authorized at
 * `url`, whatever its status (a 2xx included: a server may give a new nonce on any answer and
 * accept only that one from then on, RFC 9449 §8.2 and §9): remembered for that server (the
 * URL's origin), so that the next proof to it carries it. Without it, each rotation costs the
 * next request one use_dpop_nonce refusal and a retry. A refusal's nonce goes to
 * sf_session_unauthorized_dpop instead. Synchronous, no hop to the loop: nonces are
 * process-wide. Both strings are read, not kept.
 * Returns SF_OK (remembered), or SF_EINVAL and nothing remembered (NULL runtime, url or
 * dpop_nonce; a URL sf_session_authorize refuses; a nonce no proof can carry: not 1 to 1024
 * NQCHARs, RFC 9449 §4.2 — a server's bad header on a good answer, which the host should not
 * take as a failure of its request; sf_last_error_message says which), SF_ECLOSED.
 * Any thread, callbacks included. */
int sf_session_remember_dpop_nonce(sf_runtime *runtime, const char *url, const char *dpop_nonce);

/* ---- Sign-in flows ---------------------------------------------------------------- */
/* The library signs the user in itself, with the OAuth 2.0 authority's own user-facing
 * flows, and ends like sf_session_sign_in (SF_LOGGED_IN, SF_EVENT_SIGNED_IN, stored):
 *  - the device authorization grant (RFC 8628, sf_session_sign_in_device): the host shows
 *    a user code and a verification URI; the user approves on another device while the
 *    library polls the token endpoint;
 *  - the authorization code grant with PKCE on a loopback redirect (RFC 7636, RFC 8252,
 *    sf_session_sign_in_browser): the host opens an authorization URL in a browser; the
 *    library listens on 127.0.0.1 for the redirect and redeems the code.
 * Where the endpoints come from: with sf_sign_in_options.issuer (or, when that is NULL,
 * sf_options.issuer), from the issuer's metadata (RFC 8414, OpenID Connect Discovery as the
 * fallback), fetched on the loop first, with sf_options.client_id (and client_secret) as the
 * client; without either, from the runtime's options (sf_options.token_endpoint, client_id,
 * client_secret, scope, introspection_endpoint...) plus the endpoint fields of
 * sf_sign_in_options. An endpoint field set next to an issuer replaces the one the metadata
 * names.
 * The session keeps refreshing the tokens with the runtime's authority, as for
 * sf_session_sign_in: the built-in one (sf_options.issuer alone is enough: its endpoints are
 * discovered; or sf_options.token_endpoint) or the host's refresher.
 * Nothing a flow reports carries a secret: no device code, code verifier or token reaches
 * a callback, a message or the log. */

/* A sign-in flow in progress. 0 is "none"; handles are never reused within a process: a
 * finished, cancelled or unknown handle yields SF_ECLOSED, never a crash. */
typedef uint64_t sf_sign_in;

/* How a sign-in runs. Strings are copied by the starting call; NULL means "not set". */
typedef struct sf_sign_in_options {
    size_t size;                               /* set by sf_sign_in_options_init */
    const char *issuer;                        /* discovery (RFC 8414 / OIDC) from this issuer URL */
    const char *device_authorization_endpoint; /* RFC 8628 (device flow; replaces the metadata's) */
    const char *authorization_endpoint;        /* RFC 6749 (browser flow; replaces the metadata's) */
    const char *scope;                         /* requested scope; NULL: sf_options.scope */
    int64_t timeout_ms;                        /* browser flow: give up after this (SF_EEXPIRED;
                                                  default and 0: 300000; below 1000 counts as
                                                  1000; at most 86400000, one day); the device
                                                  flow ends when its code expires */
    int replace_unreadable_store;              /* 1: as sf_session_sign_in_replacing_store;
                                                  0 (default): as sf_session_sign_in */
    int no_start_page;                         /* browser flow: 1: the listener serves no start
                                                  URL (the prompt's start_url is NULL, /start is
                                                  answered 404): set it when the host shows the
                                                  person authorization_url; 0 (default): it does */
} sf_sign_in_options;

/* What the host shows the user. Every string is borrowed for the call of on_prompt; NULL
 * when it does not apply to the flow. */
typedef struct sf_sign_in_prompt {
    size_t size;                           /* sizeof(sf_sign_in_prompt) of the library */
    /* Device flow: "go to verification_uri and enter user_code" (or open
     * verification_uri_complete, e.g. as a QR code; NULL when the server gave none).
     * These come from the server. user_code: 1 to 128 characters, no control character, and
     * format/bidi characters (Unicode Cf: U+200E, U+202E, U+2066...) removed, so what the user
     * reads is what they type. The URIs: https (http only to loopback, and only from a
     * loopback server), at most 2048 bytes, otherwise as the server wrote them: show them as
     * links, escape them for your output. */
    const char *user_code;
    const char *verification_uri;
    const char *verification_uri_complete;
    int64_t expires_in_ms;                 /* the code (device) or the flow (browser) ends after this */
    int64_t interval_ms;                   /* device: how often the token endpoint is asked; browser: -1 */
    /* Browser flow: open authorization_url in the user's browser; it comes back to
     * redirect_uri (http://127.0.0.1:<port>/callback, the library's loopback listener). */
    const char *authorization_url;
    const char *redirect_uri;
    /* Browser flow: http://127.0.0.1:<port>/start, which the listener answers once with a
     * redirect to authorization_url (a second fetch ends the sign-in: SF_ECANCELLED). Give this
     * one to a program you start to open the browser (xdg-open): any local user can read a
     * process's arguments, and the authorization URL's state would let them end the sign-in.
     * Use one of the two URLs: if the person may open a URL by hand, show them start_url too,
     * or sign in with no_start_page and show authorization_url (a start page that nothing
     * legitimate fetches, another local program can fetch once, unnoticed). NULL with
     * no_start_page. */
    const char *start_url;
} sf_sign_in_prompt;

/* The host's side of one sign-in. on_prompt and release may be NULL; on_done may too (the
 * outcome is then only seen in the state and the events). */
typedef struct sf_sign_in_observer {
    /* At most once, on the loop thread, when the authority has issued what the user needs
     * (before on_done). Not started once sf_sign_in_cancel has returned (a call already
     * running when another thread cancels finishes). */
    void (*on_prompt)(const sf_sign_in_prompt *prompt, void *userdata);
    /* Exactly once, on the loop thread, never inside the starting call, after on_prompt:
     * SF_OK when signed in (SF_LOGGED_IN, tokens stored: the store answered its write) or
     * why not — SF_EDENIED (the user refused: access_denied), SF_EEXPIRED (the code expired,
     * or the browser flow's timeout ran out), SF_ECANCELLED (sf_sign_in_cancel),
     * SF_ECONFIG (the authority refused the client or request, the metadata was refused —
     * the message names the member — or the flow's endpoint is not in it), SF_ENETWORK (the
     * authority could not be reached at a step that is not retried), SF_ESTATE (someone
     * signed in meanwhile), SF_ESTORE (the stored session is not known yet: see
     * sf_session_sign_in), SF_ESHUTDOWN (the runtime was destroyed). `message` (borrowed
     * for the call, never NULL) says why in plain words ("" for SF_OK). */
    void (*on_done)(int result, const char *message, void *userdata);
    /* Exactly once for every sign-in started (SF_OK), on the loop thread, right after
     * on_done: nothing of this observer is called after it. */
    void (*release)(void *userdata);
    void *userdata;
} sf_sign_in_observer;

/* Fills `options` with the defaults (and its size). Any thread. NULL is ignored. */
void sf_sign_in_options_init(sf_sign_in_options *options);

/* Starts the device authorization grant (RFC 8628): asks the device authorization endpoint
 * for codes, hands them to on_prompt, then polls the token endpoint (every interval;
 * slow_down honoured) until the user approves, refuses or the code expires; then signs in.
 * `options`: where the endpoints come from (see above); NULL means the defaults, which
 * name no device authorization endpoint. The observer is copied; its userdata belongs to
 * the sign-in until `release`.
 * Returns SF_OK and *out (the flow runs on the loop; on_done will be called; *out is written
 * before any callback of the sign-in can run, so they may read it), or — calling
 * nothing, taking no ownership — SF_EINVAL (NULL runtime, observer or out; no issuer and
 * no device_authorization_endpoint, or no sf_options.token_endpoint; no sf_options.client_id;
 * an endpoint that is not https or http to loopback: named in the log), SF_ESTATE (someone
 * is signed in: log out first), SF_ECLOSED, SF_ESHUTDOWN. Any thread (it only posts work,
 * also on a borrowed runtime). */
int sf_session_sign_in_device(sf_runtime *runtime, const sf_sign_in_options *options,
                              const sf_sign_in_observer *observer, sf_sign_in *out);

/* Starts the authorization code grant with PKCE on a loopback redirect (RFC 7636, RFC 8252
 * section 7.3): opens a listener on 127.0.0.1 (a free port), hands on_prompt the
 * authorization URL to open in a browser and the redirect URI, and waits for the browser
 * to come back (at most timeout_ms: then SF_EEXPIRED); then redeems the code and signs in.
 * A refusal in the browser (error=access_denied) is SF_EDENIED; another error the
 * authorization server redirects with is SF_ECONFIG. Redirects that do not belong to this
 * flow (another path, a wrong or missing state) are answered 400 or 404 and ignored. The
 * listener is closed on every outcome. Ownership, returns (SF_EINVAL also for no issuer and
 * no authorization_endpoint, or timeout_ms out of range) and threads: as
 * sf_session_sign_in_device. */
int sf_session_sign_in_browser(sf_runtime *runtime, const sf_sign_in_options *options,
                               const sf_sign_in_observer *observer, sf_sign_in *out);

/* Cancels a sign-in: its request in flight is ended, no further request is sent, no timer is
 * left, the browser flow's listener is closed, on_prompt is not called any more, and
 * nothing is signed in by it — unless its outcome was already decided (the tokens were
 * being signed in): on_done then reports that outcome. Otherwise on_done says
 * SF_ECANCELLED. on_done and release still follow, on the loop thread, never inside this
 * call. Returns SF_OK the first time, SF_ECLOSED for 0, an unknown handle, one already
 * cancelled, or one whose on_done has been called. Any thread, also inside on_prompt. */
int sf_sign_in_cancel(sf_sign_in sign_in);

/* ---- Host-supplied refresher ---------------------------------------------------- */

/* Completes `request` with new tokens (refresh_token / member_id NULL: keep the old).
 * Returns SF_OK, SF_EINVAL (NULL or blank access token, a `size` that is not
 * sizeof(sf_tokens); the request stays open), SF_ECLOSED (unknown or already completed
 * request, or a request of a session that has ended since it was asked — logout, a new
 * sign-in: the tokens are then discarded, never used or stored). Any thread. */
int sf_refresh_request_succeed(sf_refresh_request *request, const sf_tokens *tokens);

/* Completes `request` with a failure: SF_EAUTH (terminal: the session expires),
 * SF_ENETWORK (transient: retried after max(backoff, retry_after_ms), retry_after_ms
 * honoured up to one hour; retry_after_ms < 0 for none), SF_ECONFIG (never retried
 * automatically). Returns SF_OK, SF_EINVAL (another code; the request stays open),
 * SF_ECLOSED (as for sf_refresh_request_succeed). Any thread. */
int sf_refresh_request_fail(sf_refresh_request *request, int code, int64_t retry_after_ms);

#ifdef __cplusplus
}
#endif

#endif /* SESSIONFLOW_H */
