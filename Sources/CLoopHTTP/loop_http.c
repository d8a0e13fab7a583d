/* libcurl's multi interface on a libuv loop. See include/loop_http.h for the contract.
 *
 * Shape (curl's docs/examples/multi-uv.c): curl tells us which sockets to watch
 * (CURLMOPT_SOCKETFUNCTION) and when to call it back (CURLMOPT_TIMERFUNCTION); we keep one
 * uv_poll_t per socket and one uv_timer_t, and call curl_multi_socket_action from their
 * callbacks — never from inside a curl callback. After each action, finished transfers are
 * collected with curl_multi_info_read and their `done` runs.
 *
 * One file (651 lines): the client, its sockets, its timer and its requests reach each
 * other through curl's userdata pointers and share static helpers (finish, unwatch, the
 * zeroing allocators); apart, those would become exported symbols. The loopback listener is
 * apart (loop_listener.c). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "loop_http.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <uv.h>

typedef struct lh_socket lh_socket;

struct lh_client {
    uv_loop_t *loop;
    CURLM *multi;
    uv_timer_t timer;
    lh_request *requests;  /* running, doubly linked */
    lh_socket *sockets;    /* watched, doubly linked */
    size_t running;
    int pending_closes;    /* handles whose close callback has not run yet */
    int closing;
};

struct lh_socket {
    uv_poll_t poll;
    curl_socket_t fd;
    lh_client *client;
    lh_socket *prev, *next;
};

struct lh_request {
    lh_client *client;
    CURL *easy;
    struct curl_slist *headers;
    char *body;
    size_t body_length;
    unsigned char *answer;
    size_t answer_length, answer_capacity;
    int64_t max_body;
    int too_large;
    char retry_after[128];
    int has_retry_after;
    char dpop_nonce[1025]; /* RFC 9449 §8: the DPoP-Nonce header (a longer one is not kept) */
    int has_dpop_nonce;
    char error[CURL_ERROR_SIZE];
    /* An answer that is arriving is not ended by the overall deadline (loop_http.h): `watch`
     * fires at that deadline until a 2xx status line arrives, then after every `stall_ms`
     * without a byte. NULL when the request has no stall rule (curl's deadline then). */
    uv_timer_t *watch;
    int64_t timeout_ms, stall_ms;
    long status_line;
    int arriving;
    int stall_suspected; /* the stall watch fired once: one more loop turn decides */
    lh_status_fn on_status;
    lh_done_fn done;
    void *userdata;
    lh_request *prev, *next;
};

static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_result = CURLE_FAILED_INIT;

/* libcurl's memory: every block it frees is zeroed first. Its receive buffers hold the
 * token answers (and its send buffers the refresh token) as they crossed the socket; freed
 * unzeroed, they would outlive the session in the heap. realloc moves through a new block so
 * the old one is zeroed too. Installed when this library initializes libcurl; a host that
 * initialized libcurl first keeps its own functions (curl_global_init_mem then changes
 * nothing). */
static void zeroing_free(void *block) {
    if (block == NULL) return;
    explicit_bzero(block, malloc_usable_size(block));
    free(block);
}

static void *zeroing_realloc(void *block, size_t size) {
    if (block == NULL) return malloc(size);
    size_t old = malloc_usable_size(block);
    void *moved = malloc(size ? size : 1);
    if (moved == NULL) return NULL;
    memcpy(moved, block, old < size ? old : size);
    zeroing_free(block);
    return moved;
}

static char *zeroing_strdup(const char *text) {
    size_t length = strlen(text) + 1;
    char *copy = malloc(length);
    if (copy != NULL) memcpy(copy, text, length);
    return copy;
}

static void global_init(void) {
    global_result = curl_global_init_mem(CURL_GLOBAL_DEFAULT, malloc, zeroing_free, zeroing_realloc, zeroing_strdup, calloc);
}

/* ---- URLs ------------------------------------------------------------------------- */

static int is_loopback_host(const char *host) {
    if (strcasecmp(host, "localhost") == 0) return 1;
    struct in_addr v4;
    if (inet_pton(AF_INET, host, &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
    size_t length = strlen(host);
    if (length > 2 && host[0] == '[' && host[length - 1] == ']') {
        char inner[64];
        if (length - 2 >= sizeof inner) return 0;
        memcpy(inner, host + 1, length - 2);
        inner[length - 2] = 0;
        struct in6_addr v6;
        if (inet_pton(AF_INET6, inner, &v6) != 1) return 0;
        if (IN6_IS_ADDR_LOOPBACK(&v6)) return 1;
        if (IN6_IS_ADDR_V4MAPPED(&v6)) return v6.s6_addr[12] == 127;
    }
    return 0;
}

lh_url_kind lh_url_check(const char *url) {
    if (!url) return LH_URL_INVALID;
    CURLU *parsed = curl_url();
    if (!parsed) return LH_URL_INVALID;
    lh_url_kind kind = LH_URL_INVALID;
    char *scheme = NULL, *host = NULL, *user = NULL, *password = NULL;
    /* No guessing of a scheme, no default scheme: what is written is what is used. */
    if (curl_url_set(parsed, CURLUPART_URL, url, 0) != CURLUE_OK) goto done;
    if (curl_url_get(parsed, CURLUPART_SCHEME, &scheme, 0) != CURLUE_OK) goto done;
    if (curl_url_get(parsed, CURLUPART_HOST, &host, 0) != CURLUE_OK || !host[0]) goto done;
    if (curl_url_get(parsed, CURLUPART_USER, &user, 0) == CURLUE_OK ||
        curl_url_get(parsed, CURLUPART_PASSWORD, &password, 0) == CURLUE_OK) {
        kind = LH_URL_CREDENTIALS;
        goto done;
    }
    if (strcasecmp(scheme, "https") == 0) kind = LH_URL_HTTPS;
    else if (strcasecmp(scheme, "http") == 0) kind = is_loopback_host(host) ? LH_URL_LOOPBACK_HTTP : LH_URL_PLAIN_HTTP;
    else kind = LH_URL_OTHER_SCHEME;
done:
    curl_free(scheme);
    curl_free(host);
    curl_free(user);
    curl_free(password);
    curl_url_cleanup(parsed);
    return kind;
}

/* ---- Handles ---------------------------------------------------------------------- */

static void release_if_done(lh_client *client) {
    if (client->closing && client->pending_closes == 0) free(client);
}

static void handle_closed(uv_handle_t *handle) {
    lh_client *client = handle->data;
    if ((void *)handle != (void *)&client->timer) free(handle);  /* an lh_socket */
    client->pending_closes--;
    release_if_done(client);
}

static void unwatch(lh_socket *watched) {
    lh_client *client = watched->client;
    if (watched->prev) watched->prev->next = watched->next;
    else client->sockets = watched->next;
    if (watched->next) watched->next->prev = watched->prev;
    uv_poll_stop(&watched->poll);
    watched->poll.data = client;
    client->pending_closes++;
    uv_close((uv_handle_t *)&watched->poll, handle_closed);
}

/* ---- Finishing ---------------------------------------------------------------------- */

static void unlink_request(lh_request *request) {
    lh_client *client = request->client;
    if (request->prev) request->prev->next = request->next;
    else client->requests = request->next;
    if (request->next) request->next->prev = request->prev;
    client->running--;
}

static void free_request(lh_request *request) {
    if (request->easy) curl_easy_cleanup(request->easy);
    curl_slist_free_all(request->headers);
    if (request->body) {
        explicit_bzero(request->body, request->body_length);
        free(request->body);
    }
    if (request->answer) {
        explicit_bzero(request->answer, request->answer_capacity);
        free(request->answer);
    }
    free(request);
}

/* Stops the request's watch and closes its handle (freed by handle_closed, which the client
 * waits for before it frees itself). */
static void close_watch(lh_request *request) {
    uv_timer_t *watch = request->watch;
    if (!watch) return;
    request->watch = NULL;
    uv_timer_stop(watch);
    watch->data = request->client;
    request->client->pending_closes++;
    uv_close((uv_handle_t *)watch, handle_closed);
}

/* Removes the transfer, tells the caller, frees the request. */
static void finish(lh_request *request, lh_outcome outcome, CURLcode code) {
    lh_client *client = request->client;
    curl_multi_remove_handle(client->multi, request->easy);
    unlink_request(request);
    close_watch(request);

    lh_answer answer;
    memset(&answer, 0, sizeof answer);
    answer.outcome = outcome;
    answer.bytes_received = (int64_t)request->answer_length;
    answer.status_line = request->status_line;
    if (outcome == LH_ANSWERED) {
        curl_easy_getinfo(request->easy, CURLINFO_RESPONSE_CODE, &answer.status);
        answer.body = request->answer;
        answer.body_length = request->answer_length;
        answer.retry_after = request->has_retry_after ? request->retry_after : NULL;
        answer.dpop_nonce = request->has_dpop_nonce ? request->dpop_nonce : NULL;
    } else if (outcome != LH_CANCELLED) {
        curl_easy_getinfo(request->easy, CURLINFO_RESPONSE_CODE, &answer.status);
        answer.error_text = request->error[0] ? request->error : curl_easy_strerror(code);
    } else {
        answer.error_text = "cancelled";
    }
    request->done(&answer, request->userdata);
    free_request(request);
}

static lh_outcome outcome_of(const lh_request *request, CURLcode code) {
    switch (code) {
    case CURLE_OK: return LH_ANSWERED;
    case CURLE_OPERATION_TIMEDOUT: return LH_TIMED_OUT;
    case CURLE_FILESIZE_EXCEEDED: return LH_TOO_LARGE;
    case CURLE_WRITE_ERROR: return request->too_large ? LH_TOO_LARGE : LH_NETWORK;
    case CURLE_OUT_OF_MEMORY: return LH_REFUSED;
    default: return LH_NETWORK;
    }
}

static void collect_finished(lh_client *client) {
    CURLMsg *message;
    int left;
    while ((message = curl_multi_info_read(client->multi, &left))) {
        if (message->msg != CURLMSG_DONE) continue;
        lh_request *request = NULL;
        curl_easy_getinfo(message->easy_handle, CURLINFO_PRIVATE, (char **)&request);
        CURLcode code = message->data.result;
        if (request) finish(request, outcome_of(request, code), code);
    }
}

/* ---- Driving curl from the loop --------------------------------------------------- */

static void on_timer(uv_timer_t *timer) {
    lh_client *client = timer->data;
    int running;
    curl_multi_socket_action(client->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    collect_finished(client);
}

static void on_poll(uv_poll_t *poll, int status, int events) {
    lh_socket *watched = poll->data;
    lh_client *client = watched->client;
    int flags = 0;
    if (status < 0) flags = CURL_CSELECT_ERR;
    if (events & UV_READABLE) flags |= CURL_CSELECT_IN;
    if (events & UV_WRITABLE) flags |= CURL_CSELECT_OUT;
    int running;
    curl_multi_socket_action(client->multi, watched->fd, flags, &running);
    collect_finished(client);
}

/* CURLMOPT_TIMERFUNCTION: curl wants to be called after `timeout_ms` (-1: never). Only the
 * uv timer is (re)armed here; a 0 runs on the next loop turn, never inside this callback. */
static int curl_timer(CURLM *multi, long timeout_ms, void *userdata) {
    (void)multi;
    lh_client *client = userdata;
    if (client->closing) return 0;
    if (timeout_ms < 0) uv_timer_stop(&client->timer);
    else uv_timer_start(&client->timer, on_timer, (uint64_t)timeout_ms, 0);
    return 0;
}

/* CURLMOPT_SOCKETFUNCTION: watch `fd` for `what`, or stop watching it. */
static int curl_socket(CURL *easy, curl_socket_t fd, int what, void *userdata, void *socket_data) {
    (void)easy;
    lh_client *client = userdata;
    lh_socket *watched = socket_data;
    if (what == CURL_POLL_REMOVE) {
        if (watched) {
            curl_multi_assign(client->multi, fd, NULL);
            unwatch(watched);
        }
        return 0;
    }
    if (!watched) {
        watched = calloc(1, sizeof *watched);
        if (!watched) return -1;
        if (uv_poll_init_socket(client->loop, &watched->poll, fd) != 0) {
            free(watched);
            return -1;
        }
        watched->fd = fd;
        watched->client = client;
        watched->poll.data = watched;
        watched->next = client->sockets;
        if (client->sockets) client->sockets->prev = watched;
        client->sockets = watched;
        curl_multi_assign(client->multi, fd, watched);
    }
    int events = 0;
    if (what & CURL_POLL_IN) events |= UV_READABLE;
    if (what & CURL_POLL_OUT) events |= UV_WRITABLE;
    uv_poll_start(&watched->poll, events, on_poll);
    return 0;
}

/* CURLOPT_OPENSOCKETFUNCTION: curl's own socket() has no SOCK_CLOEXEC, so a process the
 * host spawns meanwhile (fork + exec) inherits the connection and keeps it open after curl
 * closed it: a cancelled request would then look alive to the server. */
static curl_socket_t open_socket(void *userdata, curlsocktype purpose, struct curl_sockaddr *address) {
    (void)userdata;
    (void)purpose;
    return socket(address->family, address->socktype | SOCK_CLOEXEC, address->protocol);
}

/* ---- Receiving ---------------------------------------------------------------------- */

/* The request's watch: before a 2xx status line, the overall deadline; after it, a stall. */
static void on_watch(uv_timer_t *timer) {
    lh_request *request = timer->data;
    if (request->arriving && !request->stall_suspected) {
        /* libuv runs timers before it polls: after a loop that was busy for longer than the
         * stall, bytes may be waiting unread. One more turn (its poll phase) reads them first. */
        request->stall_suspected = 1;
        uv_timer_start(timer, on_watch, 1, 0);
        return;
    }
    if (request->arriving)
        snprintf(request->error, sizeof request->error,
                 "the answer stalled: no byte arrived for %lld ms after its status line (HTTP %ld)",
                 (long long)request->stall_ms, request->status_line);
    else
        snprintf(request->error, sizeof request->error, "no answer within %lld ms", (long long)request->timeout_ms);
    finish(request, LH_TIMED_OUT, CURLE_OPERATION_TIMEDOUT);
}

/* A byte of an arriving answer came in: the stall is counted again from now. */
static void arrived(lh_request *request) {
    if (!request->arriving || !request->watch) return;
    request->stall_suspected = 0;
    uv_timer_start(request->watch, on_watch, (uint64_t)request->stall_ms, 0);
}

/* "HTTP/1.1 200 OK" / "HTTP/2 200": the status, 0 if the line is not a status line. */
static long status_of(const char *line, size_t length) {
    if (length < 5 || strncmp(line, "HTTP/", 5) != 0) return 0;
    size_t at = 5;
    while (at < length && line[at] != ' ') at++;
    while (at < length && line[at] == ' ') at++;
    long status = 0;
    int digits = 0;
    for (; at < length && digits < 3 && line[at] >= '0' && line[at] <= '9'; at++, digits++)
        status = status * 10 + (line[at] - '0');
    return digits == 3 ? status : 0;
}

static size_t on_body(char *data, size_t size, size_t count, void *userdata) {
    lh_request *request = userdata;
    size_t length = size * count;
    arrived(request);
    if ((int64_t)(request->answer_length + length) > request->max_body) {
        request->too_large = 1;
        request->answer_length += length;  /* counted, not kept */
        return 0;                          /* aborts the transfer (CURLE_WRITE_ERROR) */
    }
    if (request->answer_length + length > request->answer_capacity) {
        size_t capacity = request->answer_capacity ? request->answer_capacity : 1024;
        while (capacity < request->answer_length + length) capacity *= 2;
        if ((int64_t)capacity > request->max_body) capacity = (size_t)request->max_body;
        unsigned char *grown = malloc(capacity);
        if (!grown) return 0;
        if (request->answer) {
            memcpy(grown, request->answer, request->answer_length);
            explicit_bzero(request->answer, request->answer_capacity);
            free(request->answer);
        }
        request->answer = grown;
        request->answer_capacity = capacity;
    }
    memcpy(request->answer + request->answer_length, data, length);
    request->answer_length += length;
    return length;
}

/* If `data` is the header line `name` ("name:", lower case), its value without the blanks and
 * line end around it: returns 1 and sets *value / *value_length; else 0. */
static int header_value(const char *data, size_t length, const char *name, size_t name_length,
                        const char **value, size_t *value_length) {
    if (length <= name_length || strncasecmp(data, name, name_length) != 0) return 0;
    const char *at = data + name_length;
    size_t left = length - name_length;
    while (left && (*at == ' ' || *at == '\t')) at++, left--;
    while (left && (at[left - 1] == '\r' || at[left - 1] == '\n' || at[left - 1] == ' ' || at[left - 1] == '\t'))
        left--;
    *value = at;
    *value_length = left;
    return 1;
}

/* The DPoP-Nonce header's value (RFC 9449 §8), trimmed; reset by a new status line. */
static void take_dpop_nonce(lh_request *request, const char *data, size_t length) {
    static const char name[] = "dpop-nonce:";
    if (length >= 5 && strncmp(data, "HTTP/", 5) == 0) request->has_dpop_nonce = 0;
    const char *value;
    size_t value_length;
    if (!header_value(data, length, name, sizeof name - 1, &value, &value_length)) return;
    if (value_length == 0 || value_length >= sizeof request->dpop_nonce) return;
    memcpy(request->dpop_nonce, value, value_length);
    request->dpop_nonce[value_length] = 0;
    request->has_dpop_nonce = 1;
}

static size_t on_header(char *data, size_t size, size_t count, void *userdata) {
    lh_request *request = userdata;
    size_t length = size * count;
    static const char name[] = "retry-after:";
    arrived(request);
    /* A new status line (an interim 1xx answer, then the final one) resets what was seen. */
    if (length >= 5 && strncmp(data, "HTTP/", 5) == 0) {
        request->has_retry_after = 0;
        long status = status_of(data, length);
        if (status >= 200) request->status_line = status;
        if (status >= 200 && status <= 299 && !request->arriving) {
            request->arriving = 1;
            if (request->watch) {
                arrived(request);
                if (request->on_status) request->on_status(status, request->userdata);
            }
        }
    }
    const char *value;
    size_t value_length;
    if (header_value(data, length, name, sizeof name - 1, &value, &value_length)) {
        if (value_length < sizeof request->retry_after) {
            memcpy(request->retry_after, value, value_length);
            request->retry_after[value_length] = 0;
            request->has_retry_after = 1;
        }
    }
    take_dpop_nonce(request, data, length);
    return length;
}

/* ---- The public functions -------------------------------------------------------------- */

lh_client *lh_client_create(uv_loop_t *loop) {
    pthread_once(&global_once, global_init);
    if (global_result != CURLE_OK || !loop) return NULL;
    lh_client *client = calloc(1, sizeof *client);
    if (!client) return NULL;
    client->loop = loop;
    client->multi = curl_multi_init();
    if (!client->multi || uv_timer_init(loop, &client->timer) != 0) {
        if (client->multi) curl_multi_cleanup(client->multi);
        free(client);
        return NULL;
    }
    client->timer.data = client;
    curl_multi_setopt(client->multi, CURLMOPT_SOCKETFUNCTION, curl_socket);
    curl_multi_setopt(client->multi, CURLMOPT_SOCKETDATA, client);
    curl_multi_setopt(client->multi, CURLMOPT_TIMERFUNCTION, curl_timer);
    curl_multi_setopt(client->multi, CURLMOPT_TIMERDATA, client);
    return client;
}

void lh_client_close(lh_client *client) {
    if (!client || client->closing) return;
    while (client->requests) lh_cancel(client->requests);
    client->closing = 1;
    /* Connections curl keeps for reuse are closed here; their sockets are reported
     * removed (or, if curl does not say so, unwatched below). */
    curl_multi_cleanup(client->multi);
    client->multi = NULL;
    while (client->sockets) unwatch(client->sockets);
    uv_timer_stop(&client->timer);
    client->pending_closes++;
    uv_close((uv_handle_t *)&client->timer, handle_closed);
}

size_t lh_client_running(const lh_client *client) { return client ? client->running : 0; }

void lh_cancel(lh_request *request) {
    if (request) finish(request, LH_CANCELLED, CURLE_ABORTED_BY_CALLBACK);
}

#define SET(option, value) ok = ok && curl_easy_setopt(easy, option, value) == CURLE_OK

/* A header line libcurl may send as given: "Name: value" (or "Name;" / "Name:", which libcurl
 * reads as "send empty" / "remove"), with no control character other than a tab and no DEL.
 * libcurl copies each line to the wire as it is, so a CR or LF inside one would end it and
 * start another header, or a whole second request, chosen by whoever wrote the value (a
 * server's access token, say). */
static int header_is_safe(const char *header) {
    const unsigned char *p = (const unsigned char *)header;
    if (!*p || *p == ':' || *p == ';') return 0;
    for (; *p; p++)
        if ((*p < 0x20 && *p != '\t') || *p == 0x7f) return 0;
    return strchr(header, ':') != NULL || header[strlen(header) - 1] == ';';
}

/* A POST (`post` 1: the options' body) or a GET (`post` 0: no body), with the same limits. */
static int start(lh_client *client, const lh_post_options *options, int post, lh_done_fn done, void *userdata,
                 lh_request **out) {
    if (!client || client->closing || !options || !options->url || !done || !out ||
        options->timeout_ms <= 0 || options->max_body <= 0 || (options->body_length && !options->body) ||
        options->answer_stall_ms < 0 || (options->answer_stall_ms > 0 && options->answer_cap_ms < options->timeout_ms))
        return LH_REFUSED;
    lh_url_kind kind = lh_url_check(options->url);
    int plain = kind == LH_URL_LOOPBACK_HTTP;
    if (!(kind == LH_URL_HTTPS || (plain && options->allow_loopback_http))) return LH_REFUSED;
    for (const char *const *header = options->headers; header && *header; header++)
        if (!header_is_safe(*header)) return LH_REFUSED;

    lh_request *request = calloc(1, sizeof *request);
    if (!request) return LH_REFUSED;
    request->client = client;
    request->done = done;
    request->userdata = userdata;
    request->max_body = options->max_body;
    request->timeout_ms = options->timeout_ms;
    request->stall_ms = options->answer_stall_ms;
    request->on_status = options->on_status;
    request->body_length = options->body_length;
    request->body = malloc(options->body_length ? options->body_length : 1);
    request->easy = curl_easy_init();
    if (!request->body || !request->easy) goto fail;
    if (options->body_length) memcpy(request->body, options->body, options->body_length);

    /* Accept-Encoding: identity, and no CURLOPT_ACCEPT_ENCODING: no Content-Encoding is decoded.
     * libcurl does decode a Transfer-Encoding: gzip a server sends unasked; the size limit counts
     * the bytes written to us, decoded, so it stays the memory bound (TransportFaultTests' gzip
     * bomb). "Expect:" off: no 100-continue round trip. */
    request->headers = curl_slist_append(NULL, "Accept-Encoding: identity");
    if (!request->headers || !curl_slist_append(request->headers, "Expect:")) goto fail;
    for (const char *const *header = options->headers; header && *header; header++)
        if (!curl_slist_append(request->headers, *header)) goto fail;

    CURL *easy = request->easy;
    int ok = 1;
    SET(CURLOPT_URL, options->url);
    SET(CURLOPT_PROTOCOLS_STR, plain ? "http" : "https");
    SET(CURLOPT_REDIR_PROTOCOLS_STR, plain ? "http" : "https");
    SET(CURLOPT_FOLLOWLOCATION, 0L);
    SET(CURLOPT_MAXREDIRS, 0L);
    SET(CURLOPT_SSL_VERIFYPEER, 1L);
    SET(CURLOPT_SSL_VERIFYHOST, 2L);
    SET(CURLOPT_NOSIGNAL, 1L);
    /* A proxy's answer to CONNECT ("HTTP/1.1 200 Connection established") is not the server's:
     * kept from the header callback, it would count as a 2xx answer arriving before the
     * request was even sent (and a later TLS failure as a lost answer, retried at once). */
    SET(CURLOPT_SUPPRESS_CONNECT_HEADERS, 1L);
    /* With a stall rule the overall deadline is the watch's (it no longer applies once an
     * answer is arriving); curl's is then the hard cap. */
    SET(CURLOPT_TIMEOUT_MS, (long)(request->stall_ms > 0 ? options->answer_cap_ms : options->timeout_ms));
    SET(CURLOPT_CONNECTTIMEOUT_MS,
        (long)(options->connect_timeout_ms > 0 && options->connect_timeout_ms < options->timeout_ms
                   ? options->connect_timeout_ms : options->timeout_ms));
    SET(CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)options->max_body);
    SET(CURLOPT_HTTPHEADER, request->headers);
    if (post) {
        SET(CURLOPT_POST, 1L);
        SET(CURLOPT_POSTFIELDS, request->body);
        SET(CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)options->body_length);
    } else {
        SET(CURLOPT_HTTPGET, 1L);
    }
    SET(CURLOPT_WRITEFUNCTION, on_body);
    SET(CURLOPT_WRITEDATA, request);
    SET(CURLOPT_HEADERFUNCTION, on_header);
    SET(CURLOPT_HEADERDATA, request);
    SET(CURLOPT_ERRORBUFFER, request->error);
    SET(CURLOPT_PRIVATE, request);
    /* One connection per request, closed when it ends: an OAuth client's requests are
     * minutes apart, so keeping connections buys nothing, and "the request has ended" then
     * always means "its connection is closed" — what a server sees when a refresh is
     * cancelled (and what lets it tell a retry from a replay). */
    SET(CURLOPT_FRESH_CONNECT, 1L);
    SET(CURLOPT_FORBID_REUSE, 1L);
    SET(CURLOPT_OPENSOCKETFUNCTION, open_socket);
    /* A loopback request never goes through a proxy. */
    if (plain) SET(CURLOPT_NOPROXY, "*");
    if (!ok) goto fail;

    if (request->stall_ms > 0) {
        request->watch = malloc(sizeof *request->watch);
        if (!request->watch) goto fail;
        if (uv_timer_init(client->loop, request->watch) != 0) {
            free(request->watch);
            request->watch = NULL;
            goto fail;
        }
        request->watch->data = request;
        uv_timer_start(request->watch, on_watch, (uint64_t)options->timeout_ms, 0);
    }
    if (curl_multi_add_handle(client->multi, easy) != CURLM_OK) {
        close_watch(request);
        goto fail;
    }
    request->next = client->requests;
    if (client->requests) client->requests->prev = request;
    client->requests = request;
    client->running++;
    *out = request;
    return 0;

fail:
    free_request(request);
    return LH_REFUSED;
}

int lh_post(lh_client *client, const lh_post_options *options, lh_done_fn done, void *userdata,
            lh_request **out) {
    return start(client, options, 1, done, userdata, out);
}

int lh_get(lh_client *client, const lh_post_options *options, lh_done_fn done, void *userdata,
           lh_request **out) {
    if (options && (options->body || options->body_length)) return LH_REFUSED;
    return start(client, options, 0, done, userdata, out);
}
