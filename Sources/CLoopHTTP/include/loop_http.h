/*
 * An HTTP client on a libuv loop: libcurl's multi interface driven by the loop
 * (curl_multi_socket_action, one uv_poll_t per socket, one uv_timer_t), the pattern of
 * curl's docs/examples/multi-uv.c. Internal to SessionFlow (SessionOAuth wraps it).
 *
 * Threading: every function runs on the loop's thread, and every callback runs there,
 * never inside the call that caused it (a request's `done` runs on a later loop turn, or
 * inside lh_cancel / lh_client_close for the request they end).
 *
 * Requests are POSTs with a body (lh_post) or GETs (lh_get), no redirect is ever followed,
 * each has an overall deadline, the answer is limited in size while it is received
 * (Content-Length checked up front, the transfer aborted at the limit), Accept-Encoding is identity (no
 * Content-Encoding is asked for or decoded; libcurl still decodes a `Transfer-Encoding: gzip` a
 * server sends unasked, and the limit counts the decoded bytes, so it still bounds memory), and TLS
 * is always verified. Only https is spoken, except plain http to a loopback host when the caller
 * allows it.
 *
 * Proxies: an https request honours libcurl's proxy environment variables (https_proxy,
 * HTTPS_PROXY, all_proxy, no_proxy) as any libcurl program does — the proxy sees where the
 * request goes, never what it carries (TLS runs end to end through a CONNECT tunnel). A plain
 * http request to loopback never goes through a proxy (NOPROXY "*").
 */
#ifndef LOOP_HTTP_H
#define LOOP_HTTP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct uv_loop_s;

typedef struct lh_client lh_client;
typedef struct lh_request lh_request;

/* How a request ended. */
typedef enum lh_outcome {
    LH_ANSWERED = 0,  /* a complete HTTP answer (any status, 3xx included) */
    LH_CANCELLED = 1, /* lh_cancel or lh_client_close */
    LH_TIMED_OUT = 2, /* the overall deadline (or the connect deadline) passed */
    LH_TOO_LARGE = 3, /* the answer is larger than max_body (announced or received) */
    LH_NETWORK = 4,   /* DNS, connect, TLS, a connection lost, a malformed answer */
    LH_REFUSED = 5,   /* not started: a URL the client will not use, out of memory */
} lh_outcome;

/* What `done` receives; everything it points to is borrowed for the call. */
typedef struct lh_answer {
    lh_outcome outcome;
    long status;                /* the HTTP status, 0 without an answer */
    const unsigned char *body;  /* the answer's body (may be NULL when body_length is 0) */
    size_t body_length;
    const char *retry_after;    /* the Retry-After header's value, NULL if none */
    const char *error_text;     /* why it failed, from libcurl (never the request's body) */
    int64_t bytes_received;     /* body bytes received before the end (also when aborted) */
    long status_line;           /* the final status line that arrived (also when the transfer
                                 * failed or was cancelled after it), 0 if none did */
    const char *dpop_nonce;     /* the DPoP-Nonce header's value (RFC 9449 §8), NULL if none */
} lh_answer;

typedef void (*lh_done_fn)(const lh_answer *answer, void *userdata);

/* Runs (loop thread, inside libcurl's processing: it must not call lh_* for this client) once,
 * when a 2xx final status line has arrived, with the request's userdata. */
typedef void (*lh_status_fn)(long status, void *userdata);

/* What lh_url_check finds. */
typedef enum lh_url_kind {
    LH_URL_HTTPS = 0,          /* https://host... */
    LH_URL_LOOPBACK_HTTP = 1,  /* http:// to 127.0.0.0/8, ::1 or localhost */
    LH_URL_PLAIN_HTTP = 2,     /* http:// to any other host: refused */
    LH_URL_OTHER_SCHEME = 3,   /* neither http nor https */
    LH_URL_CREDENTIALS = 4,    /* user or password inside the URL: refused */
    LH_URL_INVALID = 5,        /* not a URL libcurl can parse, or no host */
} lh_url_kind;

/* Classifies `url` the way libcurl will parse it (any thread). */
lh_url_kind lh_url_check(const char *url);

typedef struct lh_post_options {
    const char *url;
    const char *const *headers;   /* extra request headers, NULL-terminated (may be NULL); a
                                   * line with a control character (CR, LF, NUL aside: any but
                                   * tab) or DEL, or without a name, refuses the request */
    const void *body;             /* copied; the copy is zeroed when the request ends */
    size_t body_length;
    int64_t timeout_ms;           /* overall deadline, > 0 */
    int64_t connect_timeout_ms;   /* <= 0: the overall deadline */
    int64_t max_body;             /* answer size limit in bytes, > 0 */
    int allow_loopback_http;      /* 1: http:// is allowed to a loopback host */
    /* An answer that is arriving (for a refresh: the server has rotated its token, so ending
     * the request would lose the session) is not ended by `timeout_ms`: with answer_stall_ms
     * > 0, once a 2xx status line has arrived the request ends only when no byte arrives for
     * answer_stall_ms (LH_TIMED_OUT, "stalled"), or at answer_cap_ms from its start (>=
     * timeout_ms; LH_TIMED_OUT), or when it is cancelled. 0: timeout_ms applies throughout. */
    int64_t answer_stall_ms;
    int64_t answer_cap_ms;
    lh_status_fn on_status;       /* may be NULL */
} lh_post_options;

/* Loop thread. NULL when out of memory or libcurl cannot start. */
lh_client *lh_client_create(struct uv_loop_s *loop);

/* Loop thread. Ends every request still running (each `done` runs, LH_CANCELLED, inside
 * this call), then closes the client's handles; its memory is freed by their close
 * callbacks on later loop turns (keep running the loop). The client must not be used
 * after this call. */
void lh_client_close(lh_client *client);

/* Loop thread. Starts a POST; `done` runs exactly once, on a later loop turn (or inside
 * lh_cancel / lh_client_close). Returns 0 and sets *out (valid until `done` has started),
 * or returns an lh_outcome (LH_REFUSED) and never calls `done`. */
int lh_post(lh_client *client, const lh_post_options *options, lh_done_fn done, void *userdata,
            lh_request **out);

/* Loop thread. Starts a GET with the same rules and limits as lh_post (no redirect followed,
 * the deadline, the answer size limit, identity encoding, TLS verified, https only but for
 * allowed loopback http); `options` must have no body (body NULL, body_length 0), or the
 * request is refused (LH_REFUSED). Same return value and `done` contract as lh_post. */
int lh_get(lh_client *client, const lh_post_options *options, lh_done_fn done, void *userdata,
           lh_request **out);

/* Loop thread. Ends a request that has not ended yet: the transfer is removed (its
 * connection closed) and `done` runs inside this call with LH_CANCELLED. Must not be called
 * once `done` has started. */
void lh_cancel(lh_request *request);

/* Loop thread: requests running on `client` (for tests and teardown checks). */
size_t lh_client_running(const lh_client *client);

#ifdef __cplusplus
}
#endif

#endif
