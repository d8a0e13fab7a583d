/* A one-shot HTTP listener on a libuv loop (see loop_listener.h). */
#define _GNU_SOURCE
#include "loop_listener.h"

#include <arpa/inet.h>
#include <errno.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

typedef struct ll_connection {
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_shutdown_t shutdown;
    ll_listener *owner;
    struct ll_connection *prev, *next;
    char *reply; /* the reply's bytes */
    size_t used;
    int handles_open; /* tcp + timer until both close callbacks ran */
    int closing;
    int replying; /* the head is complete: a reply is being made or written (ll_close lets it finish) */
    char head[LL_MAX_HEAD + 1];
} ll_connection;

struct ll_listener {
    uv_tcp_t server;
    ll_request_fn on_request;
    void *userdata;
    ll_connection *connections;
    size_t count;
    int server_open; /* the server handle's close callback has not run yet */
    int closed;      /* ll_close was called (or the listen failed) */
};

static void maybe_free_listener(ll_listener *listener) {
    if (listener->closed && !listener->server_open && listener->count == 0) free(listener);
}

static void connection_handle_closed(uv_handle_t *handle) {
    ll_connection *c = handle->data;
    if (--c->handles_open > 0) return;
    ll_listener *listener = c->owner;
    if (c->prev) c->prev->next = c->next;
    else listener->connections = c->next;
    if (c->next) c->next->prev = c->prev;
    listener->count--;
    free(c->reply);
    free(c);
    maybe_free_listener(listener);
}

static void connection_close(ll_connection *c) {
    if (c->closing) return;
    c->closing = 1;
    uv_close((uv_handle_t *)&c->tcp, connection_handle_closed);
    uv_close((uv_handle_t *)&c->timer, connection_handle_closed);
}

static void deadline_passed(uv_timer_t *timer) { connection_close(timer->data); }

static void shutdown_done(uv_shutdown_t *request, int status) {
    (void)status;
    connection_close(request->data);
}

static const char *reason(int status) {
    switch (status) {
    case 200: return "OK";
    case 302: return "Found";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    default: return "Error";
    }
}

static void send_reply(ll_connection *c, const ll_reply *reply) {
    c->replying = 1;
    int status = (reply->status >= 100 && reply->status <= 599) ? reply->status : 500;
    size_t body_length = reply->body ? reply->body_length : 0;
    char header[512 + LL_MAX_LOCATION];
    int header_length = snprintf(header, sizeof header,
                                 "HTTP/1.1 %d %s\r\n"
                                 "%s%s%s"
                                 "Content-Type: text/html; charset=utf-8\r\n"
                                 "Content-Length: %zu\r\n"
                                 "Cache-Control: no-store\r\n"
                                 "Referrer-Policy: no-referrer\r\n"
                                 "X-Content-Type-Options: nosniff\r\n"
                                 "Connection: close\r\n\r\n",
                                 status, reason(status), reply->location ? "Location: " : "",
                                 reply->location ? reply->location : "", reply->location ? "\r\n" : "", body_length);
    if (header_length < 0 || (size_t)header_length >= sizeof header) {
        connection_close(c);
        return;
    }
    c->reply = malloc((size_t)header_length + body_length);
    if (!c->reply) {
        connection_close(c);
        return;
    }
    memcpy(c->reply, header, (size_t)header_length);
    if (body_length) memcpy(c->reply + header_length, reply->body, body_length);
    /* send(MSG_NOSIGNAL), not uv_write: a write to a connection the browser has reset must not
     * raise SIGPIPE in a host that does not ignore it. The reply is small and the connection
     * fresh, so it fits the socket's buffer; one that does not (or an error) is dropped — the
     * page is lost, nothing else (the flow has taken the request already). */
    uv_os_fd_t fd;
    size_t total = (size_t)header_length + body_length, sent = 0;
    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) != 0) {
        connection_close(c);
        return;
    }
    while (sent < total) {
        ssize_t n = send(fd, c->reply + sent, total - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        sent += (size_t)n;
    }
    if (sent < total) {
        connection_close(c);
        return;
    }
    c->shutdown.data = c;
    if (uv_shutdown(&c->shutdown, (uv_stream_t *)&c->tcp, shutdown_done) != 0) connection_close(c);
}

void ll_reply_set_location(ll_reply *reply, const char *url) {
    if (!reply) return;
    free(reply->location);
    reply->location = NULL;
    size_t length = url ? strnlen(url, LL_MAX_LOCATION + 1) : 0;
    int printable = url && length > 0 && length <= LL_MAX_LOCATION;
    for (size_t i = 0; printable && i < length; i++)
        if ((unsigned char)url[i] < 0x21 || (unsigned char)url[i] > 0x7e) printable = 0;
    if (!printable || !(reply->location = strndup(url, length))) reply->status = 500;
}

void ll_reply_set(ll_reply *reply, int status, const char *body, size_t body_length) {
    if (!reply) return;
    free(reply->body);
    reply->body = NULL;
    reply->body_length = 0;
    reply->status = status;
    if (body && body_length && (reply->body = malloc(body_length))) {
        memcpy(reply->body, body, body_length);
        reply->body_length = body_length;
    }
}

static void refuse(ll_connection *c) {
    static const char page[] = "<!doctype html><title>Bad request</title><p>Bad request.</p>";
    ll_reply reply = {400, (char *)page, sizeof page - 1, NULL};
    send_reply(c, &reply);
}

int ll_parse_request_line(char *head, size_t used, const char **method_out, const char **target_out) {
    if (!head || !method_out || !target_out) return -1;
    char *line_end = memmem(head, used, "\r\n", 2);
    if (!line_end) return -1;
    /* A NUL anywhere in the line is refused: the C string functions below would stop there
     * and take "GET / HTTP/1.0\0anything" for a good line (found by fuzz-loopback-request). */
    if (memchr(head, '\0', (size_t)(line_end - head))) return -1;
    *line_end = '\0';
    char *method = head;
    char *space = strchr(method, ' ');
    if (!space || space == method || space - method > 16) return -1;
    *space = '\0';
    for (char *p = method; *p; p++)
        if (*p < 'A' || *p > 'Z') return -1;
    char *target = space + 1;
    space = strchr(target, ' ');
    if (!space || target[0] != '/') return -1;
    *space = '\0';
    for (unsigned char *p = (unsigned char *)target; *p; p++)
        if (*p < 0x21 || *p > 0x7e) return -1;
    const char *version = space + 1;
    if (strcmp(version, "HTTP/1.1") != 0 && strcmp(version, "HTTP/1.0") != 0) return -1;
    *method_out = method;
    *target_out = target;
    return 0;
}

/* The head is complete: parse the request line, call back, reply. */
static void handle_head(ll_connection *c) {
    ll_listener *listener = c->owner;
    const char *method, *target;
    if (ll_parse_request_line(c->head, c->used, &method, &target) != 0) return refuse(c);
    if (listener->closed) {
        connection_close(c);
        return;
    }
    ll_reply reply = {404, NULL, 0, NULL};
    c->replying = 1; /* the callback may call ll_close: this connection still gets its reply */
    listener->on_request(method, target, &reply, listener->userdata);
    send_reply(c, &reply);
    free(reply.body);
    free(reply.location);
}

static void allocate(uv_handle_t *handle, size_t suggested, uv_buf_t *buffer) {
    (void)suggested;
    ll_connection *c = handle->data;
    *buffer = uv_buf_init(c->head + c->used, (unsigned int)(LL_MAX_HEAD - c->used));
}

static void received(uv_stream_t *stream, ssize_t count, const uv_buf_t *buffer) {
    (void)buffer;
    ll_connection *c = stream->data;
    if (count < 0) {
        connection_close(c); /* EOF or an error before a complete head */
        return;
    }
    if (count == 0 || c->replying || c->closing) return;
    c->used += (size_t)count;
    c->head[c->used] = '\0';
    if (memmem(c->head, c->used, "\r\n\r\n", 4)) {
        uv_read_stop(stream);
        handle_head(c);
    } else if (c->used >= LL_MAX_HEAD) {
        uv_read_stop(stream);
        refuse(c);
    }
}

static void connected(uv_stream_t *server, int status) {
    ll_listener *listener = server->data;
    if (status < 0 || listener->closed) return;
    ll_connection *c = calloc(1, sizeof *c);
    if (!c) return;
    c->owner = listener;
    c->tcp.data = c;
    c->timer.data = c;
    c->handles_open = 2;
    uv_tcp_init(server->loop, &c->tcp);
    uv_timer_init(server->loop, &c->timer);
    c->next = listener->connections;
    if (c->next) c->next->prev = c;
    listener->connections = c;
    listener->count++;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) {
        connection_close(c);
        return;
    }
    if (listener->count > LL_MAX_CONNECTIONS) {
        /* Full: the oldest connection still waiting for its head goes, not the newest (idle
         * connections held open by anyone on this machine must not shut the browser out). */
        ll_connection *oldest = NULL;
        for (ll_connection *o = c->next; o; o = o->next)
            if (!o->replying && !o->closing) oldest = o;
        if (!oldest) {
            connection_close(c);
            return;
        }
        connection_close(oldest);
    }
    uv_timer_start(&c->timer, deadline_passed, LL_DEADLINE_MS, 0);
    if (uv_read_start((uv_stream_t *)&c->tcp, allocate, received) != 0) connection_close(c);
}

static void server_closed(uv_handle_t *handle) {
    ll_listener *listener = handle->data;
    listener->server_open = 0;
    maybe_free_listener(listener);
}

int ll_listen(struct uv_loop_s *loop, ll_request_fn on_request, void *userdata, ll_listener **out, int *port) {
    if (!loop || !on_request || !out || !port) return UV_EINVAL;
    ll_listener *listener = calloc(1, sizeof *listener);
    if (!listener) return UV_ENOMEM;
    listener->on_request = on_request;
    listener->userdata = userdata;
    int rc = uv_tcp_init(loop, &listener->server);
    if (rc != 0) {
        free(listener);
        return rc;
    }
    listener->server.data = listener;
    listener->server_open = 1;
    struct sockaddr_in address;
    struct sockaddr_storage bound;
    int length = sizeof bound;
    rc = uv_ip4_addr("127.0.0.1", 0, &address);
    if (rc == 0) rc = uv_tcp_bind(&listener->server, (const struct sockaddr *)&address, 0);
    if (rc == 0) rc = uv_listen((uv_stream_t *)&listener->server, LL_MAX_CONNECTIONS, connected);
    if (rc == 0) rc = uv_tcp_getsockname(&listener->server, (struct sockaddr *)&bound, &length);
    if (rc != 0) {
        listener->closed = 1;
        uv_close((uv_handle_t *)&listener->server, server_closed);
        return rc;
    }
    *port = ntohs(((struct sockaddr_in *)&bound)->sin_port);
    *out = listener;
    return 0;
}

void ll_close(ll_listener *listener) {
    if (!listener || listener->closed) return;
    listener->closed = 1;
    uv_close((uv_handle_t *)&listener->server, server_closed);
    ll_connection *c = listener->connections;
    while (c) {
        ll_connection *next = c->next;
        if (!c->replying) connection_close(c);
        c = next;
    }
}

size_t ll_connections(const ll_listener *listener) { return listener ? listener->count : 0; }
