#define _GNU_SOURCE
#include "cbaseline.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* A token endpoint that answers at once (the refresh row of issue 32): on a thread of its
 * own, on 127.0.0.1, each connection read up to its body and answered with a new token pair
 * (Connection: close, as every request of ours is on a connection of its own). */

struct bl_token_server {
    int fd;
    int port;
    _Atomic int stopping;
    _Atomic long answered;
    pthread_t thread;
};

static void serve(bl_token_server *server, int client) {
    char request[8192];
    size_t have = 0;
    long length = -1;
    char *body = NULL;
    while (have < sizeof request - 1) {
        ssize_t got = read(client, request + have, sizeof request - 1 - have);
        if (got <= 0) return;
        have += (size_t)got;
        request[have] = 0;
        if (!body) {
            body = strstr(request, "\r\n\r\n");
            if (body) {
                body += 4;
                char *field = strcasestr(request, "\r\ncontent-length:");
                length = field ? strtol(field + 17, NULL, 10) : 0;
            }
        }
        if (body && (long)(request + have - body) >= length) break;
    }
    long n = atomic_fetch_add(&server->answered, 1) + 1;
    char json[256];
    int json_length = snprintf(json, sizeof json,
                               "{\"access_token\":\"bench-access-%ld\",\"refresh_token\":\"bench-refresh-%ld\","
                               "\"token_type\":\"Bearer\",\"expires_in\":3600}",
                               n, n);
    char answer[512];
    int answer_length = snprintf(answer, sizeof answer,
                                 "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nCache-Control: no-store\r\n"
                                 "Content-Length: %d\r\nConnection: close\r\n\r\n%s",
                                 json_length, json);
    ssize_t written = write(client, answer, (size_t)answer_length);
    (void)written;
}

static void *accept_loop(void *argument) {
    bl_token_server *server = argument;
    while (!atomic_load(&server->stopping)) {
        int client = accept4(server->fd, NULL, NULL, SOCK_CLOEXEC);
        if (client < 0) continue;
        if (!atomic_load(&server->stopping)) serve(server, client);
        close(client);
    }
    return NULL;
}

bl_token_server *bl_token_server_start(void) {
    bl_token_server *server = calloc(1, sizeof *server);
    if (!server) return NULL;
    server->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int yes = 1;
    setsockopt(server->fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = 0};
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof address;
    if (server->fd < 0 || bind(server->fd, (struct sockaddr *)&address, sizeof address) != 0 ||
        listen(server->fd, 64) != 0 || getsockname(server->fd, (struct sockaddr *)&address, &size) != 0) {
        if (server->fd >= 0) close(server->fd);
        free(server);
        return NULL;
    }
    server->port = ntohs(address.sin_port);
    pthread_create(&server->thread, NULL, accept_loop, server);
    return server;
}

int bl_token_server_port(const bl_token_server *server) { return server->port; }

long bl_token_server_answered(bl_token_server *server) { return atomic_load(&server->answered); }

void bl_token_server_stop(bl_token_server *server) {
    atomic_store(&server->stopping, 1);
    /* Wake accept() with a connection of our own. */
    int poke = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons((uint16_t)server->port)};
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (poke >= 0) {
        int connected = connect(poke, (struct sockaddr *)&address, sizeof address);
        (void)connected;
        close(poke);
    }
    pthread_join(server->thread, NULL);
    close(server->fd);
    free(server);
}

/* libcurl, loaded with dlopen (the benchmark does not link it): the easy interface, the form
 * our refresh posts, a connection of its own each time (FRESH_CONNECT + FORBID_REUSE, our
 * policy). Returns the median ns of `runs` posts, or -1. */
typedef void CURL_;
static size_t swallow(char *data, size_t size, size_t count, void *userdata) {
    (void)data;
    (void)userdata;
    return size * count;
}

double bl_curl_post_ns(const char *url, const char *form, int runs) {
    void *curl = dlopen("libcurl.so.4", RTLD_NOW | RTLD_GLOBAL);
    if (!curl) return -1;
    long (*global_init)(long) = (long (*)(long))dlsym(curl, "curl_global_init");
    CURL_ *(*easy_init)(void) = (CURL_ * (*)(void)) dlsym(curl, "curl_easy_init");
    int (*setopt)(CURL_ *, int, ...) = (int (*)(CURL_ *, int, ...))dlsym(curl, "curl_easy_setopt");
    int (*perform)(CURL_ *) = (int (*)(CURL_ *))dlsym(curl, "curl_easy_perform");
    void (*cleanup)(CURL_ *) = (void (*)(CURL_ *))dlsym(curl, "curl_easy_cleanup");
    void *(*slist_append)(void *, const char *) = (void *(*)(void *, const char *))dlsym(curl, "curl_slist_append");
    void (*slist_free)(void *) = (void (*)(void *))dlsym(curl, "curl_slist_free_all");
    if (!global_init || !easy_init || !setopt || !perform || !cleanup || !slist_append || !slist_free) return -1;
    global_init(3);
    /* Option numbers of curl.h (stable ABI): URL 10002, POSTFIELDS 10015, HTTPHEADER 10023,
     * WRITEFUNCTION 20011, FRESH_CONNECT 74, FORBID_REUSE 75, NOSIGNAL 99. */
    double *times = calloc((size_t)runs, sizeof *times);
    void *headers = slist_append(NULL, "Accept: application/json");
    headers = slist_append(headers, "Accept-Encoding: identity");
    int failed = 0;
    for (int i = 0; i < runs; i++) {
        uint64_t start = bl_now_ns();
        CURL_ *easy = easy_init();
        setopt(easy, 10002, url);
        setopt(easy, 10015, form);
        setopt(easy, 10023, headers);
        setopt(easy, 20011, swallow);
        setopt(easy, 74, 1L);
        setopt(easy, 75, 1L);
        setopt(easy, 99, 1L);
        if (perform(easy) != 0) failed = 1;
        cleanup(easy);
        times[i] = (double)(bl_now_ns() - start);
    }
    slist_free(headers);
    for (int i = 1; i < runs; i++)
        for (int j = i; j > 0 && times[j - 1] > times[j]; j--) {
            double swap = times[j];
            times[j] = times[j - 1];
            times[j - 1] = swap;
        }
    double median = failed ? -1 : times[runs / 2];
    free(times);
    return median;
}
