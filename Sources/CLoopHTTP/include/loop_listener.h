/*
 * A one-shot HTTP listener on a libuv loop, for the loopback redirect of a browser sign-in
 * (RFC 8252 §7.3): it listens on 127.0.0.1 at an ephemeral port, reads each connection's
 * request head (request line and headers, no body), hands the method and target to the
 * caller, and writes the caller's reply (a small HTML page) with `Connection: close`.
 * Internal to SessionFlow (SessionOAuth wraps it).
 *
 * Threading: every function runs on the loop's thread and every callback runs there.
 *
 * Limits (nothing a browser, or anything else on this machine, sends is trusted):
 *  - a request head is at most LL_MAX_HEAD bytes; a longer one, a malformed request line,
 *    or a target with bytes outside printable ASCII is answered 400 without calling back;
 *  - at most LL_MAX_CONNECTIONS connections at once: one more makes the oldest connection
 *    still waiting for its head close (so idle connections cannot shut the browser out);
 *  - each connection has LL_DEADLINE_MS to send its head and take its reply, then it is
 *    closed (a browser's speculative connection that never sends holds nothing for long).
 */
#ifndef LOOP_LISTENER_H
#define LOOP_LISTENER_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct uv_loop_s;

#define LL_MAX_HEAD 8192
#define LL_MAX_CONNECTIONS 16
#define LL_DEADLINE_MS 10000
#define LL_MAX_LOCATION 8192

typedef struct ll_listener ll_listener;

/* The reply to one request (set it with ll_reply_set). */
typedef struct ll_reply {
    int status;       /* 200, 302, 400, 404... (the reason phrase is chosen from it) */
    char *body;       /* an HTML page (text/html; charset=utf-8), owned by the listener */
    size_t body_length;
    char *location;   /* a Location header (a 302's target), owned by the listener; NULL: none */
} ll_reply;

/* Sets the reply: `status` and a copy of `body` (the listener frees it). Inside ll_request_fn. */
void ll_reply_set(ll_reply *reply, int status, const char *body, size_t body_length);

/* Sets the reply's Location header to a copy of `url` (printable ASCII, at most 8192 bytes;
 * anything else is not set and the reply becomes a 500). Inside ll_request_fn. */
void ll_reply_set_location(ll_reply *reply, const char *url);

/* A request head arrived: `method` and `target` (the request-target, e.g. "/callback?code=..")
 * are borrowed for the call. Set *reply with ll_reply_set (without it: 404, an empty page).
 * Never called after ll_close. */
typedef void (*ll_request_fn)(const char *method, const char *target, ll_reply *reply, void *userdata);

/* Any thread (pure). Parses the request line at the start of `head` (`used` bytes, followed by
 * a NUL at head[used]) in place: the line ends at the first CRLF; the method is 1 to 16 of
 * A-Z; the target starts with '/' and holds only %x21-7E; the version is HTTP/1.1 or HTTP/1.0.
 * Returns 0 with *method and *target pointing into `head` (NUL-terminated there), or -1 (the
 * head is refused, 400). What the listener runs on every connection's bytes (fuzzed). */
int ll_parse_request_line(char *head, size_t used, const char **method, const char **target);

/* Loop thread. Listens on 127.0.0.1 at a port the kernel chooses (stored in *port).
 * Returns 0 and sets *out, or a negative libuv error code (nothing is left open). */
int ll_listen(struct uv_loop_s *loop, ll_request_fn on_request, void *userdata, ll_listener **out, int *port);

/* Loop thread. Stops listening within this call (the listening socket is closed: the port is
 * free when it returns) and never calls `on_request` again. Connections still sending their
 * head are closed; one whose reply was sent is shut down, then closed. The
 * listener frees itself when its last handle has closed (keep running the loop). Must be
 * called exactly once. */
void ll_close(ll_listener *listener);

/* Loop thread: connections open (for tests and teardown checks). */
size_t ll_connections(const ll_listener *listener);

#ifdef __cplusplus
}
#endif

#endif
